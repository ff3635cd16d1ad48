"""Scripted memory strategies: policies that need no model and act only through the text protocol.

Every strategy except the oracle is a pure function of the observation text (``act(observation)``): whatever
it knows at turn t must have survived in what the environment shows it, that is in its own memory (context
``memory``), in the transcript (``history``) or nowhere (``last-observation``). They share one reader
(:mod:`agents.scripted.strategies.world_reader`), so differences in score come from the memory strategy alone.

- ``oracle``: knows the gold supporting documents through the task; searches each by title (reformulating a
  search that missed), keeps their evidence sentences, and answers the gold answers only where its memory
  holds the evidence (else ``"unknown"``). The upper bound, and the source of expert trajectories.
- ``keep-all``: memory accumulates every sentence that states a fact.
- ``relevance``: memory keeps answers found so far and the facts on the open questions' chains, most relevant
  first, within ``memory_budget`` words.
- ``last-observation``: empty memory; answers from the newest result only.
- ``history``: no rewriting; the env keeps the whole transcript (context mode ``history``).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from agents.scripted.strategies.world_reader import (
    Fact,
    Progress,
    facts_in,
    overlap,
    parse_fact,
    parse_question,
    read_observation,
    resolve,
    resolve_open,
    sentences,
)
from memenv.context import sanitize
from memenv.protocol import format_action
from memenv.scoring.qa import normalize_answer
from memenv.search.bm25 import tokenize
from tasks.types import Document

_ANSWER_LINE = re.compile(r"^Answer (\d+): (.*)$")
_PARENTHETICAL = re.compile(r"\s*\([^)]*\)")  # "Franz Ferdinand (band)": the disambiguation
_RESULT_ENTRY = re.compile(r"^Doc \d+ \(Title: (.*)$", re.MULTILINE)  # what follows is "title) text"
FAILED_SEARCHES = "Failed searches: "  # the oracle's memory line listing searches that missed their document


def _bare(title: str) -> str:
    """A title without its parenthesised disambiguation."""
    return _PARENTHETICAL.sub("", title).strip()


def _categorical(answer: str) -> bool:
    """Whether an answer is yes/no (scored only on an exact match, and never a span of a document)."""
    return normalize_answer(answer) in ("yes", "no")


def _contains(text: str, answer: str) -> bool:
    """Whether ``answer`` occurs in ``text`` as whole words, after SQuAD answer normalisation."""
    needle = normalize_answer(answer)
    return bool(needle) and f" {needle} " in f" {normalize_answer(text)} "


def _memory_cut(visible: str) -> bool:
    """Whether the text after the task block shows a memory whose start (its opening tag) a context budget
    cut away."""
    end = visible.find("</memory>")
    return end >= 0 and visible.rfind("<memory>", 0, end) < 0


def _key_words(question: Any, env: Any, title: str) -> list[str]:
    """The search terms of ``question`` that name none of its supporting documents (nor ``title``)."""
    named = set(tokenize(title))
    for doc_id in question.supporting_ids:
        named.update(tokenize(env.document(doc_id).title))
    return [w for w in dict.fromkeys(tokenize(sanitize(question.question))) if w not in named]


class ScriptedPolicy:
    """Base class. ``context`` is the env context mode the strategy is meant for."""

    name = "scripted"
    context = "memory"

    def reset(self, env: Any = None) -> None:
        """Called at the start of each episode (only the oracle uses the env)."""

    def act(self, observation: str) -> str:
        raise NotImplementedError

    # Shared decision rule: answer when every question is resolved or this is the last turn; else search
    # for the first entity whose fact is missing (or, for a free-text question, the question itself).
    @staticmethod
    def _decide(questions: list[str], text: str, turns_left: int,
                known_answers: dict[int, str] | None = None) -> tuple[str, str, list[Progress]]:
        known_answers = known_answers or {}
        facts, candidates = facts_in(text), None
        answers, progress_list, query = [], [], None
        for i, question in enumerate(questions, 1):
            plan = parse_question(question)
            if plan is None:
                candidates = sentences(text) if candidates is None else candidates
                progress = resolve_open(question, candidates)
            else:
                progress = resolve(plan, facts)
            progress_list.append(progress)
            answer = progress.answer or known_answers.get(i)
            answers.append(answer or "")
            if answer is None and query is None and progress.need is not None:
                query = progress.need[0]
        if query is None or turns_left <= 1:
            return "answer", "; ".join(answers), progress_list
        return "search", query, progress_list


def _useful(sentence: str, progress: list[Progress], questions: list[str]) -> bool:
    """A sentence worth remembering: a fact on a question's chain or about an entity a question names, or
    evidence for a free-text question."""
    fact = parse_fact(sentence)
    if fact is not None:
        used = {(f[0], f[1]) for p in progress for f in p.used}
        return (fact[0], fact[1]) in used or any(fact[0] in q for q in questions)
    return any(sentence in p.evidence for p in progress)


class KeepAllPolicy(ScriptedPolicy):
    """Never forgets: appends every useful sentence of each result to the memory (see :func:`_useful`)."""

    name = "keep-all"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        # A fragment left by a truncated window is not kept: only whole sentences with content survive.
        kept = sentences(view.memory)
        seen = set(kept)
        new = [s for s in dict.fromkeys(sentences(view.information)) if s not in seen]
        tool, argument, progress = self._decide(view.questions, "\n".join(kept + new), view.turns_left)
        kept += [s for s in new if _useful(s, progress, view.questions)]
        return format_action(" ".join(kept), tool, argument)


class RelevancePolicy(ScriptedPolicy):
    """Keeps resolved answers (one short line each) and the facts most relevant to still-open questions,
    within ``memory_budget`` words."""

    name = "relevance"

    def __init__(self, memory_budget: int = 80) -> None:
        self.memory_budget = memory_budget

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        known: dict[int, str] = {}
        candidates: list[str] = []
        for line in view.memory.split("\n"):
            match = _ANSWER_LINE.match(line.strip())
            if match:
                known[int(match.group(1))] = match.group(2)
            elif line.strip():
                candidates.extend(sentences(line))
        candidates = list(dict.fromkeys(candidates + sentences(view.information)))
        tool, argument, progress = self._decide(view.questions, "\n".join(candidates), view.turns_left, known)
        for i, p in enumerate(progress, 1):
            if p.answer is not None:
                known[i] = p.answer
        # Relevance: facts a still-open question's chain went through rank first, then facts whose subject
        # is named in an open question, then evidence for open free-text questions; the rest is dropped.
        open_progress = [p for i, p in enumerate(progress, 1) if i not in known]
        open_questions = [q for i, q in enumerate(view.questions, 1) if i not in known]
        on_chain = {(f[0], f[1]) for p in open_progress for f in p.used}
        open_words = [set(tokenize(q)) for q, p in zip(view.questions, progress) if p.answer is None]
        scored = []
        for order, sentence in enumerate(candidates):
            fact = parse_fact(sentence)
            if fact is not None:
                score = 3 if (fact[0], fact[1]) in on_chain else 2 if any(fact[0] in q for q in open_questions) else 0
            else:
                best = max((overlap(w, sentence) for w in open_words), default=0)
                score = 1 if best >= 2 else 0
            if score:
                scored.append((-score, order, sentence))
        # Answer lines first (cheapest progress to keep), then facts, all within the budget.
        lines, budget = [], self.memory_budget
        answer_lines = [f"Answer {i}: {a}" for i, a in sorted(known.items())]
        for line in answer_lines + [sentence for _, _, sentence in sorted(scored)]:
            words = len(line.split())
            if words <= budget:
                lines.append(line)
                budget -= words
        return format_action("\n".join(lines), tool, argument)


class LastObservationPolicy(ScriptedPolicy):
    name = "last-observation"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        tool, argument, _ = self._decide(view.questions, view.information, view.turns_left)
        return format_action("", tool, argument)


class HistoryPolicy(ScriptedPolicy):
    """Search-R1-style: no memory rewriting; reads whatever of the transcript is still in the window."""

    name = "history"
    context = "history"

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        tool, argument, _ = self._decide(view.questions, view.visible, view.turns_left)
        return format_action(None, tool, argument)


class OraclePolicy(ScriptedPolicy):
    """The expert: knows which documents support each question (``reset(env)`` hands it the env), finds them
    by searching, and answers only from what it found and kept.

    Memory holds one line per supporting document retrieved, ``Title: evidence sentences`` (the gold fact
    sentences on the synthetic world; on real data the sentences that hold the answer or name another of the
    question's supporting documents, the bridge), and, once a search has missed, a ``Failed searches: q1 | q2``
    line. What it writes and does is a function of the observation, the gold task and its own earlier queries,
    so its trajectories are valid expert demonstrations.

    Searching: each missing supporting document is searched by its title first (on the synthetic world that
    always finds it, so the oracle makes one search per document). A search that misses its document is never
    repeated (no query with the same search terms is issued twice); the next search for that document is a
    reformulation, in this order (see :meth:`query_forms`): the title without its parenthesised
    disambiguation, a sentence from memory that names the document (the bridge entity in context), the title
    with one key word of the question, the title with all of them (the question's key phrase), and the
    question itself. Missing documents take turns (the one searched least goes next), and the oracle answers
    when every document is found, when it has no untried query left, or on the last turn.

    Answering: a question gets its gold answer only with evidence in memory: every supporting document was
    retrieved, or (for a bridge question whose answer is not yes/no) a kept sentence contains the answer.
    Otherwise the oracle abstains with :attr:`abstain_answer` (``"unknown"``): it scores 0 but never teaches a
    model trained on its trajectories to answer what it did not read. A question without supporting documents
    (a generic dataset may omit them) is searched by its text, and a result sentence containing the answer
    is kept as evidence.

    After each :meth:`act`, ``evidence_complete`` says whether every supporting document of every question is
    in memory, ``supported`` (one bool per question) which answers memory supports, and ``queries`` lists
    the searches issued this episode.

    Args:
        reformulate: search a missed document again with other queries (default). ``False`` searches titles
            only (each once), for comparison.
        abstain_answer: the answer given to a question memory does not support.
    """

    name = "oracle"

    def __init__(self, reformulate: bool = True, abstain_answer: str = "unknown") -> None:
        self.reformulate = reformulate
        self.abstain_answer = abstain_answer
        self.env = None
        self._reset_episode()

    def _reset_episode(self) -> None:
        self.missing: list[str] = []  # after each act: the targets (document titles) not yet in memory
        self.queries: list[str] = []
        self.evidence_complete = False
        self.supported: list[bool] = []
        self._failed_terms: set[tuple[str, ...]] = set()  # search terms of the queries that missed
        self._misses: dict[str, int] = {}  # target key -> searches that missed it
        self._failed: list[str] = []
        self._last_target: str | None = None

    def reset(self, env: Any = None) -> None:
        if env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        self.env = getattr(env, "unwrapped", env)
        self._reset_episode()

    # ------------------------------------------------------------------ evidence
    @staticmethod
    def _evidence_sentences(question, doc: Document, others: list[str]) -> list[str]:
        """The sentences of ``doc`` worth keeping for ``question``: the gold fact sentences where the task
        states them (synthetic world); else those holding the answer (at most two) and the first naming
        another supporting document (the bridge), in document order; else the first sentence."""
        doc_sentences = sentences(doc.text)
        gold: set[Fact] = set(map(tuple, question.meta.get("facts", ())))
        if gold:
            return [s for s in doc_sentences if parse_fact(s) in gold]
        answers = [a for a in question.answers if not _categorical(a)]
        with_answer = [s for s in doc_sentences if any(_contains(s, a) for a in answers)][:2]
        bridge = [s for s in doc_sentences if s not in with_answer and any(o in s for o in others)][:1]
        keep = set(with_answer + bridge)
        return [s for s in doc_sentences if s in keep] or doc_sentences[:1]

    def _supported(self, question, lines: dict[str, str]) -> bool:
        """Whether memory (``title -> kept text``) holds evidence for ``question``'s gold answer."""
        if not question.supporting_ids:
            return any(_contains(text, a) for text in lines.values() for a in question.answers)
        titles = [self.env.document(d).title for d in question.supporting_ids]
        if all(t in lines for t in titles):
            return True
        if question.kind == "comparison" or any(_categorical(a) for a in question.answers):
            return False  # a comparison, or a yes/no answer, needs every compared document
        kept = " ".join(f"{t} {lines[t]}" for t in titles if t in lines)
        return any(_contains(kept, a) for a in question.answers)

    # ------------------------------------------------------------------ searching
    def query_forms(self, question, doc: Document | None, lines: dict[str, str]) -> list[str]:
        """The queries for finding ``doc`` (``None``: evidence for a question without supporting documents),
        in the order they are tried; :meth:`act` skips any whose search terms were already searched."""
        text = sanitize(question.question)
        if doc is None:
            return [text] + ([" ".join(_key_words(question, self.env, ""))] if self.reformulate else [])
        forms = [doc.title]
        if self.reformulate:
            bare = _bare(doc.title)
            forms.append(bare)
            if bare:  # the bridge entity in context: a kept sentence of another document naming this one
                forms += [s for kept in lines.values() for s in sentences(kept) if bare in s]
            words = _key_words(question, self.env, doc.title)
            forms += [f"{doc.title} {w}" for w in words]
            forms += [" ".join([doc.title, *words]), text]
        return forms

    def _next_query(self, missing: list[str], targets: dict[str, tuple[Any, Document | None]],
                    lines: dict[str, str]) -> tuple[str, str] | None:
        """``(query, target key)`` of the next search: the missing target searched least so far (ties: task
        order) that still has an untried query form; ``None`` when no target has one."""
        order = sorted(range(len(missing)), key=lambda i: (self._misses.get(missing[i], 0), i))
        for i in order:
            key = missing[i]
            for form in self.query_forms(*targets[key], lines):
                terms = tuple(sorted(tokenize(form)))
                if terms and terms not in self._failed_terms:
                    return form, key
        return None

    # ------------------------------------------------------------------ acting
    def remembered(self, memory: str) -> str:
        """The memory text the oracle acts on: the observation's own (:class:`ForgetfulOracle` adds what the
        transcript still holds)."""
        return memory

    def act(self, observation: str) -> str:
        if self.env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        view = read_observation(observation)
        # Memory lines are kept verbatim (a context budget may have cut the first one); ``lines`` reads the
        # document lines as title -> kept text, ``concluded`` the answer lines as question number -> answer.
        questions = self.env.questions
        # A title may itself hold ": " ("Namibia: The Struggle for Liberation"): known titles are matched first.
        titles = sorted({self.env.document(d).title for q in questions for d in q.supporting_ids}, key=len,
                        reverse=True)
        kept_lines, lines, concluded = [], {}, {}
        for line in self.remembered(view.memory).split("\n"):
            if not line.strip() or line.startswith(FAILED_SEARCHES):
                continue
            kept_lines.append(line)
            match = _ANSWER_LINE.match(line)
            if match:
                concluded[int(match.group(1))] = match.group(2)
                continue
            title = next((t for t in titles if line.startswith(f"{t}: ")), None)
            if title is None:
                title = line.partition(": ")[0]
            lines[title] = line[len(title) + 2:]
        new_lines: dict[str, str] = {}
        shown = [m.group(1) for m in _RESULT_ENTRY.finditer(view.information)]
        targets: dict[str, tuple[Any, Document | None]] = {}  # still to find: key -> (question, document)
        for i, question in enumerate(questions, 1):
            if i in concluded:
                continue
            docs = [self.env.document(d) for d in question.supporting_ids]
            if not docs:
                targets[f"question {i}"] = (question, None)
            for doc in docs:
                targets.setdefault(doc.title, (question, doc))
                if doc.title not in lines and f"{doc.title}) {doc.text}" in shown:
                    others = [_bare(d.title) for d in docs if d is not doc]
                    lines[doc.title] = new_lines[doc.title] = " ".join(
                        self._evidence_sentences(question, doc, others))
            if not docs and not self._supported(question, lines):
                # No supporting documents named: a result sentence holding the answer is the evidence.
                answers = [a for a in question.answers if not _categorical(a)]
                for entry in shown:
                    title, _, text = entry.partition(") ")
                    hits = [s for s in sentences(text) if any(_contains(s, a) for a in answers)]
                    if hits and title not in lines:
                        lines[title] = new_lines[title] = hits[0]
                        break

        def found(key: str) -> bool:
            question, doc = targets[key]
            return doc.title in lines if doc is not None else self._supported(question, lines)

        if self._last_target is not None and self._last_target in targets and not found(self._last_target):
            self._failed.append(self.queries[-1])
            self._failed_terms.add(tuple(sorted(tokenize(self.queries[-1]))))
            self._misses[self._last_target] = self._misses.get(self._last_target, 0) + 1
        self._last_target = None
        self.supported = [i in concluded or self._supported(q, lines) for i, q in enumerate(questions, 1)]
        if _memory_cut(view.visible):
            # The context budget hides the start of the memory: conclude what the visible evidence supports
            # (one short answer line per question) and keep only the documents still needed.
            for i, (question, ok) in enumerate(zip(questions, self.supported), 1):
                if ok and i not in concluded:
                    concluded[i] = question.answers[0]
            needed = {self.env.document(d).title for i, q in enumerate(questions, 1) if i not in concluded
                      for d in q.supporting_ids}
            targets = {k: t for k, t in targets.items() if k in needed or t[1] is None and k not in concluded}
            kept_lines = [f"{t}: {kept}" for t, kept in lines.items() if t in needed]
            kept_lines += [f"Answer {i}: {a}" for i, a in sorted(concluded.items())]
        else:
            kept_lines += [f"{title}: {kept}" for title, kept in new_lines.items()]
        missing = [key for key in targets if not found(key)]
        self.missing = missing
        self.evidence_complete = not missing
        memory = "\n".join(kept_lines + ([FAILED_SEARCHES + " | ".join(self._failed)] if self._failed else []))
        if missing and view.turns_left > 1:
            choice = self._next_query(missing, targets, lines)
            if choice is not None:
                query, key = choice
                self.queries.append(query)
                self._last_target = key
                return format_action(memory, "search", query)
        answers = [q.answers[0] if ok else self.abstain_answer for q, ok in zip(questions, self.supported)]
        return format_action(memory, "answer", "; ".join(answers))


class ForgetfulOracle(OraclePolicy):
    """The oracle whose memory loses one fact in a share of its episodes: demonstrations of what to do when the
    memory state no longer holds what the episode's transcript does (issue 61: the states where MemOPD's two
    views should point the student to different actions).

    In an episode drawn to forget (probability ``forget_rate``, drawn at :meth:`reset` from ``seed``), the search
    for the last missing document drops one document line (drawn likewise) from the memory it writes. Then:

    - ``reads_transcript=False`` (the memory view's expert): it acts on its memory only, so it finds the document
      missing and searches for it again before answering;
    - ``reads_transcript=True`` (the flattened transcript's expert): the lost line is still in the transcript it
      reads, so it copies it back into memory and answers without searching again.

    Both draw the same two numbers per episode, so two of them made with one ``seed`` and played on the same
    task seeds in the same order forget the same line at the same turn. ``forgot`` says whether this episode lost a
    line, ``lost`` which (title -> kept text).
    """

    name = "oracle-forgetful"

    def __init__(self, forget_rate: float = 0.5, seed: int = 0, reads_transcript: bool = False,
                 **kwargs: Any) -> None:
        if not 0.0 <= forget_rate <= 1.0:
            raise ValueError(f"forget_rate must be in [0, 1], got {forget_rate}")
        super().__init__(**kwargs)
        self.forget_rate, self.reads_transcript = float(forget_rate), bool(reads_transcript)
        self._rng = np.random.default_rng(seed)
        self._forgets, self._which = False, 0.0
        self.forgot, self.lost = False, {}

    def reset(self, env: Any = None) -> None:
        super().reset(env)
        self._forgets = bool(self._rng.random() < self.forget_rate)
        self._which = float(self._rng.random())
        self.forgot, self.lost = False, {}

    def remembered(self, memory: str) -> str:
        if not self.reads_transcript or not self.lost:
            return memory
        present = set(memory.split("\n"))
        back = [f"{title}: {text}" for title, text in self.lost.items() if f"{title}: {text}" not in present]
        return "\n".join([m for m in [memory, *back] if m])

    def act(self, observation: str) -> str:
        from memenv.protocol import parse_action

        action = super().act(observation)
        if not self._forgets or self.forgot or len(self.missing) != 1:
            return action
        parsed = parse_action(action)
        if parsed.tool != "search":
            return action
        lines = (parsed.memory or "").split("\n")
        questions = self.env.questions
        titles = {self.env.document(d).title for q in questions for d in q.supporting_ids}
        droppable = [i for i, line in enumerate(lines) if any(line.startswith(f"{t}: ") for t in titles)]
        if not droppable:
            return action
        index = droppable[int(self._which * len(droppable))]
        title = next(t for t in sorted(titles, key=len, reverse=True) if lines[index].startswith(f"{t}: "))
        self.lost[title] = lines[index][len(title) + 2:]
        self.forgot = True
        return format_action("\n".join(lines[:index] + lines[index + 1:]), "search", parsed.argument or "")


STRATEGIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "oracle": OraclePolicy,
    "keep-all": KeepAllPolicy,
    "relevance": RelevancePolicy,
    "last-observation": LastObservationPolicy,
    "history": HistoryPolicy,
}


# Strategies per environment family (the env id up to its first "-": "MemQA-v0" -> "MemQA"). Reading envs
# (MemRead, MemDialog) register their own implementations of the same strategy names here; "FAMILY:tools" holds
# a family's strategies for memory_mode="tools".
STRATEGY_FAMILIES: dict[str, dict[str, Callable[[], ScriptedPolicy]]] = {"MemQA": STRATEGIES}


def env_family(env_id: str, memory_mode: str | None = None) -> str:
    """The strategy family of ``env_id``: the longest registered family it starts with ("MemDialog-BEAM-v0" ->
    "MemDialog-BEAM"), else the id up to its first "-"; with ``memory_mode="tools"``, that family's tools-mode
    family (``"MemQA:tools"``) where one is registered."""
    name = env_id.split(":")[-1]
    family = next((f for f in sorted(STRATEGY_FAMILIES, key=len, reverse=True) if name.startswith(f + "-")),
                  name.split("-", 1)[0])
    tools = f"{family}:tools"
    return tools if memory_mode == "tools" and tools in STRATEGY_FAMILIES else family


def make_strategy(name: str, env_id: str = "MemQA-v0", memory_mode: str | None = None,
                  **kwargs: Any) -> ScriptedPolicy:
    """A scripted strategy by name for the env ``env_id`` in ``memory_mode`` (see :data:`STRATEGY_FAMILIES`)."""
    family = STRATEGY_FAMILIES.get(env_family(env_id, memory_mode))
    if family is None:
        raise ValueError(f"no scripted strategies for {env_id!r}; families: {', '.join(STRATEGY_FAMILIES)}")
    if name not in family:
        mode = "" if memory_mode is None else f" with memory_mode={memory_mode!r}"
        raise ValueError(f"unknown strategy {name!r} for {env_id}{mode}: choose from {', '.join(family)}")
    return family[name](**kwargs)
