"""Memory strategies that work on any dialogue text (LoCoMo, BEAM, LongMemEval, MemDialog), scripted or with a
served model.

The other scripted strategies read the synthetic languages their tasks are written in; these read any
conversation shown as ``Speaker: text`` or ``Role (#id): text`` lines under ``[session i/n, DATE]`` headers, so
they are baselines a researcher can cite on real benchmarks. Each is a pair (what goes into the answer context,
who answers from it):

What the answer context holds (the scripted names):

- ``full-context``: the whole conversation as the env's ``history`` context shows it, cut from the left to
  ``context_budget`` tokens (default :data:`DEFAULT_CONTEXT_BUDGET`) like a real context window; the env
  measures it (peak context tokens).
- ``recency-window``: the last ``window`` sessions (env context ``window:K``, default 2).
- ``bm25``: retrieval over every turn read so far: the policy indexes each session it is shown (env context
  ``none``: the env shows only the newest session; the index is the policy's external memory, as in a RAG
  system) and, at a question, puts the ``k`` best BM25 turns (default 10; :mod:`memenv.search.bm25`), in time
  order, within ``answer_budget`` tokens, into the answer context.

Who answers: scripted, an extractive reader (the sentence of the answer context that best matches the question
by BM25; for "when" questions the date of that turn's session; the abstention answer when that sentence and its
speaker cover under a third of the question's words, stopwords aside). With a served model,
``NAME+openai:MODEL@URL`` (e.g. ``bm25+openai:SmolLM2@http://127.0.0.1:8000``) sends the answer context and the
question to the model (``/v1/completions``, :class:`agents.llm.adapters.served.CompletionsClient`) and answers its reply
(tag characters removed, one line).

LLM-driven memory (served only):

- ``memagent+openai:MODEL@URL``: MemAgent-style overwrite memory (env context ``memory``, rewrite mode): after
  each session the model rewrites the whole memory from the old memory and the new session (within the memory
  budget the task states), then answers each question from the memory alone.
- ``selfmem+openai:MODEL@URL``: SelfMem-style tools memory (memory-tools mode: MemDialog-BEAM and
  MemDialog-LongMemEval, and MemDialog-BEAM with ``dataset="locomo"``): for each session the model writes the
  facts worth keeping, one per line; each becomes a ``<mem_add>`` (oldest entries out when the store is full);
  at a question it ``<mem_search>``es the store and answers from the entries found.

Registered in the ``MemDialog``, ``MemDialog-BEAM`` and ``MemDialog-LongMemEval`` families
(:func:`agents.scripted.strategies.qa_strategies.make_strategy`); :func:`make_text_strategy` builds any of them by name.
Constructor arguments are checked (a wrong type or range raises naming the argument), and ``act`` never raises
on observation text: what it cannot read it answers with the abstention answer or an empty (read-on) action.
"""

from __future__ import annotations

import copy
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agents.scripted.strategies.qa_strategies import STRATEGY_FAMILIES, ScriptedPolicy
from agents.scripted.strategies.reading_strategies import memory_budget_of
from agents.scripted.strategies.tool_strategies import TOOL_STRATEGIES, RagPolicy, read_tool_observation, result_entries
from agents.llm.adapters.served import CompletionsClient, ServedSpec, is_served
from memenv.memory_tools import format_tool_call
from memenv.search.bm25 import make_backend, tokenize
from tasks.conversations import ABSTENTION_ANSWER

__all__ = ["DEFAULT_CONTEXT_BUDGET", "SERVED_KINDS", "TEXT_STRATEGIES", "DialogTurn", "TextView", "is_text_served",
           "make_text_strategy", "read_text_observation"]

DEFAULT_CONTEXT_BUDGET = 8_000  # tokens (whitespace words) of the full-context window
SCRIPTED_KINDS = ("full-context", "recency-window", "bm25")
SERVED_KINDS = SCRIPTED_KINDS + ("memagent", "selfmem")
_BLOCK = re.compile(r"<information>\[(?:session (\d+)/(\d+), ([^\]]*)|question (\d+)/(\d+))\]([^\n]*)\n(.*?)"
                    r"(?=\n</information>|\Z)", re.DOTALL)
