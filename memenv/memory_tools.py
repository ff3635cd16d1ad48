"""Memory tools: the agent's memory as a store of entries it edits and searches with tool calls.

The single-rewrite protocol (:mod:`memenv.protocol`) replaces the whole memory text each turn. In the tools
protocol the memory is a :class:`MemoryStore` of numbered entries under a token budget, and each action is
exactly one tool call (optionally after one ``<think>…</think>``)::

    <mem_add>TEXT</mem_add>              add an entry; the result names its id ("added entry 7 (12 tokens)")
    <mem_update id=N>TEXT</mem_update>   replace entry N's text
    <mem_delete id=N/>                   delete entry N
    <mem_search>QUERY</mem_search>       BM25 (memenv.search.bm25) over the entries: the best k as "[N] text"
    <search>QUERY</search>               search the env's document collection (MemQA)
    <next/>                              done with this session: show the next one
    <answer>TEXT</answer>                answer the question shown
    <strategy>TEXT</strategy>            rewrite the memory-strategy text (cross-episode refinement)

Each tool call is one invocation (one env step, one snapshot in ``info["invocation"]`` with ``tool`` set to
the call's name), so records and distillation treat it like any other turn. Parsing never raises: a
malformed call, an unknown id, an empty text or an entry that would overflow the budget comes back as an
error message, the store unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from memenv.context import count_words
from memenv.protocol import action_too_long
from memenv.search.bm25 import make_backend

__all__ = ["MEMORY_MODES", "STORE_TOOLS", "TOOL_NAMES", "MemoryStore", "StoreError", "ToolCall", "check_tools_context",
           "format_tool_call", "parse_tool_call", "run_store_call"]

#: ``memory_mode=`` of the envs that offer both protocols: one memory rewrite per action, or the store's tools.
MEMORY_MODES = ("rewrite", "tools")
#: The calls that act on the store itself (:func:`run_store_call`); the others are the env's own.
STORE_TOOLS = ("mem_add", "mem_update", "mem_delete", "mem_search")
TOOL_NAMES = (*STORE_TOOLS, "search", "next", "answer", "strategy")
_THINK = re.compile(r"\s*<think>.*?</think>", re.DOTALL)
_CALLS = {
    "mem_add": re.compile(r"<mem_add>(.*)</mem_add>", re.DOTALL),
    "mem_update": re.compile(r"<mem_update\s+id\s*=\s*\"?(\w+)\"?\s*>(.*)</mem_update>", re.DOTALL),
    "mem_delete": re.compile(r"<mem_delete\s+id\s*=\s*\"?(\w+)\"?\s*/>"),
    "mem_search": re.compile(r"<mem_search>(.*)</mem_search>", re.DOTALL),
    "search": re.compile(r"<search>(.*)</search>", re.DOTALL),
    "next": re.compile(r"<next\s*/>"),
    "answer": re.compile(r"<answer>(.*)</answer>", re.DOTALL),
    "strategy": re.compile(r"<strategy>(.*)</strategy>", re.DOTALL),
}
_OPENING = re.compile(r"<(mem_add|mem_update|mem_delete|mem_search|next|answer|strategy|memory|search)\b")


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call: ``name`` (one of :data:`TOOL_NAMES`), ``argument`` (text or query), ``entry_id``."""

    name: str | None = None
    argument: str = ""
    entry_id: int | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def parse_tool_call(text: object, allowed: tuple[str, ...] = TOOL_NAMES) -> ToolCall:
    """Parse one action of the tools protocol; ``allowed`` are the calls valid at this point of the episode."""
    usage = " or ".join(_usage(name) for name in allowed)
    if not isinstance(text, str):
        return ToolCall(error=f"action must be a string, got {type(text).__name__}")
    too_long = action_too_long(text)  # over the action space: refused unread, whatever its size
    if too_long:
        return ToolCall(error=too_long)
    body = text
    think = _THINK.match(body)
    if think:
        body = body[think.end():]
    body = body.strip()
    if not body:
        return ToolCall(error=f"empty action: expected one tool call: {usage}")
    for name, pattern in _CALLS.items():
        match = pattern.fullmatch(body)
        if match is None:
            continue
        if match.groups() and f"</{name}>" in match.group(match.lastindex):  # two calls glued together
            break
        if name not in allowed:
            return ToolCall(error=f"<{name}> is not available now; use {usage}")
        if name in ("mem_update", "mem_delete"):
            raw_id = match.group(1)
            if not raw_id.isdigit():
                return ToolCall(error=f"<{name}>: id must be a non-negative integer, got {raw_id!r}")
            argument = match.group(2).strip() if name == "mem_update" else ""
            if name == "mem_update" and not argument:
                return ToolCall(error="<mem_update>: empty text (use <mem_delete id=N/> to remove an entry)")
            return ToolCall(name, argument, int(raw_id))
        argument = match.group(1).strip() if match.groups() else ""
        if name in ("mem_add", "mem_search", "search") and not argument:
            return ToolCall(error=f"<{name}>: empty {'text' if name == 'mem_add' else 'query'}")
        return ToolCall(name, argument)
    opened = _OPENING.findall(body)
    if len(opened) > 1:
        return ToolCall(error=f"exactly one tool call per action, got {len(opened)}: "
                        + ", ".join(f"<{n}>" for n in opened))
    if opened:
        return ToolCall(error=f"malformed <{opened[0]}> call: expected {_usage(opened[0]) if opened[0] in _CALLS else usage}")
    snippet = " ".join(body.split())[:40]
    return ToolCall(error=f"text outside the tool tags: {snippet!r}; expected {usage}")


