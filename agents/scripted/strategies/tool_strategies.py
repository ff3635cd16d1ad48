"""Scripted strategies for the memory-tools protocol on MemDialog-BEAM (``memory_mode="tools"``).

They differ only in what they keep in the store; every one answers with the same reader
(:class:`ToolReader`): ``<mem_search>`` the question, then answer from the retrieved entries. So differences in
score come from the memory strategy alone.

- ``oracle``: stores exactly the evidence messages of the episode's questions (``reset(env)`` hands it the
  env); the upper bound of what a store can hold.
- ``rag``: store everything: every message becomes an entry; when the budget is full the oldest entries go.
- ``relevance``: a relevance-pruned store: only the user's first-person statements (sentences with "my",
  names, numbers, or cue words like "prefer", "always", "never", "today", "update") are stored, one sentence
  per entry, scored; when full the lowest-scored entry goes (or the new one is skipped).
- ``recency``: keeps only the newest session: its messages replace the previous ones.

A strategy is stateful only in what the env has shown it (ids and sizes from the tool results, the store's
size from the ``<memory>`` line), like an agent reading its own transcript.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from agents.scripted.strategies.qa_strategies import STRATEGY_FAMILIES, ScriptedPolicy
from memenv.memory_tools import format_tool_call
from memenv.search.bm25 import tokenize
from tasks.conversations import ABSTENTION_ANSWER

__all__ = ["TOOL_STRATEGIES", "ToolReader", "added_entry", "read_tool_observation", "result_entries"]

_SESSION = re.compile(r"<information>\[session (\d+)/(\d+), ([^\]]*)\]", re.MULTILINE)
_QUESTION = re.compile(r"<information>\[question (\d+)/(\d+)\][^\n]*\n(.*?)\nNow ", re.MULTILINE | re.DOTALL)
_STORE = re.compile(r"\[store: (\d+) entries, (\d+)/(\d+|no limit) tokens\]")
_MESSAGE = re.compile(r"^([^\n(]+?) \(#([^)]*)\): ", re.MULTILINE)
_RESULT = re.compile(r"^\[result\] (.*?)\n</information>", re.MULTILINE | re.DOTALL)
_ENTRY = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)
_ADDED = re.compile(r"^added entry (\d+) \((\d+) tokens\)")
_DATED = re.compile(r"^\[(\d{4}-\d{2}-\d{2})\] ")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# Question words that say nothing about the topic (beyond memenv.search.bm25's stopwords).
_GENERIC = frozenset("my i me you your name how many much can could tell told ever have has did does when "
                     "where why now recommend help summarize order complete steps different per week days take "
                     "long".split())
_ROLE = re.compile(r"^[^:\n]{1,40}: ")
_CUES = {"prefer": 2, "always": 2, "never": 2, "update": 2, "today": 1, "week": 1, "now": 1, "visited": 1,
         "started": 1, "finished": 1, "read": 1}


@dataclass
class ToolView:
    session: tuple[int, int, str] | None = None  # (index, total, time anchor)
    messages: list[tuple[str, str, str]] = field(default_factory=list)  # (role, id, text)
    question: tuple[int, str] | None = None
    result: str = ""
    entries: int = 0
    used: int = 0
    budget: int | None = None


def read_tool_observation(observation: str) -> ToolView:
    """What a tools-mode observation shows: the session (and its messages) or the question, the last tool
    result and the store's size."""
    view = ToolView()
    store = _STORE.search(observation)
    if store:
        view.entries, view.used = int(store.group(1)), int(store.group(2))
        view.budget = None if store.group(3) == "no limit" else int(store.group(3))
    result = _RESULT.search(observation)
    body_end = result.start() if result else observation.rfind("</information>")
    if result:
        view.result = result.group(1)
    session = _SESSION.search(observation)
    if session:
        view.session = (int(session.group(1)), int(session.group(2)), session.group(3))
        body = observation[session.end():body_end]
        starts = list(_MESSAGE.finditer(body))
        for m, nxt in zip(starts, starts[1:] + [None]):
            text = body[m.end():nxt.start() if nxt else len(body)]
            view.messages.append((m.group(1), m.group(2), " ".join(text.split())))
        return view
    question = _QUESTION.search(observation)
    if question:
        view.question = (int(question.group(1)), " ".join(question.group(3).split()))
    return view


def added_entry(result: str) -> tuple[int, int] | None:
    """``(id, tokens)`` of the entry a ``<mem_add>`` result reports, or None for any other result."""
    added = _ADDED.match(result)
    return None if added is None else (int(added.group(1)), int(added.group(2)))