_ID_LINE = re.compile(r"^([^\n:()]{1,60}?) \(#([^)\n]*)\): ?(.*)$")
_NAME_LINE = re.compile(r"^([A-Z][^\n:()\[\]*]{0,40}?): (.*)$")
_ASKED = re.compile(r"\[asked on ([^\]]*)\]")
_QUESTION_END = re.compile(r"\n(?:Answer it now with|Now (?:answer|search))")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_TIME_OF_DAY = re.compile(r"^\s*\d{1,2}:\d{2}\s*(?:[ap]m)?\s*on\s+", re.IGNORECASE)
_TAGS = re.compile(r"[<>]")


# ------------------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class DialogTurn:
    session: int  # 1-based
    date: str
    speaker: str
    text: str

    def line(self) -> str:
        return f"[{self.date}] {self.speaker}: {self.text}" if self.date else f"{self.speaker}: {self.text}"


@dataclass
class TextView:
    turns: list[DialogTurn]  # every session turn the observation shows, in order
    session: int | None  # the newest block's session number, when it is a session
    question: str | None  # the newest block's question, when it is one
    question_index: int | None
    question_date: str
    questions: list[str]  # the questions the task block lists (shown up front), if any


def _session_turns(number: int, date: str, body: str) -> list[DialogTurn]:
    lines = body.split("\n")
    id_form = any(_ID_LINE.match(line) for line in lines)
    turns: list[list[str]] = []
    for line in lines:
        match = _ID_LINE.match(line) if id_form else _NAME_LINE.match(line)
        if match:
            turns.append([match.group(1).strip(), match.group(match.lastindex)])
        elif turns and line.strip() and not (line.startswith("[") and line.rstrip().endswith("]")):
            turns[-1][1] += "\n" + line
    return [DialogTurn(number, date.strip(), who, " ".join(text.split())) for who, text in turns if text.strip()]


def read_text_observation(observation: str) -> TextView:
    """Parse any dialog env's observation (every context mode): its session turns and its question."""
    text = observation if isinstance(observation, str) else ""
    task_end = text.find("</task>")
    task = text[:task_end] if task_end >= 0 else ""
    questions = re.findall(r"^Question \d+: (.*)$", task, re.MULTILINE)
    turns: list[DialogTurn] = []
    session = question = index = None
    date = ""
    seen: set[int] = set()
    for block in _BLOCK.finditer(text, max(task_end, 0)):
        if block.group(1) is not None:
            number = int(block.group(1))
            session, question, index = number, None, None
            if number not in seen:  # a repeated session (after an invalid action) counts once
                seen.add(number)
                turns += _session_turns(number, block.group(3), block.group(7))
        else:
            body = block.group(7)
            end = _QUESTION_END.search(body)
            q = (body[:end.start()] if end else body).strip()
            asked = _ASKED.search(block.group(6))
            date = asked.group(1) if asked else ""
            q = "\n".join(line for line in q.split("\n") if not (line.startswith("[") and line.endswith("]")))
            session, question, index = None, " ".join(q.split()) or None, int(block.group(4))
    return TextView(turns, session, question, index, date, questions)


def _clean(text: str) -> str:
    """Model or reader text made safe inside an action tag (no tag characters, one line)."""
    return " ".join(_TAGS.sub(" ", text).split())


def _topical(question: str) -> set[str]:
    return set(tokenize(question))


def _date_only(date: str) -> str:
    """A session date without its time of day ("1:56 pm on 8 May, 2023" -> "8 May, 2023")."""
    return _TIME_OF_DAY.sub("", date).strip()