def _usage(name: str) -> str:
    return {"mem_add": "<mem_add>text</mem_add>", "mem_update": "<mem_update id=N>text</mem_update>",
            "mem_delete": "<mem_delete id=N/>", "mem_search": "<mem_search>query</mem_search>",
            "search": "<search>query</search>",
            "next": "<next/>", "answer": "<answer>text</answer>", "strategy": "<strategy>text</strategy>"}[name]


def format_tool_call(name: str, argument: str = "", entry_id: int | None = None) -> str:
    """The canonical text of a tool call (what scripted agents emit)."""
    if name == "mem_update":
        return f"<mem_update id={entry_id}>{argument}</mem_update>"
    if name == "mem_delete":
        return f"<mem_delete id={entry_id}/>"
    if name == "next":
        return "<next/>"
    return f"<{name}>{argument}</{name}>"


def check_tools_context(memory_mode: str, uses_memory: bool, context: str) -> None:
    """The tools protocol shows the store in the ``<memory>`` block: refuse it with other context modes."""
    if memory_mode == "tools" and not uses_memory:
        raise ValueError(f"memory_mode='tools' needs context='memory', got context={context!r}; "
                         "use memory_mode='rewrite' with other context modes")


class StoreError(ValueError):
    """A tool call the store refuses (unknown id, over budget); the message is shown to the agent."""


