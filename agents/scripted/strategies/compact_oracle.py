"""The compact-notes oracle: the MemQA expert for a memory budget that binds (issue 61).

:class:`~agents.scripted.strategies.qa_strategies.OraclePolicy` keeps whole document lines (``Title: evidence``) in
memory; under a budget of a few words they are cut and it searches the same documents again until its turns run out.
:class:`CompactOracle` keeps one short note per question instead, and plays the best action **given its view's
information**, so it demonstrates both of MemOPD's views (``reads_transcript``):

Notes, one a line (whitespace words: ``Q1: 1949`` costs 2):

- ``Q{i}: {answer}``: question ``i`` is answered. A bridge question's note holds its answer; a comparison's the
  longest word of the winning side's name that the other side's name lacks (``Q2: Stejou``: the question names
  both sides, so the word decides it).
- ``Q{i}{letter}: {value}``: question ``i`` is under way; its supporting document ``letter`` (``a`` the first, in
  the task's order) was read and says ``value`` (a comparison side's year or population, a chain's next entity).
  Only the furthest document read on each side of the question is noted.

A line that is not exactly such a note (one the budget cut, say) is no note. Notes are written in the order they
were first written, then new ones in the plan's order; one that would overflow the budget (the env's
``memory_budget``, counted with the env's token counter) is left out whole, and a question whose new note does
not fit keeps its old note if that fits.

Plan: questions needing more documents first (their notes must live across turns), then shorter answers first (a
long answer is best read last, from the result in front), then task order; a question's documents in the task's
order; each searched by its title (a missed search is reformulated as the oracle does).

Acting, memory view (``reads_transcript=False``): it knows what its memory notes and the observation in front
say, and its own earlier searches (which documents it has searched and found), nothing else.

- every question answerable from memory and the result in front: it answers at once (the last answer need not be
  stored);
- else it searches the next document never found before, while the memory has room for a note (the document's
  note may still not fit when read: then it is lost);
- else, once per episode, a *last search*: for a document that completes a question by itself (a note the budget
  cut is searched again here), when that answers more questions than answering now does; it answers next turn;
- else, and on the last turn, it answers what memory and the result in front support, ``"unknown"`` elsewhere.

Acting, transcript view (``reads_transcript=True``, the flattened transcript's expert): it also knows every
earlier result of the episode (the transcript holds them all), so it searches only documents the transcript lacks,
never one whose answer it already read, and answers once every question is answerable (or on the last turn). Its
memory notes are written as the memory view's are.

Both views follow one plan, so on episodes where the memory never has to drop a note they play the same actions.
A question is answered only from what the view holds, never otherwise. The synthetic world's gold facts
(``question.meta["facts"]``, one per supporting document) are needed: :meth:`reset` refuses a task without them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from agents.scripted.strategies.qa_strategies import OraclePolicy, _RESULT_ENTRY
from agents.scripted.strategies.world_reader import read_observation
from memenv.protocol import format_action, parse_action
from memenv.search.bm25 import tokenize

__all__ = ["CompactOracle", "TranscriptCompactOracle"]

_NOTE = re.compile(r"^Q(\d+)([a-z]?): (.+)$")
_ANY_SEARCH = "<another policy's search>"  # _last_doc after follow(): what the next result shows counts as found


def _distinct_word(answer: str, other: str) -> str:
    """The longest word of ``answer`` that ``other`` lacks (ties: the last), else ``answer`` itself."""
    others = {w.lower() for w in other.split()}
    words = [w for w in answer.split() if w.lower() not in others]
    if not words:
        return answer
    return max(reversed(words), key=len)


class _Plan:
    """One question's documents, the value each one's gold fact states, its sides and its notes."""

    def __init__(self, index: int, question: Any, env: Any) -> None:
        self.index, self.question = index, question
        self.docs = [env.document(d) for d in question.supporting_ids]
        facts = [tuple(f) for f in question.meta.get("facts", ())]
        if len(facts) != len(self.docs) or any(f[0] != d.title for f, d in zip(facts, self.docs)):
            raise ValueError(f"CompactOracle needs the synthetic world's gold facts (one per supporting document) "
                             f"for every question; question {index} ({question.question!r}) has none that match")
        self.values = [str(f[2]) for f in facts]
        n = len(self.docs)
        self.comparison = question.kind == "comparison"
        if self.comparison:
            if n % 2 or n < 2:
                raise ValueError(f"CompactOracle: comparison question {index} has {n} supporting documents")
            self.sides = [list(range(n // 2)), list(range(n // 2, n))]
            ends = [self.docs[n // 2 - 1].title, self.docs[n - 1].title]
            answer = question.answers[0]
            winner = 0 if answer == ends[0] else 1
            self.word = _distinct_word(ends[winner], ends[1 - winner])
        else:
            self.sides = [list(range(n))]
            self.word = question.answers[0]
        self.done_note = f"Q{index}: {self.word}"

    def note(self, doc: int) -> str:
        return f"Q{self.index}{chr(ord('a') + doc)}: {self.values[doc]}"

    def notes(self, known: list[int]) -> list[str]:
        """The notes of a state (per side, the furthest document read; -1: none)."""
        if self.complete(known):
            return [self.done_note]
        return [self.note(k) for k in known if k >= 0]

    def complete(self, known: list[int]) -> bool:
        return all(k == side[-1] for k, side in zip(known, self.sides))

    def next_docs(self, known: list[int]) -> list[int]:
        """The next document to read on each side not finished yet."""
        return [k + 1 if k >= 0 else side[0] for k, side in zip(known, self.sides) if k != side[-1]]

    def remaining(self, known: list[int]) -> int:
        """How many documents are still to read."""
        return sum(side[-1] - (k if k >= 0 else side[0] - 1) for k, side in zip(known, self.sides))

    def parse(self, memory_lines: list[str]) -> list[int]:
        """The state the memory's notes give this question."""
        known = [-1] * len(self.sides)
        if self.done_note in memory_lines:
            return [side[-1] for side in self.sides]
        for s, side in enumerate(self.sides):
            for doc in side:
                if self.note(doc) in memory_lines:
                    known[s] = max(known[s], doc)
        return known

    def read(self, known: list[int], shown: set[str]) -> list[int]:
        """The state after reading the documents whose ids are in ``shown``: a side advances document by document
        (its next one must be among them)."""
        known = list(known)
        for s, side in enumerate(self.sides):
            while known[s] != side[-1]:
                nxt = known[s] + 1 if known[s] >= 0 else side[0]
                if self.docs[nxt].id not in shown:
                    break
                known[s] = nxt
        return known