def extractive_answer(question: str, turns: list[DialogTurn]) -> str:
    """The scripted reader: the sentence of ``turns`` that best matches ``question`` (BM25 over sentences);
    for a "when" question the date of its session; the abstention answer when no sentence shares a word."""
    terms = _topical(question)
    candidates = [(t, s.strip()) for t in turns for s in _SENTENCE.split(t.text) if s.strip()]
    if not terms or not candidates:
        return ABSTENTION_ANSWER
    texts = [f"{t.speaker} {s}" for t, s in candidates]
    hits = make_backend("bm25", texts).search(question, k=1)
    # BM25's idf is 0 for a term in half of a tiny corpus: then the sentence sharing most question words
    best = hits[0] if hits else max(range(len(texts)), key=lambda i: len(terms & set(tokenize(texts[i]))))
    turn, sentence = candidates[best]
    if len(terms & set(tokenize(f"{turn.speaker} {sentence}"))) * 3 < len(terms):  # covers under a third
        return ABSTENTION_ANSWER
    if question.lower().lstrip().startswith("when") and turn.date:
        return _date_only(turn.date)
    return _clean(" ".join(sentence.split()[:40]))


# ------------------------------------------------------------------------------------------------ checks
def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------------ answerers
class ServedAnswerer:
    """Answers (and writes memory) through a served model's ``/v1/completions``."""

    ANSWER_PROMPT = (
        "Below is part of a conversation, then a question about it.\n\n{context}\n\n"
        "Question: {question}{asked}\nAnswer in a few words, using only the conversation. If it does not contain "
        "the answer, reply \"{abstain}\".\nAnswer:"
    )

    def __init__(self, spec: str | ServedSpec, *, max_tokens: int = 48, memory_tokens: int = 256, **client: Any) -> None:
        self.spec = spec if isinstance(spec, ServedSpec) else ServedSpec.parse(spec)
        _positive_int("max_tokens", max_tokens)
        _positive_int("memory_tokens", memory_tokens)
        self.answers = CompletionsClient(self.spec, max_tokens=max_tokens, stop=("\n",), **client)
        self.writer = CompletionsClient(self.spec, max_tokens=memory_tokens, stop=("</memory>", "\n\n\n"), **client)

    def answer(self, question: str, context: str, asked: str = "") -> str:
        prompt = self.ANSWER_PROMPT.format(context=context or "(nothing)", question=question,
                                           asked=f" (asked on {asked})" if asked else "", abstain=ABSTENTION_ANSWER)
        return _clean(self.answers.complete(prompt).text) or ABSTENTION_ANSWER

    def write(self, prompt: str) -> str:
        return self.writer.complete(prompt).text

    def check(self) -> None:
        self.answers.check()


# ------------------------------------------------------------------------------------------------ policies
#: Episodes a served strategy runs at once in ``memenv bench`` (one env and one copy of the policy per thread).
CONCURRENCY = 8


def _run_concurrently(policy: Any, make_env: Callable[[], Any], seeds: Sequence[int],
                      run_episode: Callable[[Any, Any, int], tuple[dict[str, Any], int]],
                      on_done: Callable[[], None] | None = None) -> list[tuple[dict[str, Any], int, dict]]:
    """The bench's ``run_episodes`` for a served strategy: episodes on a thread pool, each thread with its own env
    and its own copy of the (stateful) policy; results in seed order. The first exception ends the run."""
    local, lock, envs = threading.local(), threading.Lock(), []

    def one(seed: int):
        if not hasattr(local, "env"):
            local.env, local.policy = make_env(), copy.deepcopy(policy)
            with lock:
                envs.append(local.env)
        summary, steps = run_episode(local.env, local.policy, seed)
        if on_done is not None:
            on_done()
        return summary, steps, {}

    pool = ThreadPoolExecutor(max_workers=min(CONCURRENCY, max(1, len(seeds))))
    try:
        return list(pool.map(one, seeds))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for env in envs:
            env.close()


