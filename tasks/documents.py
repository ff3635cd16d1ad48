"""Long documents for reading tasks (MemAgent style): gold paragraphs buried among distractor paragraphs.

A long document is a sequence of *paragraphs*, each one corpus document rendered as
``Doc <position> (Title: <title>) <text>`` (the same header as a MemQA search result, so one reader handles
both). The gold supporting documents of the episode's questions appear exactly once each, at random
positions; every other paragraph is a distractor drawn from the rest of the corpus, in successive random
permutations of it (so a distractor repeats only once the corpus is exhausted; a long document over a small
corpus repeats every distractor about ``doc_tokens / corpus_tokens`` times).

The document is never materialised. :func:`plan_long_document` draws a :class:`DocumentPlan`: the corpus
index of every paragraph (one ``int32`` each, about 15k for a million tokens) and the chunk table. Chunk
text is rendered on demand by :meth:`DocumentPlan.chunk_text`, so memory stays flat in the document length.

Chunking: a chunk packs whole paragraphs, in order, while they fit in ``chunk_tokens`` whitespace tokens; a
paragraph longer than a chunk gets chunks of its own, split at word boundaries, each piece repeating the
paragraph's header. Lengths are whitespace tokens throughout (``doc_tokens`` is the total over all chunks, at
least the requested length and at most one paragraph above it). A split paragraph is never split whole per
chunk: the plan scans it once, piece by piece, remembering where each piece starts, so reading a paragraph of
any length costs time linear in it (each chunk costs its own words).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tasks.types import Document

__all__ = [
    "READ_INSTRUCTIONS",
    "DocumentPlan",
    "paragraph_header",
    "plan_long_document",
    "token_counts",
]

READ_INSTRUCTIONS = (
    "You are reading a long document, one chunk at a time, to answer the questions below. You will not see a "
    "chunk again: after each chunk, rewrite your memory inside <memory>...</memory> (at most {budget}); it is "
    "all you keep. When the document is finished you will be asked to answer with "
    "<answer>answer 1; answer 2; ...</answer>, one answer per question, in order. You may answer earlier, which "
    "ends the episode."
)
READ_INSTRUCTIONS_NO_MEMORY = (
    "You are reading a long document, one chunk at a time, to answer the questions below. Reply with an empty "
    "action (or <think>...</think>) to read the next chunk. When the document is finished you will be asked to "
    "answer with <answer>answer 1; answer 2; ...</answer>, one answer per question, in order. You may answer "
    "earlier, which ends the episode."
)


def paragraph_header(position: int, title: str) -> str:
    """The header of paragraph ``position`` (1-based) in a long document."""
    return f"Doc {position} (Title: {title})"


def token_counts(documents: Sequence[Document]) -> tuple[np.ndarray, np.ndarray]:
    """Whitespace tokens of each document's header and text: ``(header_tokens, text_tokens)`` (int32).

    The position number in the header is always one token, so header lengths do not depend on positions.
    """
    header = np.fromiter((len(paragraph_header(1, d.title).split()) for d in documents), np.int32, len(documents))
    text = np.fromiter((len(d.text.split()) for d in documents), np.int32, len(documents))
    return header, text


@functools.lru_cache(maxsize=32)
def _words_pattern(n: int) -> re.Pattern:
    # ``\s`` is exactly ``str.isspace`` (what ``str.split()`` splits on); possessive, so words never split.
    return re.compile(r"(?:\s*+\S++){1,%d}" % n)


def skip_words(text: str, start: int, n: int) -> int:
    """The offset just past the next ``n`` whitespace-separated words of ``text`` from offset ``start`` (fewer
    if the text ends first; ``len(text)`` if no word is left). Costs the length of the span, not of the text."""
    match = _words_pattern(n).match(text, start)
    return match.end() if match else len(text)


@dataclass(frozen=True)
class DocumentPlan:
    """A long document as indices: what :func:`plan_long_document` draws.

    ``paragraphs[p]`` is the corpus index of paragraph ``p``; ``gold_positions[j]`` the paragraph position of
    ``gold_indices[j]``. Chunk ``c`` holds paragraphs ``chunk_start[c] .. chunk_end[c] - 1`` whole when
    ``chunk_piece[c] == -1``, else piece ``chunk_piece[c]`` (0-based) of the single paragraph
    ``chunk_start[c]``, whose text is split every ``piece_words[c]`` words.
    """

    paragraphs: np.ndarray
    gold_indices: np.ndarray
    gold_positions: np.ndarray
    chunk_start: np.ndarray
    chunk_end: np.ndarray
    chunk_piece: np.ndarray
    piece_words: np.ndarray
    chunk_tokens: int
    total_tokens: int
    # The split paragraph being read: position -> character offsets where its pieces start (as far as found).
    _piece_offsets: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_start)

    @property
    def n_paragraphs(self) -> int:
        return len(self.paragraphs)

    def chunk_of(self, position: int) -> int:
        """The (first) chunk that holds paragraph ``position``."""
        return int(np.searchsorted(self.chunk_end, position, side="right"))

    @property
    def gold_chunks(self) -> list[int]:
        """The chunk of each gold paragraph, in ``gold_indices`` order."""
        return [self.chunk_of(int(p)) for p in self.gold_positions]

    def chunk_text(self, c: int, documents: Sequence[Document]) -> str:
        """The text of chunk ``c`` (0-based): one paragraph per line."""
        if not 0 <= c < self.n_chunks:
            raise IndexError(f"chunk {c} out of range 0..{self.n_chunks - 1}")
        start, end, piece = int(self.chunk_start[c]), int(self.chunk_end[c]), int(self.chunk_piece[c])
        if piece >= 0:
            doc = documents[int(self.paragraphs[start])]
            words = self._piece_text(start, doc.text, piece, int(self.piece_words[c]))
            return f"{paragraph_header(start + 1, doc.title)} {words}"
        lines = []
        for p in range(start, end):
            doc = documents[int(self.paragraphs[p])]
            lines.append(f"{paragraph_header(p + 1, doc.title)} {doc.text}")
        return "\n".join(lines)

    def _piece_text(self, position: int, text: str, piece: int, width: int) -> str:
        """Words ``piece * width .. (piece + 1) * width - 1`` of ``text`` joined by single spaces, i.e.
        ``" ".join(text.split()[piece * width:(piece + 1) * width])`` without splitting the whole text: piece
        starts are found by scanning forward from the last one known (kept for one paragraph at a time), so
        reading the pieces in order scans the paragraph once."""
        if position not in self._piece_offsets:
            self._piece_offsets.clear()
        offsets = self._piece_offsets.setdefault(position, [0])
        while len(offsets) <= piece + 1:
            offsets.append(skip_words(text, offsets[-1], width))
        return " ".join(text[offsets[piece]:offsets[piece + 1]].split())

    def iter_chunks(self, documents: Sequence[Document]) -> Iterator[str]:
        """Every chunk's text, in order, one at a time."""
        for c in range(self.n_chunks):
            yield self.chunk_text(c, documents)


