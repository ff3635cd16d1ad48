"""Scripted strategies for MemQA's memory-tools protocol (``gym.make("MemQA-v0", memory_mode="tools")``).

Each action is one call: ``<search>`` the corpus, ``<mem_add>``/``<mem_delete>``/``<mem_search>`` the store, or
``<answer>``. They read the world's language with the same reader as the rewrite-mode strategies
(:mod:`agents.scripted.strategies.world_reader`), and the store's results with
:mod:`agents.scripted.strategies.tool_strategies`.

- ``oracle``: knows the supporting documents (``reset(env)``); searches each as the rewrite-mode oracle does
  (title first, reformulating a search that missed), adds one entry per document found
  (``Title: evidence sentences``), and answers the gold answers where its store holds the evidence (else
  ``"unknown"``). The upper bound, and expert trajectories for the tools protocol.
- ``rag``: store everything, answer from retrieval: after each corpus search, one entry per document shown
  (its fact sentences; the whole text where the reader finds no fact), oldest out when the store is full; it
  knows only what ``<mem_search>`` returns: it searches its store for the entity a question needs next, and
  searches the corpus only when the store does not have it.

Like the BEAM tool strategies, they keep only what the env has shown them (the ids in ``added entry N``
results, the entries a search returned) plus their own calls.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from agents.scripted.strategies.qa_strategies import (STRATEGY_FAMILIES, OraclePolicy, ScriptedPolicy, _bare,
                                                     _categorical, _contains)
from agents.scripted.strategies.tool_strategies import added_entry, read_tool_observation, result_entries
from agents.scripted.strategies.world_reader import parse_fact, read_observation, sentences
from memenv.memory_tools import format_tool_call
from memenv.search.bm25 import tokenize

__all__ = ["QA_TOOL_STRATEGIES", "QAToolOraclePolicy", "QAToolRagPolicy"]

_DOC = re.compile(r"^Doc \d+ \(Title: (.*?)\) (.*)$", re.MULTILINE)


def shown_documents(information: str) -> list[tuple[str, str]]:
    """``(title, text)`` of the documents a search result shows (without the ``[result]`` line)."""
    return _DOC.findall(information.split("\n[result] ", 1)[0])


class QAToolOraclePolicy(OraclePolicy):
    """The rewrite-mode oracle's searches and evidence, kept as one store entry per supporting document."""

    name = "oracle"
    env_kwargs = {"memory_mode": "tools"}

    def _reset_episode(self) -> None:
        super()._reset_episode()
        self._lines: dict[str, str] = {}  # title (or "question i") -> kept text, for entries the env added
        self._pending: tuple[str, str] | None = None
        self._refused: set[str] = set()  # evidence the store refused (full): not searched or added again

    def _new_evidence(self, targets: dict[str, tuple[Any, Any]], shown: list[tuple[str, str]]) -> dict[str, str]:
        """What the newest search result adds to the store: a supporting document's evidence sentences, or (for
        a question without supporting documents) a result sentence holding its answer."""
        new: dict[str, str] = {}
        for key, (question, doc) in targets.items():
            if key in self._lines or key in self._refused:
                continue
            if doc is not None:
                if (doc.title, doc.text) in shown:
                    others = [_bare(self.env.document(d).title) for d in question.supporting_ids
                              if self.env.document(d) is not doc]
                    new[key] = " ".join(self._evidence_sentences(question, doc, others))
                continue
            answers = [a for a in question.answers if not _categorical(a)]
            hits = [f"{title}: {s}" for title, text in shown for s in sentences(text)
                    if any(_contains(s, a) for a in answers)]
            if hits:
                new[key] = hits[0]
        return new

    @staticmethod
    def _entry(key: str, text: str) -> str:
        return text if key.startswith("question ") else f"{key}: {text}"

    def act(self, observation: str) -> str:
        if self.env is None:
            raise ValueError("the oracle needs the env: call policy.reset(env) after env.reset()")
        view = read_observation(observation)
        store = read_tool_observation(observation)
        if self._pending is not None:
            if added_entry(store.result):
                self._lines[self._pending[0]] = self._pending[1]
            else:
                self._refused.add(self._pending[0])
        self._pending = None
        questions = self.env.questions
        targets: dict[str, tuple[Any, Any]] = {}  # key -> (question, supporting document or None)
        for i, question in enumerate(questions, 1):
            if not question.supporting_ids:
                targets[f"question {i}"] = (question, None)
            for doc_id in question.supporting_ids:
                doc = self.env.document(doc_id)
                targets.setdefault(doc.title, (question, doc))
        new = self._new_evidence(targets, shown_documents(view.information))
        for key, text in list(new.items()):  # evidence the store has no room for is left out, not tried
            if store.budget is not None and store.used + len(self._entry(key, text).split()) > store.budget:
                self._refused.add(key)
                del new[key]
        if self._last_target is not None and self._last_target not in self._lines | new:
            self._failed_terms.add(tuple(sorted(tokenize(self.queries[-1]))))
            self._misses[self._last_target] = self._misses.get(self._last_target, 0) + 1
        self._last_target = None
        missing = [key for key in targets if key not in self._lines and key not in new and key not in self._refused]
        self.evidence_complete = not missing
        if new and view.turns_left > 1:
            key, text = next(iter(new.items()))
            self._pending = (key, text)
            return format_tool_call("mem_add", self._entry(key, text))
        if missing and view.turns_left > 2:  # a search, then its add, then the answer
            choice = self._next_query(missing, targets, self._lines)
            if choice is not None:
                query, self._last_target = choice
                self.queries.append(query)
                return format_tool_call("search", query)
        self.supported = [self._supported(q, self._lines) for q in questions]
        answers = [q.answers[0] if ok else self.abstain_answer for q, ok in zip(questions, self.supported)]
        return format_tool_call("answer", "; ".join(answers))