class _TextPolicy(ScriptedPolicy):
    """Reads on with an empty action; answers each question once from :meth:`answer_context`."""

    context = "history"
    kind = ""

    def __init__(self, answerer: ServedAnswerer | None = None, env_kwargs: dict | None = None) -> None:
        self.answerer = answerer
        self.env_kwargs = dict(env_kwargs or {})
        self.name = self.kind if answerer is None else f"{self.kind}+openai:{answerer.spec.model}@{answerer.spec.url}"
        if answerer is not None:  # served: the bench runs its episodes concurrently
            self.run_episodes = lambda *args, **kw: _run_concurrently(self, *args, **kw)
        self.reset()

    def reset(self, env: Any = None) -> None:
        pass

    def answer_context(self, view: TextView, question: str) -> list[DialogTurn]:
        return view.turns

    def check_server(self) -> None:
        """The served model's start-up check (``GET /v1/models``; the bench calls it before any episode)."""
        if self.answerer is not None:
            self.answerer.check()

    def act(self, observation: str) -> str:
        view = read_text_observation(observation)
        self.observe(view)
        if view.question is None:
            return ""
        turns = self.answer_context(view, view.question)
        if self.answerer is None:
            answer = extractive_answer(view.question, turns)
        else:
            answer = self.answerer.answer(view.question, "\n".join(t.line() for t in turns), view.question_date)
        return f"<answer>{answer}</answer>"

    def observe(self, view: TextView) -> None:
        pass


class FullContextPolicy(_TextPolicy):
    """The env's whole transcript (context ``history``), cut from the left to ``context_budget`` tokens."""

    kind = "full-context"

    def __init__(self, answerer: ServedAnswerer | None = None, env_kwargs: dict | None = None,
                 context_budget: int = DEFAULT_CONTEXT_BUDGET) -> None:
        budget = _positive_int("context_budget", context_budget, 64)
        super().__init__(answerer, {"context_budget": budget, **(env_kwargs or {})})


class RecencyWindowPolicy(_TextPolicy):
    """The last ``window`` sessions (context ``window:K``)."""

    kind = "recency-window"

    def __init__(self, answerer: ServedAnswerer | None = None, env_kwargs: dict | None = None, window: int = 2) -> None:
        self.window = _positive_int("window", window)
        self.context = f"window:{self.window}"
        super().__init__(answerer, env_kwargs)


class BM25Policy(_TextPolicy):
    """Indexes every turn it is shown (context ``none``); answers from the ``k`` best BM25 turns."""

    kind = "bm25"
    context = "none"

    def __init__(self, answerer: ServedAnswerer | None = None, env_kwargs: dict | None = None, k: int = 10,
                 answer_budget: int = 2_000) -> None:
        self.k = _positive_int("k", k)
        self.answer_budget = _positive_int("answer_budget", answer_budget, 16)
        super().__init__(answerer, env_kwargs)

    def reset(self, env: Any = None) -> None:
        self._turns: list[DialogTurn] = []
        self._sessions: set[int] = set()
        self._backend = None

    def observe(self, view: TextView) -> None:
        fresh = [t for t in view.turns if t.session not in self._sessions]
        if fresh:
            self._sessions.update(t.session for t in fresh)
            self._turns += fresh
            self._backend = None

    def answer_context(self, view: TextView, question: str) -> list[DialogTurn]:
        if not self._turns:
            return []
        if self._backend is None:
            self._backend = make_backend("bm25", [f"{t.speaker} {t.text}" for t in self._turns])
        hits = self._backend.search(question, k=self.k) or range(len(self._turns))  # best first (tiny: all)
        kept, left = set(), self.answer_budget
        for i in hits:
            n = len(self._turns[i].line().split())
            if n <= left:
                kept.add(i)
                left -= n
        return [self._turns[i] for i in sorted(kept)]  # in time order


