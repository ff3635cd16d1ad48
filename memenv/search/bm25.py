"""Lexical search backends for the environments' ``<search>`` tool.

Two BM25 backends share one tokeniser and one ranking rule:

* :class:`BM25Sparse` (name ``"bm25"``, the default) precomputes every (term, document) BM25 weight in a
  ``scipy.sparse`` CSR matrix, so a query costs one row slice per query term plus a top-k selection.
* :class:`BM25Reference` (name ``"rank_bm25"``) wraps :class:`rank_bm25.BM25Okapi`; it is slow (a Python loop
  over every document per query term) and exists as the ground truth the fast backend is checked against.

``BM25Sparse`` reproduces ``BM25Okapi`` operation for operation (same idf, same epsilon floor, same
arithmetic order, repeated query terms counted each time), so both backends give bit-identical scores on
the same tokenisation, and therefore identical rankings, ties included.

Example::

    backend = make_backend("bm25", ["Paris is the capital of France", "Berlin is in Germany"])
    backend.search("capital France", k=3)   # -> [0]
"""

from __future__ import annotations

import abc
import math
import numbers
import re
import unicodedata
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import numpy as np
import scipy.sparse as sp

from memenv.validation import ArgumentTypeError

__all__ = [
    "BACKENDS",
    "STOPWORDS",
    "BM25Reference",
    "BM25Sparse",
    "SearchBackend",
    "Tokenizer",
    "check_bm25_params",
    "make_backend",
    "okapi_doc_norm",
    "okapi_idf",
    "okapi_weights",
    "tokenize",
]

Tokenizer = Callable[[str], list[str]]

#: Small fixed English stopword set. Kept deliberately short: question words like "what"/"who" carry no
#: lexical signal in retrieval, but content words must never be dropped.
STOPWORDS: frozenset[str] = frozenset(
    "the a an of in on and or is was to for by with at from as that this what which who whom whose "
    "did does do be are were it its".split()
)

_TOKEN_RE = re.compile(r"[a-z0-9]+")
#: ASCII bytes -> themselves for [a-z0-9] (after lower()), a space for every other byte: on ASCII text
#: ``lower().translate(...).split()`` gives exactly the runs of [a-z0-9] (what _TOKEN_RE finds), ~2x faster.
_ASCII_TOKEN_BYTES = bytes(c if chr(c).isascii() and (chr(c).islower() or chr(c).isdigit()) else 0x20
                           for c in range(256))


def word_tokens(text: str) -> list[str]:
    """:func:`tokenize` before its stopword filter: every run of ``[a-z0-9]`` of the folded text."""
    if text.isascii():
        # Fast path (most corpus text): NFKD is the identity on ASCII and casefold equals lower.
        return text.encode("ascii").lower().translate(_ASCII_TOKEN_BYTES).decode("ascii").split()
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    # Combining marks are what NFKD splits accents into; removing them strips the accents.
    return _TOKEN_RE.findall("".join(ch for ch in decomposed if not unicodedata.combining(ch)))


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase ASCII alphanumeric tokens, without stopwords.

    Steps: case-fold (a superset of ``lower()``; e.g. "ß" -> "ss"), NFKD-normalise and drop combining
    marks so accented and unaccented spellings match ("Café" -> "cafe"), then take the runs of
    ``[a-z0-9]`` and drop :data:`STOPWORDS`. Characters outside Latin script after decomposition
    produce no tokens.

    >>> tokenize("What is the Café of Zoë's 2nd-floor?")
    ['cafe', 'zoe', 's', '2nd', 'floor']
    """
    return [tok for tok in word_tokens(text) if tok not in STOPWORDS]


class SearchBackend(abc.ABC):
    """A ranked retriever over a fixed list of document texts.

    Subclasses implement :meth:`_build` (index the tokenised corpus) and :meth:`scores`; the ranking rule
    lives here so every backend ranks identically given identical scores:

    * documents are sorted by score, descending; ties go to the lower document index;
    * only documents with score > 0 are returned, so a query with no known term returns ``[]`` and
      ``k`` larger than the number of matches returns fewer than ``k`` indices.
    """

    def __init__(self, texts: Sequence[str], tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else tokenize
        docs = list(texts)
        for i, doc in enumerate(docs):
            if not isinstance(doc, str):
                raise TypeError(f"document {i} is {type(doc).__name__}, expected str")
        self._n_docs = len(docs)
        self._build([self.tokenizer(doc) for doc in docs])

    @abc.abstractmethod
    def _build(self, corpus: list[list[str]]) -> None:
        """Index the tokenised corpus (one token list per document, in document order)."""

    @abc.abstractmethod
    def scores(self, query: str) -> np.ndarray:
        """Score every document for ``query``: a new float64 array of length ``len(self)``."""

    def __len__(self) -> int:
        return self._n_docs

    def search(self, query: str, k: int) -> list[int]:
        """Return the indices of the at most ``k`` best documents for ``query``, best first."""
        return self.rank(self.scores(query), k)

    @staticmethod
    def rank(scores: np.ndarray, k: int) -> list[int]:
        """Apply the shared ranking rule to a score vector (see the class docstring)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        scores = np.asarray(scores, dtype=np.float64).ravel()
        n = scores.size
        if k == 0 or n == 0:
            return []
        if k < n:
            # Select the k-th best score in O(n) and keep every document scoring at least that much, so
            # ties straddling the cut are settled by the index rule below, not by selection order.
            # np.partition is the value-only sibling of np.argpartition (no index array to build). It
            # selects from the front of the negated scores: numpy's introselect degrades ~15x when
            # selecting near the *end* of an array full of equal values (the zeros of unmatched docs).
            kth = -np.partition(-scores, k - 1)[k - 1]
            keep = scores >= kth if kth > 0 else scores > 0
        else:
            keep = scores > 0
        candidates = np.flatnonzero(keep)
        cand_scores = scores[candidates]
        # lexsort sorts by the last key first: score descending, then doc index ascending.
        order = np.lexsort((candidates, -cand_scores))
        return [int(i) for i in candidates[order[:k]]]