class MemoryStore:
    """Numbered text entries under a token budget, searchable with BM25 (:func:`memenv.search.make_backend`).

    Ids are never reused within an episode. The BM25 index is rebuilt lazily, on the first search after a
    change, so a run of adds costs nothing until the agent searches.
    """

    def __init__(self, budget: int | None = None, counter: Callable[[str], int] | None = None,
                 backend: str = "bm25") -> None:
        self.budget = budget
        self.count = counter or count_words
        self.backend = backend
        self.entries: dict[int, str] = {}
        self._tokens: dict[int, int] = {}
        self.used = 0
        self._next_id = 1
        self._index = None
        self._index_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.entries)

    def _check_room(self, extra: int) -> None:
        if self.budget is not None and self.used + extra > self.budget:
            raise StoreError(f"store full: {self.used}/{self.budget} tokens used, this needs {extra} more; "
                             "delete or shorten entries first")

    def add(self, text: str) -> int:
        tokens = self.count(text)
        self._check_room(tokens)
        entry_id = self._next_id
        self._next_id += 1
        self.entries[entry_id], self._tokens[entry_id] = text, tokens
        self.used += tokens
        self._index = None
        return entry_id

    def _known(self, entry_id: int) -> None:
        if entry_id not in self.entries:
            ids = list(self.entries)
            listing = f"ids {ids[0]}..{ids[-1]}" if ids else "the store is empty"
            raise StoreError(f"no entry {entry_id} ({listing})")

    def update(self, entry_id: int, text: str) -> None:
        self._known(entry_id)
        tokens = self.count(text)
        self._check_room(tokens - self._tokens[entry_id])
        self.used += tokens - self._tokens[entry_id]
        self.entries[entry_id], self._tokens[entry_id] = text, tokens
        self._index = None

    def delete(self, entry_id: int) -> None:
        self._known(entry_id)
        self.used -= self._tokens.pop(entry_id)
        del self.entries[entry_id]
        self._index = None

    def search(self, query: str, k: int) -> list[int]:
        """Ids of the at most ``k`` best entries for ``query``, best first; entries sharing no term are not returned.

        BM25 (Okapi, :class:`memenv.search.BM25Sparse`) ranks first. Okapi's idf is 0 or negative for a term in
        half or more of the entries, so in a tiny store a real match can score <= 0: entries that share a query
        term but score <= 0 follow the positive ones, by the number of query terms they share (then oldest first).
        """
        if not self.entries:
            return []
        if self._index is None:
            self._index_ids = list(self.entries)
            self._index = make_backend(self.backend, [self.entries[i] for i in self._index_ids])
        index = self._index
        scores = index.scores(query)
        shared = np.zeros(len(scores), dtype=np.int64)
        indptr, indices = index.matrix.indptr, index.matrix.indices
        for term in set(index.tokenizer(query)):
            row = index.vocab.get(term)
            if row is not None:
                shared[indices[indptr[row]:indptr[row + 1]]] += 1
        candidates = np.flatnonzero(shared > 0)
        positive = scores[candidates] > 0
        # lexsort: the last key sorts first: positives first, then score, then shared terms, then oldest
        order = np.lexsort((candidates, -shared[candidates], -np.where(positive, scores[candidates], 0.0), ~positive))
        return [self._index_ids[int(d)] for d in candidates[order[:k]]]

    def summary(self) -> str:
        budget = "no limit" if self.budget is None else str(self.budget)
        return f"[store: {len(self.entries)} entries, {self.used}/{budget} tokens]"

    def render(self, ids: list[int] | None = None) -> str:
        """``[N] text`` lines for ``ids`` (default: every entry, oldest first)."""
        ids = list(self.entries) if ids is None else ids
        return "\n".join(f"[{i}] {self.entries[i]}" for i in ids)

    def view(self, show_entries: bool) -> str:
        """What an observation's ``<memory>`` block shows: the store's size, then (``show_entries``) every entry."""
        return self.summary() + ("\n" + self.render() if show_entries and self.entries else "")


def run_store_call(store: MemoryStore, call: ToolCall, k: int, clean: Callable[[str], str] = str) -> tuple[str, dict]:
    """Apply a valid store call (one of :data:`STORE_TOOLS`) to ``store``: ``(tool output, invocation keys)``.

    The keys are ``entry_id`` (the entry added, updated or deleted) or ``retrieved_ids`` (a search's hits,
    best first). ``clean`` is applied to stored and shown text (envs pass :func:`memenv.envs.base.sanitize`). Raises
    :class:`StoreError` (store unchanged) for an unknown id or an entry over the budget.
    """
    if call.name == "mem_add":
        entry_id = store.add(clean(call.argument))
        return f"added entry {entry_id} ({store._tokens[entry_id]} tokens)", {"entry_id": entry_id}
    if call.name == "mem_update":
        store.update(call.entry_id, clean(call.argument))
        return f"updated entry {call.entry_id}", {"entry_id": call.entry_id}
    if call.name == "mem_delete":
        store.delete(call.entry_id)
        return f"deleted entry {call.entry_id}", {"entry_id": call.entry_id}
    if call.name == "mem_search":
        ids = store.search(call.argument, k)
        return (clean(store.render(ids)) if ids else "no matching entry"), {"retrieved_ids": ids}
    raise ValueError(f"run_store_call: <{call.name}> is not a store call ({', '.join(STORE_TOOLS)})")