class CompactOracle(OraclePolicy):
    """The oracle with compact notes for a binding memory budget (see the module doc).

    Args:
        reads_transcript: ``False`` (default): the memory view's expert; ``True``: the flattened transcript's.
        memory_budget: the budget its notes must fit, in the env's tokens; ``None`` (default): the env's own
            ``memory_budget`` (no limit where the env has none).
        reformulate, abstain_answer: as :class:`OraclePolicy`.

    After each :meth:`act`: ``supported`` (per question, whether its view holds the answer), ``missing`` (the
    titles of the documents still to read), ``evidence_complete``, ``queries`` (this episode's searches),
    ``researched`` (the searches for a document found before: the memory view's re-searches of a lost note) and
    ``lost`` (question numbers whose note was read but not kept, this turn).

    **Labelling another policy's states** (DAgger-style relabelling, :mod:`agents.llm.training.relabel`): after
    each :meth:`act`, :meth:`follow` says which action the env actually received. Where it was not the expert's,
    the expert's own bookkeeping of that turn is undone, and a search it did not choose counts whatever it shows as
    found (a title whose search found it is searched by its title), never as a failed query form of its own.
    """

    name = "oracle-compact"

    def __init__(self, reads_transcript: bool = False, memory_budget: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reads_transcript = bool(reads_transcript)
        if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int)
                                          or memory_budget < 0):
            raise ValueError(f"memory_budget must be an integer >= 0 or None, got {memory_budget!r}")
        self.memory_budget = memory_budget

    def _reset_episode(self) -> None:
        super()._reset_episode()
        self.plans: list[_Plan] = []
        self.researched: list[str] = []
        self.lost: list[int] = []
        self._found: set[str] = set()  # ids of documents a search of its own brought in
        self._seen: set[str] = set()  # ids of documents any result showed (the transcript's)
        self._last_doc: str | None = None
        self._final = False
        self._undo: tuple[int, int, bool] | None = None  # the last act's queries, re-searches, last-search flag
        self._acted: str | None = None  # the last act's action, until follow() is told what the env received

    def reset(self, env: Any = None) -> None:
        super().reset(env)
        plans = [_Plan(i, q, self.env) for i, q in enumerate(self.env.questions, 1)]
        self.plans = sorted(plans, key=lambda p: (-len(p.docs), len(p.done_note.split()), p.index))
        budget = self.memory_budget if self.memory_budget is not None else getattr(self.env, "memory_budget", None)
        self.budget = math.inf if budget is None else budget
        self.count = getattr(self.env, "count_tokens", None) or (lambda text: len(text.split()))

    # ------------------------------------------------------------------ memory
    def _fits(self, lines: list[str]) -> bool:
        return self.count("\n".join(lines)) <= self.budget

    def _write(self, memory_lines: list[str], before: dict[int, list[int]],
               now: dict[int, list[int]]) -> list[str]:
        """The notes to write: each question's notes of ``now``, else of ``before``, where they fit (see the
        module doc for the order)."""
        first_line = {}
        for position, line in enumerate(memory_lines):
            match = _NOTE.match(line)
            if match:
                first_line.setdefault(int(match.group(1)), position)
        order = sorted(self.plans, key=lambda p: (p.index not in first_line, first_line.get(p.index, 0)))
        kept: list[str] = []
        for plan in order:
            for state in (now[plan.index], before[plan.index]):
                notes = plan.notes(state)
                if notes and self._fits(kept + notes):
                    kept += notes
                    break
        return kept

    # ------------------------------------------------------------------ searching
    def _query(self, plan: _Plan, doc: int) -> str | None:
        """A query for the document: its title where a search of ours found it before, else the next untried
        form (:meth:`OraclePolicy.query_forms`)."""
        document = plan.docs[doc]
        if document.id in self._found:
            return document.title
        for form in self.query_forms(plan.question, document, {}):
            terms = tuple(sorted(tokenize(form)))
            if terms and terms not in self._failed_terms:
                return form
        return None

    def _search(self, plan: _Plan, doc: int, query: str, memory: list[str]) -> str:
        if plan.docs[doc].id in self._found:
            self.researched.append(query)
        self.queries.append(query)
        self._last_doc = plan.docs[doc].id
        return format_action("\n".join(memory), "search", query)

    # ------------------------------------------------------------------ acting
    def act(self, observation: str) -> str:
        action = self._act(observation)
        self._acted = action
        return action

    def follow(self, taken: str) -> None:
        """The env received ``taken`` after the last :meth:`act` (another policy's action, in relabelling): where
        it is not the expert's own action, undo what that action's choice recorded (its query, a re-search, the
        last-search flag), and let a search it did not choose count what it shows as found at the next act."""
        if self._acted is None:
            raise ValueError("follow() needs an act() first, after reset()")
        if taken != self._acted:
            queries, researched, final = self._undo
            del self.queries[queries:], self.researched[researched:]
            self._final = final
            parsed = parse_action(taken)
            self._last_doc = _ANY_SEARCH if parsed.valid and parsed.tool == "search" else None
        self._acted = None

    def _act(self, observation: str) -> str:
        if self.env is None or not self.plans:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        view = read_observation(observation)
        shown_titles = set(m.group(1) for m in _RESULT_ENTRY.finditer(view.information))
        shown = {d.id for p in self.plans for d in p.docs if f"{d.title}) {d.text}" in shown_titles}
        if self._last_doc == _ANY_SEARCH:  # another policy's search (follow): what it shows counts as found
            self._found |= shown
        elif self._last_doc is not None:
            if self._last_doc in shown:
                self._found.add(self._last_doc)
            elif self.queries:
                self._failed.append(self.queries[-1])
                self._failed_terms.add(tuple(sorted(tokenize(self.queries[-1]))))
        self._last_doc = None
        self._seen |= shown
        self._undo = (len(self.queries), len(self.researched), self._final)
        memory_lines = [line.strip() for line in view.memory.split("\n") if line.strip()]
        before = {p.index: p.parse(memory_lines) for p in self.plans}
        # What this view knows now: memory and the result in front, or (transcript) every result so far.
        readable = self._seen if self.reads_transcript else shown
        now = {p.index: p.read(before[p.index], readable) for p in self.plans}
        memory = self._write(memory_lines, before, now)
        kept = {p.index: p.parse(memory) for p in self.plans}
        complete = {p.index for p in self.plans if p.complete(now[p.index])}
        self.lost = sorted(p.index for p in self.plans if now[p.index] != before[p.index]
                           and kept[p.index] != now[p.index])
        self.supported = [i in complete for i in range(1, len(self.plans) + 1)]
        # The plan goes on from what the next turn will know: the transcript, or the notes kept.
        after = now if self.reads_transcript else kept
        targets = [(p, doc) for p in self.plans if not p.complete(after[p.index])
                   for doc in p.next_docs(after[p.index])]
        self.missing = [p.docs[doc].title for p, doc in targets]
        self.evidence_complete = len(complete) == len(self.plans)
        if not self.evidence_complete and view.turns_left > 1 and not self._final:
            if self.reads_transcript:
                for plan, doc in targets:
                    query = self._query(plan, doc)
                    if query is not None:
                        return self._search(plan, doc, query, memory)
            else:
                action = self._memory_view_search(targets, memory, kept, complete, view.turns_left)
                if action is not None:
                    return action
        answers = [q.answers[0] if ok else self.abstain_answer for q, ok in zip(self.env.questions, self.supported)]
        return format_action("\n".join(memory), "answer", "; ".join(answers))

    def _memory_view_search(self, targets, memory: list[str], kept: dict[int, list[int]], complete: set[int],
                            turns_left: int) -> str | None:
        """The memory view's search, or None to answer now (see the module doc)."""
        shortest = self.count("Q1: x")
        if turns_left > 2:
            for plan, doc in targets:
                if plan.docs[doc].id in self._found:
                    continue
                # Room for the document's note: what is free plus the question's notes it would replace.
                others = [line for line in memory if line not in plan.notes(kept[plan.index])]
                if not self._fits(others + ["x " * shortest]):
                    continue
                query = self._query(plan, doc)
                if query is not None:
                    return self._search(plan, doc, query, memory)
        # The last search: a document that completes a question by itself, where that answers more than now.
        kept_complete = sum(p.complete(kept[p.index]) for p in self.plans)
        if kept_complete + 1 <= len(complete):
            return None
        for plan, doc in targets:
            if plan.remaining(kept[plan.index]) == 1:
                query = self._query(plan, doc)
                if query is not None:
                    self._final = True
                    return self._search(plan, doc, query, memory)
        return None


class TranscriptCompactOracle(CompactOracle):
    """:class:`CompactOracle` in the flattened transcript's view (``reads_transcript=True``), for a bench
    (``--strategies agents.scripted.strategies.compact_oracle:TranscriptCompactOracle``)."""

    name = "oracle-compact-transcript"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(reads_transcript=True, **kwargs)
