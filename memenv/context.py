"""Context modes, token counting and the context budget.

The observation is built from a *task block* (always first) and a *body* (memory and tool results, or the
transcript). ``context_budget`` left-truncates the body like a sliding context window; the task block is
always kept whole, as chat systems keep the system prompt. The body keeps at least its newest ``min_body``
tokens, so an observation exceeds the budget only when the task block alone leaves less room than that; the
envs rule this out at make time for the fixed part of the task block (instructions and question headers, see
:meth:`memenv.envs.base.MemEnvBase._check_context_budget`), and ``context_tokens`` always reports the true size.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Callable

from memenv.validation import ArgumentTypeError

TokenCounter = Callable[[str], int]
_WORD = re.compile(r"\S+")

# Every character a real document or a model may produce, minus control characters and surrogates; text
# outside it (astral-plane emoji, NUL, ...) is replaced by U+FFFD before it reaches an observation.
_CHARSET_RANGES = ((0x20, 0x7F), (0xA0, 0xD800), (0xE000, 0xFFFE))
CHARSET = "\t\n" + "".join(chr(c) for lo, hi in _CHARSET_RANGES for c in range(lo, hi))
_OUTSIDE_CHARSET = re.compile("[^\t\n\x20-\x7e\xa0-\ud7ff\ue000-\ufffd]")


def sanitize(text: str) -> str:
    """``text`` with every character outside :data:`CHARSET` replaced by U+FFFD."""
    return _OUTSIDE_CHARSET.sub("\ufffd", text)


# Texts are counted and cut in pieces of this many characters, so a huge text never becomes a list of all its
# words (a 50 MB text is ~8M words: ~500 MB of small strings).
_PIECE = 1 << 16
_WINDOW = 4096  # the first window of _last_word_starts (characters)


def count_words(text: str) -> int:
    """The default token counter: whitespace-separated words (``len(text.split())``), counted piece by piece."""
    if len(text) <= _PIECE:
        return len(text.split())
    total = 0
    for start in range(0, len(text), _PIECE):
        total += len(text[start:start + _PIECE].split())
        # a word across the cut is counted on both sides
        if start and not text[start - 1].isspace() and not text[start].isspace():
            total -= 1
    return total


def _last_word_starts(text: str, k: int) -> list[int]:
    """Where the last ``k`` words of ``text`` start, newest first (fewer when ``text`` has fewer words).
    Scans back from the end in growing windows: O(characters scanned) time, O(k) memory."""
    found: list[int] = []  # word starts, newest first
    end, window = len(text), max(_WINDOW, 16 * k)
    while end > 0:
        start = max(0, end - window)
        starts = [m.start() for m in _WORD.finditer(text, start, end)]
        if starts and start > 0 and starts[0] == start and not text[start - 1].isspace():
            starts.pop(0)  # a word cut by the window's edge: its start lies further back
        found.extend(reversed(starts))
        if len(found) >= k:
            return found[:k]
        end, window = start, window * 2
    return found


@dataclass(frozen=True)
class ContextMode:
    """``memory`` (task + memory + newest result), ``history`` (whole transcript), ``window`` (last K turns
    of the transcript) or ``none`` (task + newest result, nothing remembered)."""

    name: str
    window: int = 0

    @classmethod
    def parse(cls, spec: str) -> "ContextMode":
        if not isinstance(spec, str):
            raise ArgumentTypeError(f"context must be a string like 'memory', 'history', 'window:K' or 'none', "
                                    f"got {spec!r} ({type(spec).__name__})")
        if spec in ("memory", "history", "none"):
            return cls(spec)
        if spec.startswith("window:"):
            try:
                k = int(spec.split(":", 1)[1])
            except ValueError:
                k = 0
            if k >= 1:
                return cls("window", k)
        raise ValueError(f"unknown context mode context={spec!r}: use 'memory', 'history', 'window:K' (K >= 1) or 'none'")

    @property
    def uses_memory(self) -> bool:
        """Whether the policy must rewrite an explicit memory each turn."""
        return self.name == "memory"

    @property
    def keeps_transcript(self) -> bool:
        return self.name in ("history", "window")


def truncate_left(text: str, budget: int, counter: TokenCounter | None = None) -> tuple[str, int]:
    """Keep the end of ``text`` within ``budget`` tokens, cutting at a word boundary.

    Returns the kept text and the number of tokens dropped. With a custom ``counter`` the cut point is
    found by binary search over word starts (O(log n) counter calls).
    """
    if budget <= 0:
        return "", (counter or count_words)(text)
    if counter is None:
        starts = _last_word_starts(text, budget + 1)
        if len(starts) <= budget:
            return text, 0
        return text[starts[budget - 1]:], count_words(text) - budget
    total = counter(text)
    if total <= budget:
        return text, 0
    starts = [m.start() for m in _WORD.finditer(text)]
    lo, hi = 0, len(starts)  # find the smallest word index whose suffix fits
    while lo < hi:
        mid = (lo + hi) // 2
        if counter(text[starts[mid]:]) <= budget:
            hi = mid
        else:
            lo = mid + 1
    kept = text[starts[lo]:] if lo < len(starts) else ""
    return kept, total - counter(kept)


def truncate_right(text: str, budget: int, counter: TokenCounter | None = None) -> tuple[str, int]:
    """Keep the *start* of ``text`` within ``budget`` tokens, cutting at a word boundary (whitespace inside
    the kept part, newlines included, is preserved). Returns the kept text and the number of tokens dropped."""
    count = counter or count_words
    if counter is None:
        ends = [m.end() for m in itertools.islice(_WORD.finditer(text), max(budget, 0) + 1)]
        if len(ends) <= budget:
            return text, 0
        return (text[:ends[budget - 1]] if budget > 0 else ""), count_words(text) - max(budget, 0)
    ends = [m.end() for m in _WORD.finditer(text)]
    total = count(text)
    if total <= budget:
        return text, 0
    lo, hi = 0, len(ends)  # the largest number of words whose prefix fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:ends[mid - 1]]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    kept = text[:ends[lo - 1]] if lo > 0 else ""
    return kept, total - count(kept)


def fit_context(task_block: str, body: str, budget: int | None, counter: TokenCounter | None = None,
                min_body: int = 0) -> tuple[str, int, int]:
    """Join task block and body under ``budget``; returns (text, context_tokens, truncated_tokens).

    The task block is never cut (the questions must stay visible); the body keeps its newest tokens, at least
    ``min_body`` of them even when that overflows the budget (``context_tokens`` then exceeds ``budget``).
    """
    count = counter or count_words
    task_tokens = count(task_block)
    if budget is None:
        return task_block + body, task_tokens + count(body), 0
    available = max(budget - task_tokens, min_body)
    if available <= 0:  # the task block fills the whole window: it alone is shown
        return task_block, task_tokens, count(body)
    kept, dropped = truncate_left(body, available, counter)
    marker = "\n[…] "  # on its own line, so it never merges with the task block's last word
    if dropped and count(marker) < available:  # mark the cut, keeping the marker itself inside the budget
        kept, dropped = truncate_left(body, available - count(marker), counter)
        kept = marker + kept
    return task_block + kept, task_tokens + count(kept), dropped