def _draw_distractors(rng: np.random.Generator, pool: np.ndarray, lengths: np.ndarray, need: int) -> np.ndarray:
    """Distractor corpus indices, in successive permutations of ``pool``, until ``need`` tokens are covered."""
    if need <= 0:
        return np.zeros(0, np.int32)
    if len(pool) == 0:
        raise ValueError("the corpus has no document left for distractors (every document is gold)")
    parts, total = [], 0
    while total < need:
        perm = pool[rng.permutation(len(pool))]
        cum = np.cumsum(lengths[perm], dtype=np.int64)
        if total + int(cum[-1]) >= need:
            k = int(np.searchsorted(cum, need - total, side="left")) + 1
            parts.append(perm[:k])
            total += int(cum[k - 1])
            break
        parts.append(perm)
        total += int(cum[-1])
    return np.concatenate(parts).astype(np.int32)


def plan_long_document(rng: np.random.Generator, header_tokens: np.ndarray, text_tokens: np.ndarray,
                       gold_indices: Sequence[int], doc_tokens: int, chunk_tokens: int) -> DocumentPlan:
    """Draw a long document of about ``doc_tokens`` tokens over a corpus with the given token counts.

    ``gold_indices`` (corpus indices, deduplicated keeping order) each appear exactly once, at uniformly
    random positions and in random order; distractors never repeat a gold document.
    """
    if doc_tokens < 1:
        raise ValueError(f"doc_tokens must be >= 1, got {doc_tokens}")
    if chunk_tokens < 16:
        raise ValueError(f"chunk_tokens must be >= 16, got {chunk_tokens}")
    n = len(text_tokens)
    gold = np.array(list(dict.fromkeys(int(i) for i in gold_indices)), dtype=np.int32)
    if len(gold) and (gold.min() < 0 or gold.max() >= n):
        raise ValueError("gold index outside the corpus")
    lengths = (header_tokens + text_tokens).astype(np.int64)
    is_gold = np.zeros(n, bool)
    is_gold[gold] = True
    pool = np.flatnonzero(~is_gold).astype(np.int32)
    distractors = _draw_distractors(rng, pool, lengths, int(doc_tokens) - int(lengths[gold].sum()))

    total_paragraphs = len(distractors) + len(gold)
    positions = np.sort(rng.choice(total_paragraphs, size=len(gold), replace=False)).astype(np.int64)
    order = rng.permutation(len(gold))
    paragraphs = np.empty(total_paragraphs, np.int32)
    slot = np.zeros(total_paragraphs, bool)
    slot[positions] = True
    paragraphs[positions] = gold[order]
    paragraphs[~slot] = distractors
    gold_positions = np.empty(len(gold), np.int64)
    gold_positions[order] = positions  # gold[j] sits at gold_positions[j]

    # Chunk table: one pass over the paragraph lengths (no text).
    starts, ends, pieces, widths = [], [], [], []
    total = 0
    cur_start, cur_tokens = 0, 0
    para_lengths = lengths[paragraphs].tolist()
    for p, size in enumerate(para_lengths):
        if size > chunk_tokens:
            if cur_tokens:
                starts.append(cur_start), ends.append(p), pieces.append(-1), widths.append(0)
            head = int(header_tokens[paragraphs[p]])
            width = max(1, chunk_tokens - head)
            words = size - head
            count = max(1, -(-words // width))
            for k in range(count):
                starts.append(p), ends.append(p + 1), pieces.append(k), widths.append(width)
            total += count * head + words
            cur_start, cur_tokens = p + 1, 0
        elif cur_tokens + size > chunk_tokens:
            starts.append(cur_start), ends.append(p), pieces.append(-1), widths.append(0)
            cur_start, cur_tokens = p, size
            total += size
        else:
            cur_tokens += size
            total += size
    if cur_tokens:
        starts.append(cur_start), ends.append(total_paragraphs), pieces.append(-1), widths.append(0)
    return DocumentPlan(
        paragraphs=paragraphs,
        gold_indices=gold,
        gold_positions=gold_positions,
        chunk_start=np.array(starts, np.int64),
        chunk_end=np.array(ends, np.int64),
        chunk_piece=np.array(pieces, np.int32),
        piece_words=np.array(widths, np.int32),
        chunk_tokens=int(chunk_tokens),
        total_tokens=int(total),
    )