def okapi_idf(df: np.ndarray, n_docs: int, epsilon: float) -> tuple[np.ndarray, float]:
    """BM25Okapi's idf per term (``df`` in the order terms first appear) and its ``average_idf``.

    ``idf = log(N - n + 0.5) - log(n + 0.5)``; strictly negative idfs become ``epsilon * average_idf``, where
    ``average_idf`` is the mean raw idf. Computed with ``math.log`` and a sequential sum, as BM25Okapi does:
    numpy's vectorised log and pairwise summation may differ in the last bit, which could reorder ties.
    """
    idf_list = [math.log(n_docs - int(n) + 0.5) - math.log(int(n) + 0.5) for n in df]
    idf_sum = 0.0
    for value in idf_list:
        idf_sum += value
    average_idf = idf_sum / len(idf_list) if idf_list else 0.0
    idf = np.asarray(idf_list, dtype=np.float64)
    idf[idf < 0] = epsilon * average_idf  # strictly negative only, as BM25Okapi (an idf of exactly 0 stays 0)
    return idf, average_idf


def okapi_doc_norm(doc_len: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """Per-document ``k1 * (1 - b + b * dl / avgdl)``, evaluated as BM25Okapi.get_scores does (Python's
    order: ``(1 - b) + ((b * dl) / avgdl)``), so weights built from it are bit-identical to its scores."""
    return k1 * ((1 - b) + (b * np.asarray(doc_len, dtype=np.int64)) / avgdl)


def okapi_weights(idf: np.ndarray, tf: np.ndarray, doc_norm: np.ndarray, k1: float) -> np.ndarray:
    """BM25 weights ``idf * (tf * (k1 + 1) / (tf + doc_norm))``, element by element, in BM25Okapi's order."""
    tf_f = np.asarray(tf, dtype=np.float64)
    return idf * (tf_f * (k1 + 1) / (tf_f + doc_norm))


def check_bm25_params(k1: Any, b: Any, epsilon: Any = 0.25) -> tuple[float, float, float]:
    """``(k1, b, epsilon)`` as floats if they are valid BM25 Okapi parameters: finite, ``k1 > 0``,
    ``0 <= b <= 1``, ``epsilon >= 0``; else a ``ValueError`` (:class:`~memenv.validation.ArgumentTypeError`,
    also a ``TypeError``, for a non-number) naming the one that is not."""
    out = []
    for name, value, ok, rule in (("k1", k1, lambda v: v > 0, "> 0"), ("b", b, lambda v: 0 <= v <= 1, "in [0, 1]"),
                                  ("epsilon", epsilon, lambda v: v >= 0, ">= 0")):
        expected = f"BM25 parameter {name} must be a finite number {rule}"
        if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
            raise ArgumentTypeError(f"{expected}, got {value!r} ({type(value).__name__})")
        if not (math.isfinite(value) and ok(value)):
            raise ValueError(f"{expected}, got {value!r}")
        out.append(float(value))
    return out[0], out[1], out[2]


class _OkapiBackend(SearchBackend):
    """Shared BM25 Okapi parameters (``rank_bm25.BM25Okapi``'s defaults)."""

    def __init__(
        self,
        texts: Sequence[str],
        tokenizer: Tokenizer | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        epsilon: float = 0.25,
    ) -> None:
        self.k1, self.b, self.epsilon = check_bm25_params(k1, b, epsilon)
        super().__init__(texts, tokenizer)


class BM25Reference(_OkapiBackend):
    """Reference backend: :class:`rank_bm25.BM25Okapi` on :func:`tokenize`'d text (slow, for checking)."""

    def _build(self, corpus: list[list[str]]) -> None:
        from rank_bm25 import BM25Okapi

        # BM25Okapi divides by the corpus and vocabulary sizes, so it cannot index a corpus without a
        # single token; such a corpus simply matches nothing. The corpus is passed pre-tokenised: giving
        # BM25Okapi a tokenizer would make it start a multiprocessing Pool.
        has_terms = any(corpus)
        self._bm25 = BM25Okapi(corpus, k1=self.k1, b=self.b, epsilon=self.epsilon) if has_terms else None

    def scores(self, query: str) -> np.ndarray:
        if self._bm25 is None:
            return np.zeros(len(self), dtype=np.float64)
        return np.asarray(self._bm25.get_scores(self.tokenizer(query)), dtype=np.float64)


class BM25Sparse(_OkapiBackend):
    """Fast BM25 (Okapi, as :class:`rank_bm25.BM25Okapi`) over a precomputed term x document CSR matrix.

    Entry (t, d) holds ``idf(t) * tf*(k1+1) / (tf + k1*(1 - b + b*|d|/avgdl))``; a query's score is the sum
    of its terms' rows, a term repeated in the query counting once per occurrence. ``idf(t) =
    log(N - n_t + 0.5) - log(n_t + 0.5)``; negative idfs are replaced by ``epsilon * average_idf``, where
    ``average_idf`` is the mean *raw* idf over all corpus terms.

    Attributes set after construction: ``vocab`` (term -> row), ``idf`` (float64 per row, after the
    epsilon floor), ``average_idf``, ``avgdl``, ``doc_len`` (int64 per doc) and ``matrix`` (the CSR).
    """

    def _build(self, corpus: list[list[str]]) -> None:
        n_docs = len(corpus)
        # Term ids in order of first appearance: that is the iteration order of BM25Okapi's document
        # frequency dict, so summing the idfs in row order reproduces its average_idf to the last bit.
        # (dict.fromkeys and map keep these passes over every corpus token at C speed.)
        vocab = {term: i for i, term in enumerate(dict.fromkeys(chain.from_iterable(corpus)))}
        term_ids = list(map(vocab.__getitem__, chain.from_iterable(corpus)))
        doc_len = np.fromiter(map(len, corpus), dtype=np.int64, count=n_docs)
        self.vocab: dict[str, int] = vocab
        self.doc_len = doc_len
        n_terms = len(vocab)
        total = int(doc_len.sum())
        self.avgdl = total / n_docs if n_docs else 0.0

        if n_terms == 0:
            self.idf = np.zeros(0, dtype=np.float64)
            self.average_idf = 0.0
            self.matrix = sp.csr_matrix((0, n_docs), dtype=np.float64)
            self._set_postings()
            return

        # Term frequencies of each (term, doc) pair: unique keys sorted by term, then doc, which is
        # exactly CSR order (rows = terms, columns ascending).
        tids = np.asarray(term_ids, dtype=np.int64)
        dids = np.repeat(np.arange(n_docs, dtype=np.int64), doc_len)
        keys, tf = np.unique(tids * n_docs + dids, return_counts=True)
        rows, cols = np.divmod(keys, n_docs)
        df = np.bincount(rows, minlength=n_terms)

        self.idf, self.average_idf = okapi_idf(df, n_docs, self.epsilon)
        weights = okapi_weights(self.idf[rows], tf, okapi_doc_norm(doc_len, self.avgdl, self.k1, self.b)[cols],
                                self.k1)

        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        self.matrix = sp.csr_matrix((weights, cols, indptr), shape=(n_terms, n_docs))
        self._set_postings()

    def _set_postings(self) -> None:
        # Query-time views of the CSR: row bounds as Python ints (cheap to index from Python) and column
        # indices as int64 (scipy may downcast to int32, which numpy scatters ~2x slower).
        self._indptr: list[int] = self.matrix.indptr.tolist()
        self._indices: np.ndarray = self.matrix.indices.astype(np.int64)

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(len(self), dtype=np.float64)
        indptr, indices, data = self._indptr, self._indices, self.matrix.data
        # Accumulate row by row in query order rather than with a sparse mat-vec: that is the summation
        # order of BM25Okapi, so scores match bit for bit and exact ties stay exact. np.add.at adds each
        # posting once, in order (indices within a row are unique); with int64 indices it is the fastest
        # numpy scatter-add (int32 fancy indexing is ~2x slower). Unknown terms contribute nothing.
        for tok in self.tokenizer(query):
            tid = self.vocab.get(tok)
            if tid is not None:
                start, stop = indptr[tid], indptr[tid + 1]
                np.add.at(out, indices[start:stop], data[start:stop])
        return out


#: Backend registry used by :func:`make_backend` (and by env kwargs that take a backend name).
BACKENDS: dict[str, type[SearchBackend]] = {
    "bm25": BM25Sparse,
    "rank_bm25": BM25Reference,
}


def make_backend(name: str, texts: Sequence[str], **kw: Any) -> SearchBackend:
    """Build the backend registered as ``name`` over ``texts``; ``kw`` goes to its constructor.

    ``"bm25"`` is the fast sparse backend (the default elsewhere), ``"rank_bm25"`` the reference.
    Raises ``ValueError`` naming the valid backends for an unknown name.
    """
    try:
        cls = BACKENDS[name]
    except (KeyError, TypeError):
        valid = ", ".join(repr(n) for n in BACKENDS)
        raise ValueError(f"unknown search backend {name!r}; valid names: {valid}") from None
    return cls(texts, **kw)