class MemAgentPolicy(_TextPolicy):
    """MemAgent-style overwrite memory with a served model (context ``memory``, rewrite mode)."""

    kind = "memagent"
    context = "memory"
    MEMORY_PROMPT = (
        "You are reading a long conversation one session at a time and keep a memory of it; you will not see a "
        "session again. Rewrite the memory so that it holds every fact from the old memory and the new session "
        "that could answer a question about the conversation later (names, dates, numbers, plans, preferences, "
        "changes), in at most {budget} words.{questions}\n\nOld memory:\n{memory}\n\nNew session ({date}):\n"
        "{session}\n\nNew memory:\n<memory>"
    )

    def __init__(self, answerer: ServedAnswerer, env_kwargs: dict | None = None) -> None:
        if not isinstance(answerer, ServedAnswerer):
            raise TypeError(f"memagent needs a served model (memagent+openai:MODEL@URL), got {answerer!r}")
        super().__init__(answerer, env_kwargs)

    def reset(self, env: Any = None) -> None:
        self._written: set[int] = set()

    def act(self, observation: str) -> str:
        view = read_text_observation(observation if isinstance(observation, str) else "")
        memory = _memory_of(observation)
        if view.question is not None:
            answer = self.answerer.answer(view.question, memory, view.question_date)
            return f"<answer>{answer}</answer>"
        if view.session is None:
            return f"<memory>{memory}</memory>"
        session_turns = [t for t in view.turns if t.session == view.session]
        budget = memory_budget_of(observation) or 256
        shown = "".join(f"\nQuestion {i}: {q}" for i, q in enumerate(view.questions, 1))
        prompt = self.MEMORY_PROMPT.format(
            budget=budget, questions=f"\nYou will be asked:{shown}" if shown else "", memory=memory or "(empty)",
            date=session_turns[0].date if session_turns else "", session="\n".join(
                f"{t.speaker}: {t.text}" for t in session_turns) or "(no dialogue)")
        text = _TAGS.sub(" ", self.answerer.write(prompt).split("</memory>")[0]).strip()
        return f"<memory>{' '.join(text.split()[:budget])}</memory>"


def _memory_of(observation: Any) -> str:
    if not isinstance(observation, str):
        return ""
    body = max(observation.find("</task>"), 0)  # the instructions quote the tags too
    start = observation.find("<memory>", body)
    end = observation.find("</memory>", start + 1)
    return observation[start + len("<memory>"):end].strip() if 0 <= start < end else ""


class SelfMemPolicy(RagPolicy):
    """SelfMem-style tools memory with a served model: the model picks the facts to store; answers from a search."""

    name = "selfmem"
    FACTS_PROMPT = (
        "You keep a memory store for a long chat between a user and an assistant. Read the new session and write "
        "the facts about the user worth remembering for later questions (names, dates, numbers, plans, "
        "preferences, changes), one short fact per line, at most {limit} lines. Write NONE if there is none.\n\n"
        "Session ({date}):\n{session}\n\nFacts:\n"
    )

    def __init__(self, answerer: ServedAnswerer, facts_per_session: int = 8) -> None:
        if not isinstance(answerer, ServedAnswerer):
            raise TypeError(f"selfmem needs a served model (selfmem+openai:MODEL@URL), got {answerer!r}")
        self.answerer = answerer
        self.facts_per_session = _positive_int("facts_per_session", facts_per_session)
        self.name = f"selfmem+openai:{answerer.spec.model}@{answerer.spec.url}"
        self.run_episodes = lambda *args, **kw: _run_concurrently(self, *args, **kw)
        super().__init__()

    def check_server(self) -> None:
        self.answerer.check()

    def plan(self, view) -> list:
        session = "\n".join(f"{role}: {text}" for role, _, text in view.messages if text)
        if not session:
            return []
        reply = self.answerer.write(self.FACTS_PROMPT.format(limit=self.facts_per_session, date=view.session[2],
                                                             session=session))
        facts = [_clean(line.lstrip("-*0123456789.) ")) for line in reply.split("\n")]
        facts = [f for f in facts if f and f.upper() != "NONE"][: self.facts_per_session]
        return [("add", f"[{view.session[2]}] {fact}", 0.0) for fact in facts]

    def act(self, observation: str) -> str:
        view = read_tool_observation(observation if isinstance(observation, str) else "")
        if view.question is not None and view.question[0] == self._question:
            entries = [text for _, text in result_entries(view.result)]
            return format_tool_call("answer", self.answerer.answer(view.question[1], "\n".join(entries)))
        return super().act(observation if isinstance(observation, str) else "")