def _entry_text(title: str, text: str) -> str:
    """A document as rag stores it: its fact sentences (the reader's), else ``Title: text``."""
    facts = [s for s in sentences(text) if parse_fact(s) is not None]
    return " ".join(facts) if facts else f"{title}: {text}"


class QAToolRagPolicy(ScriptedPolicy):
    """Store everything, answer from ``<mem_search>`` hits (see the module docstring)."""

    name = "rag"
    context = "memory"
    env_kwargs = {"memory_mode": "tools"}

    def reset(self, env: Any = None) -> None:
        self._queue: list[str] = []  # entries still to add from the newest search result
        self._stored: set[str] = set()  # texts added (a document found twice is stored once)
        self._ids: list[int] = []  # entry ids, oldest first
        self._pending: str | None = None
        self._known: dict[int, str] = {}  # what store searches returned: id -> text
        self._last: tuple[str, str] | None = None  # the previous call (tool, argument)
        self._store_searched: set[str] = set()  # queries searched in the store since it last changed
        self._corpus_searched: set[str] = set()

    def act(self, observation: str) -> str:
        view = read_observation(observation)
        tools = read_tool_observation(observation)
        tool, argument = self._last or (None, "")
        if tool == "search" and not tools.result:
            self._queue = [t for t in (_entry_text(*d) for d in shown_documents(view.information))
                           if t not in self._stored]
        elif tool == "mem_add" and self._pending is not None:
            added = added_entry(tools.result)
            if added:
                self._ids.append(added[0])
                self._stored.add(self._pending)
                self._store_searched.clear()
        elif tool == "mem_delete":
            self._known.pop(self._ids.pop(0), None)
        elif tool == "mem_search":
            self._known.update(result_entries(tools.result))
        self._pending = None
        if self._queue and view.turns_left > 1:
            text = self._queue[0]
            if tools.budget is not None and self._ids and tools.used + len(text.split()) > tools.budget:
                return self._call("mem_delete", entry_id=self._ids[0])  # oldest out
            self._pending = self._queue.pop(0)
            return self._call("mem_add", self._pending)
        self._queue = []
        known = "\n".join(self._known[i] for i in sorted(self._known))
        decision, argument, _ = self._decide(view.questions, known, view.turns_left)
        if decision == "search" and argument not in self._store_searched:
            self._store_searched.add(argument)
            return self._call("mem_search", argument)
        if decision == "search" and argument not in self._corpus_searched and view.turns_left > 2:
            self._corpus_searched.add(argument)
            return self._call("search", argument)
        if decision == "search":  # nothing new to try: answer with what is known
            decision, argument, _ = self._decide(view.questions, known, 1)
        return self._call("answer", argument)

    def _call(self, tool: str, argument: str = "", entry_id: int | None = None) -> str:
        self._last = (tool, argument)
        return format_tool_call(tool, argument, entry_id)


QA_TOOL_STRATEGIES: dict[str, Callable[[], ScriptedPolicy]] = {
    "oracle": QAToolOraclePolicy,
    "rag": QAToolRagPolicy,
}

STRATEGY_FAMILIES["MemQA:tools"] = QA_TOOL_STRATEGIES