def result_entries(result: str) -> list[tuple[int, str]]:
    """The ``(id, text)`` entries a ``<mem_search>`` result lists, in id order (= insertion order)."""
    return sorted(((int(i), text) for i, text in _ENTRY.findall(result)), key=lambda e: e[0])


def _stems(text: str) -> set[str]:
    """Tokens with a crude suffix cut ("finished" -> "finish", "costs" -> "cost"), for matching only."""
    out = set()
    for tok in tokenize(text):
        for suffix in ("ing", "ed", "es", "s"):
            if tok.endswith(suffix) and len(tok) - len(suffix) >= 3:
                tok = tok[: -len(suffix)]
                break
        out.add(tok)
    return out


class ToolReader:
    """Answers a question from retrieved ``[id] [date] text`` entries (shared by every tool strategy)."""

    def topical(self, question: str) -> set[str]:
        return _stems(question) - _stems(" ".join(_GENERIC))

    def query(self, question: str) -> str:
        """The search query: the question plus its topical stems, so "comics" also finds "comic" (BM25 does not
        stem); a request for a recommendation also looks for stated preferences."""
        extra = " prefer" if question.lower().startswith("can you recommend") else ""
        return f"{question} {' '.join(sorted(self.topical(question)))}{extra}"

    def answer(self, question: str, entries: list[str]) -> str:
        """The answer from ``entries`` (``[date] Role: text``, oldest first): the sentences on the question's topic
        in time order; a count or a number of days for "how many" questions; the abstention answer when no entry
        covers half of the question's topical terms."""
        if question.lower().startswith("can you recommend"):
            stated = [s for text in entries for s in _SENTENCE.split(_ROLE.sub("", _DATED.sub("", text)))
                      if "prefer" in s.lower()]
            if stated:
                return "Going by what you told me: " + " ".join(stated[:3])
        terms = self.topical(question)
        scored = []
        for text in entries:
            date_match = _DATED.match(text)
            date = date_match.group(1) if date_match else ""
            body = _ROLE.sub("", text[date_match.end():] if date_match else text)
            sentences = [s for s in _SENTENCE.split(body) if terms & _stems(s)]
            if sentences:
                best = max(len(terms & _stems(s)) for s in sentences)
                scored.append((date, best, sentences))
        if not scored or max(best for _, best, _ in scored) < max(1, (len(terms) + 1) // 2):
            return ABSTENTION_ANSWER
        keep = max(1, (len(terms) + 1) // 2)
        relevant = [(d, s) for d, best, ss in scored if best >= keep for s in ss]
        lowered = question.lower()
        if lowered.startswith("how many days"):
            dates = sorted({d for d, _ in relevant if d})
            if len(dates) >= 2:
                days = (_dt.date.fromisoformat(dates[-1]) - _dt.date.fromisoformat(dates[0])).days
                return f"{days} days"
        count = re.match(r"how many different (\w+?)s? ", lowered)
        lines = list(dict.fromkeys(s for _, s in relevant))
        if count:
            hits = [s for s in lines if count.group(1) in s.lower()]
            return f"{len(hits)} {count.group(1)}s: " + " ".join(hits)
        return "\n".join(lines)


class _ToolPolicy(ScriptedPolicy):
    """Shared flow: plan the session's adds/deletes, run them one call per turn, evicting to stay in budget;
    at a question search then answer."""

    context = "memory"
    env_kwargs = {"memory_mode": "tools"}

    def __init__(self) -> None:
        self.reader = ToolReader()
        self.reset()

    def reset(self, env: Any = None) -> None:
        self._session: int | None = None
        self._queue: list[tuple[str, Any, float]] = []  # ("add", text, score) | ("delete", id, 0)
        self._entries: dict[int, tuple[int, float, int]] = {}  # id -> (tokens, score, session)
        self._pending: tuple[float, int] | None = None
        self._question: int | None = None

    # what to store --------------------------------------------------------------------------------
    def plan(self, view: ToolView) -> list[tuple[str, Any, float]]:
        raise NotImplementedError

    def victim(self, score: float) -> int | None:
        """The entry to delete to make room for one of ``score`` (None: skip the new one). Default: oldest."""
        return next(iter(self._entries), None)

    # the loop -------------------------------------------------------------------------------------
    def act(self, observation: str) -> str:
        view = read_tool_observation(observation)
        added = added_entry(view.result)
        if added and self._pending is not None:
            self._entries[added[0]] = (added[1], *self._pending)
        self._pending = None
        if view.session is not None:
            if view.session[0] != self._session:
                self._session = view.session[0]
                self._queue = self.plan(view)
            return self._next_call(view)
        if view.question is not None:
            j, question = view.question
            if j != self._question:
                self._question = j
                # The question plus its topical stems, so "comics" also finds "comic" (BM25 does not stem).
                return format_tool_call("mem_search", self.reader.query(question))
            # Entry ids grow with insertion, and every strategy stores in chat order: id order is time order.
            entries = [text for _, text in result_entries(view.result)]
            return format_tool_call("answer", self.reader.answer(question, entries))
        return format_tool_call("next")

    def _next_call(self, view: ToolView) -> str:
        used, budget = view.used, view.budget
        while self._queue:
            kind, arg, score = self._queue[0]
            if kind == "delete":
                self._queue.pop(0)
                if arg in self._entries:
                    del self._entries[arg]
                    return format_tool_call("mem_delete", entry_id=arg)
                continue
            tokens = len(arg.split())
            if budget is not None and tokens > budget:
                self._queue.pop(0)
                continue
            if budget is not None and used + tokens > budget:
                victim = self.victim(score)
                if victim is None:
                    self._queue.pop(0)
                    continue
                del self._entries[victim]
                return format_tool_call("mem_delete", entry_id=victim)
            self._queue.pop(0)
            self._pending = (score, self._session)
            return format_tool_call("mem_add", arg)
        return format_tool_call("next")


def _entry(view: ToolView, role: str, text: str) -> str:
    return f"[{view.session[2]}] {role}: {text}"


class RagPolicy(_ToolPolicy):
    """Store everything (one entry per message), oldest out when the budget is full; retrieve with BM25."""

    name = "rag"

    def plan(self, view: ToolView) -> list:
        return [("add", _entry(view, role, text), 0.0) for role, _, text in view.messages if text]


class RecencyPolicy(_ToolPolicy):
    """Only the newest session: its messages replace the previous session's entries."""

    name = "recency"

    def plan(self, view: ToolView) -> list:
        old = [("delete", i, 0.0) for i in self._entries]
        return old + [("add", _entry(view, role, text), 0.0) for role, _, text in view.messages if text]


def statement_score(sentence: str) -> float:
    """How much a user's sentence looks like a fact worth keeping (0: not a first-person statement)."""
    if sentence.endswith("?"):
        return 0.0
    words = sentence.split()
    lowered = [w.lower().strip(".,!;:") for w in words]
    if not ({"i", "my", "me"} & set(lowered)):
        return 0.0
    score = 2.0 * ("my" in lowered) + sum(_CUES.get(w, 0) for w in lowered)
    score += any(w[:1].isupper() for w in words[1:]) + any(c.isdigit() for c in sentence)
    return float(score)


class RelevancePolicy(_ToolPolicy):
    """A relevance-pruned store: the user's fact-like sentences (:func:`statement_score` >= 2), one per entry;
    when full, the lowest-scored (then oldest) entry goes, unless the new one scores lower."""

    name = "relevance"

    def plan(self, view: ToolView) -> list:
        out = []
        for role, _, text in view.messages:
            if role == "Assistant":  # BEAM's assistant; in LoCoMo/MemDialog both speakers are people
                continue
            for sentence in _SENTENCE.split(text):
                score = statement_score(sentence)
                if score >= 2:
                    out.append(("add", _entry(view, role, sentence), score))
        return out

    def victim(self, score: float) -> int | None:
        if not self._entries:
            return None
        worst = min(self._entries, key=lambda i: (self._entries[i][1], i))
        return worst if self._entries[worst][1] <= score else None


class OraclePolicy(_ToolPolicy):
    """Stores exactly the evidence messages of the episode's questions (needs ``reset(env)``)."""

    name = "oracle"

    def reset(self, env: Any = None) -> None:
        super().reset(env)
        self._evidence: set[str] = set()
        if env is not None:
            env = getattr(env, "unwrapped", env)
            self._evidence = {str(e) for q in env.questions for e in q.meta.get("evidence", [])}

    def plan(self, view: ToolView) -> list:
        return [("add", _entry(view, role, text), 1.0) for role, mid, text in view.messages if mid in self._evidence]


TOOL_STRATEGIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "oracle": OraclePolicy,
    "relevance": RelevancePolicy,
    "rag": RagPolicy,
    "recency": RecencyPolicy,
}

STRATEGY_FAMILIES["MemDialog-BEAM"] = TOOL_STRATEGIES