# ------------------------------------------------------------------------------------------------ registry
_SCRIPTED: dict[str, type[_TextPolicy]] = {"full-context": FullContextPolicy, "recency-window": RecencyWindowPolicy,
                                           "bm25": BM25Policy}
# What the rewrite-mode strategies need from the BEAM env (MemDialog has a single, rewrite, protocol).
_REWRITE = {"MemDialog": {}, "MemDialog-BEAM": {"memory_mode": "rewrite"},
            "MemDialog-LongMemEval": {"memory_mode": "rewrite"}}


def is_text_served(name: str) -> bool:
    """``KIND+openai:MODEL@URL`` with a kind of :data:`SERVED_KINDS`."""
    kind, sep, rest = name.partition("+")
    return bool(sep) and kind in SERVED_KINDS and is_served(rest)


def make_text_strategy(name: str, family: str = "MemDialog", **kwargs: Any):
    """A text strategy by name for an env family (see the module docstring): a scripted kind, or
    ``KIND+openai:MODEL@URL``. ``kwargs`` go to the strategy (``context_budget``, ``window``, ``k``, ...)."""
    if family not in _REWRITE:
        raise ValueError(f"text strategies run on the dialog env families {', '.join(_REWRITE)}, not {family!r}")
    kind, _, served = name.partition("+")
    if kind not in SERVED_KINDS:
        raise ValueError(f"unknown text strategy {name!r}: choose from {', '.join(SCRIPTED_KINDS)}, or "
                         f"KIND+openai:MODEL@URL with KIND one of {', '.join(SERVED_KINDS)}")
    if served and not is_served(served):
        raise ValueError(f"strategy {name!r}: after '+' comes a served model openai:MODEL@URL")
    if kind in ("memagent", "selfmem") and not served:
        raise ValueError(f"{kind} is LLM-driven memory: name a served model, e.g. {kind}+openai:MODEL@URL")
    client = {k: kwargs.pop(k) for k in ("timeout", "retries", "backoff") if k in kwargs}
    answerer = ServedAnswerer(served, **client) if served else None
    if kind == "selfmem":
        if family == "MemDialog":
            raise ValueError("selfmem needs the memory-tools protocol: run it on MemDialog-BEAM-v0 "
                             "(dataset='locomo' for LoCoMo) or MemDialog-LongMemEval-v0")
        return SelfMemPolicy(answerer, **kwargs)
    if kind == "memagent":
        return MemAgentPolicy(answerer, env_kwargs=_REWRITE[family], **kwargs)
    return _SCRIPTED[kind](answerer, env_kwargs=_REWRITE[family], **kwargs)


def _factory(kind: str, family: str) -> Callable[[], ScriptedPolicy]:
    return lambda **kwargs: make_text_strategy(kind, family, **kwargs)


TEXT_STRATEGIES = {kind: _factory(kind, "MemDialog") for kind in SCRIPTED_KINDS}
STRATEGY_FAMILIES["MemDialog"].update(TEXT_STRATEGIES)
STRATEGY_FAMILIES["MemDialog-BEAM"].update({kind: _factory(kind, "MemDialog-BEAM") for kind in SCRIPTED_KINDS})
STRATEGY_FAMILIES["MemDialog-LongMemEval"] = {**TOOL_STRATEGIES, **{kind: _factory(kind, "MemDialog-LongMemEval")
                                                                     for kind in SCRIPTED_KINDS}}
