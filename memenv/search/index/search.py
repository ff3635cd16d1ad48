"""Searching a disk index: :class:`BM25Index` opens an index directory (memory-mapped, verified by
:mod:`memenv.search.index.verify`) and answers exact BM25 top-k queries by block-max pruning over document ranges,
or by the threshold algorithm on indexes built before the range bounds (see :mod:`memenv.search.index`);
:class:`QuestionPool` is a question set over documents that stay out of memory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memenv.search.bm25 import SearchBackend, okapi_weights, tokenize
from memenv.search.index.format import (MANIFEST, IndexCorruptError, IndexMismatchError, _range_peaks,
                                        corpus_fingerprint)
from memenv.search.index.store import DocumentStore
from memenv.search.index.verify import _IndexFiles, _read_manifest, _rebuild_hint
from tasks.types import Document, QADataset, Question


def _best_bounded(bound: np.ndarray, n: int) -> np.ndarray:
    """The indices of the ``n`` largest values of ``bound``, found among those within 10%, 20%, 40% of the best
    one first (an argpartition of all of them costs more than most queries' whole remaining work). ``bound``
    must hold more than ``n`` positive values."""
    top = float(bound.max())
    for share in (0.9, 0.8, 0.6):
        near = np.flatnonzero(bound >= top * share)
        if len(near) >= n:
            break
    else:
        near = np.flatnonzero(bound > 0.0)
    if len(near) > n:
        near = near[np.argpartition(-bound[near], n - 1)[:n]]
    return near


class BM25Index(SearchBackend):
    """Exact BM25 (Okapi) top-k over an index directory written by :func:`~memenv.search.index.build.build_index`,
    memory-mapped.

    ``search(query, k)`` returns what :class:`memenv.search.BM25Sparse` over the same corpus returns (document
    indices by score descending, ties to the lower index, only scores > 0), reading only the heads of the
    query terms' impact-ordered lists (see :mod:`memenv.search.index`); ``scores(query)`` is the exhaustive score
    vector (for checks). ``corpus_path``, when given, must be the file the index was built from (checked by
    its fingerprint; :class:`IndexMismatchError` names both otherwise). ``documents`` is the document store.
    """

    #: Postings read per term before the first threshold test (the lists double from there).
    initial_depth = 64

    def __init__(self, path: str | os.PathLike, *, corpus_path: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.manifest = _read_manifest(self.path)
        if corpus_path is not None:
            self.check_corpus(corpus_path)
        self.tokenizer = tokenize
        params = self.manifest["params"]
        self.k1, self.b, self.epsilon = params["k1"], params["b"], params["epsilon"]
        self.avgdl, self.average_idf = self.manifest["avgdl"], self.manifest["average_idf"]
        self._n_docs = int(self.manifest["n_docs"])
        # Block-max bounds (absent from indexes built before they were added: those use the threshold algorithm).
        self.range_docs = int(self.manifest.get("range_docs", 0))
        files = _IndexFiles(self.path, self.manifest)
        # Plain ndarray views of the read-only maps: slicing an np.memmap costs microseconds of subclass
        # bookkeeping per slice, a query takes hundreds of slices. The views keep the maps alive.
        n_docs, n_terms, n_postings = self._n_docs, self.manifest["n_terms"], self.manifest["n_postings"]
        tf_dtype = np.dtype(self.manifest.get("tf_dtype", files.header_dtype("post_tf.npy")))
        if tf_dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            files.fail(MANIFEST, f"tf_dtype {tf_dtype.name!r} is not uint16 or uint32")
        per_term, per_posting = (n_terms,), (n_postings,)
        self.idf = files.array("idf.npy", np.float64, per_term, "one per term: n_terms")
        self.indptr = files.array("indptr.npy", np.int64, (n_terms + 1,), "n_terms + 1")
        self.doc_norm = files.array("doc_norm.npy", np.float64, (n_docs,), "one per document: n_docs")
        self.post_doc = files.array("post_doc.npy", np.int32, per_posting, "one per posting: n_postings")
        self.post_tf = files.array("post_tf.npy", tf_dtype, per_posting, "one per posting: n_postings")
        self.impact_doc = files.array("impact_doc.npy", np.int32, per_posting, "one per posting: n_postings")
        self.impact_tf = files.array("impact_tf.npy", tf_dtype, per_posting, "one per posting: n_postings")
        files.header("doc_len.npy", np.int32, (n_docs,), "one per document: n_docs", required=False)
        doc_offsets = files.array("doc_offsets.npy", np.int64, (n_docs + 1,), "n_docs + 1")
        if self.range_docs and (self.path / "range_max.npy").is_file():
            self.term_max = files.array("term_max.npy", np.float64, per_term, "one per term: n_terms")
            self.range_row = files.array("range_row.npy", np.int32, per_term, "one per term: n_terms")
            n_ranges = -(-n_docs // self.range_docs)
            self.range_max = files.array("range_max.npy", np.uint8, (None, n_ranges),
                                         f"one column per range of {self.range_docs} documents: ceil(n_docs / "
                                         "range_docs) columns")
        else:
            if self.range_docs and "range_max.npy" in files.records:
                files.fail("range_max.npy", "missing")
            self.range_docs, self.term_max, self.range_row, self.range_max = 0, None, None, None
        files.check_postings(self.indptr, n_postings)
        files.check_terms(n_terms)
        files.check_store(doc_offsets)
        self.documents = DocumentStore(self.path / "docs.jsonl", doc_offsets)
        self._vocab: dict[str, int] | None = None

    def _build(self, corpus: list[list[str]]) -> None:
        raise TypeError("a BM25Index is built by memenv.search.index.build.build_index and opened from its directory")

    def __reduce__(self):
        return (_open_index, (str(self.path),))

    @property
    def vocab(self) -> dict[str, int]:
        """Term -> term id (read from terms.txt on first use)."""
        if self._vocab is None:
            path = self.path / "terms.txt"
            try:
                terms = path.read_text(encoding="utf-8").split("\n")[:-1]
            except UnicodeDecodeError as e:
                raise IndexCorruptError(f"{path}: not UTF-8 text at byte {e.start} (damaged); "
                                        f"{_rebuild_hint(self.path, self.manifest)}") from None
            if len(terms) != self.manifest["n_terms"]:
                raise IndexCorruptError(f"{path}: {len(terms)} terms, the manifest says n_terms = "
                                        f"{self.manifest['n_terms']} (cut or damaged); "
                                        f"{_rebuild_hint(self.path, self.manifest)}")
            self._vocab = {t: i for i, t in enumerate(terms)}
        return self._vocab

    def check_corpus(self, corpus_path: str | os.PathLike) -> None:
        """Raise :class:`IndexMismatchError` unless ``corpus_path`` is the file this index was built from."""
        stored = self.manifest["corpus"]["fingerprint"]
        current = corpus_fingerprint(corpus_path)
        if current != stored:
            changed = ", ".join(f"{key} {stored[key]} -> {current[key]}" for key in stored
                                if stored[key] != current[key])
            raise IndexMismatchError(
                f"corpus file {corpus_path} does not match the index {self.path} (built from "
                f"{self.manifest['corpus']['path']}): {changed}; rebuild with `memenv index build {corpus_path} "
                f"{self.path}`")

    # ------------------------------------------------------------------ scoring
    def _query_terms(self, query: str) -> list[int]:
        vocab = self.vocab
        return [vocab[t] for t in self.tokenizer(query) if t in vocab]

    def _query_slots(self, query: str) -> tuple[list[int], list[int], np.ndarray]:
        """The query's distinct known terms, each occurrence's index among them (query order), and each
        one's multiplicity."""
        query_terms = self._query_terms(query)
        terms = list(dict.fromkeys(query_terms))
        slots = [terms.index(t) for t in query_terms]
        return terms, slots, np.bincount(slots, minlength=len(terms))

    def _weights(self, term: int, docs: np.ndarray, tf: np.ndarray) -> np.ndarray:
        return okapi_weights(self.idf[term], tf, self.doc_norm[docs], self.k1)

    def scores(self, query: str) -> np.ndarray:
        """Exhaustive scores of every document (query terms added in query order, as BM25Okapi)."""
        out = np.zeros(len(self), dtype=np.float64)
        for term in self._query_terms(query):
            lo, hi = int(self.indptr[term]), int(self.indptr[term + 1])
            docs = np.asarray(self.post_doc[lo:hi])
            out[docs] += self._weights(term, docs, self.post_tf[lo:hi])  # docs are unique within a term
        return out

    def _term_weights(self, term: int, cand: np.ndarray) -> np.ndarray:
        """Term's weight in each of the sorted documents ``cand`` (0.0 where absent): binary search in its
        doc-ordered list."""
        lo, hi = int(self.indptr[term]), int(self.indptr[term + 1])
        docs = self.post_doc[lo:hi]
        pos = np.minimum(np.searchsorted(docs, cand), hi - lo - 1)
        hit = docs[pos] == cand
        w = np.zeros(len(cand), dtype=np.float64)
        w[hit] = self._weights(term, cand[hit], self.post_tf[lo + pos[hit]])
        return w

    def _weight_at(self, term: int, depth: int) -> float:
        """The weight of term's ``depth``-th posting in impact order (0.0 past the end): a bound on every
        posting not yet read."""
        lo, hi = int(self.indptr[term]), int(self.indptr[term + 1])
        if depth >= hi - lo:
            return 0.0
        doc = self.impact_doc[lo + depth: lo + depth + 1]
        return float(self._weights(term, doc, self.impact_tf[lo + depth: lo + depth + 1])[0])

    #: Block-max search: ranges scored in the first chunk (chunks double from there), and how few ranges left in
    #: reach are sorted by bound rather than selected chunk by chunk.
    first_chunk = 16
    sort_ranges = 2048
    #: Relative slack on the block-max bounds (float32 sums; a bound is widened by it and a range is still
    #: scored when its bound is within it of the k-th best score).
    _slack = 1e-5

    def search(self, query: str, k: int) -> list[int]:
        """The at most ``k`` best documents for ``query``, best first (exact; see the class docstring).

        With block-max bounds (indexes built with ``range_max.npy``): every range of ``range_docs`` consecutive
        documents gets an upper bound on any of its documents' scores (the sum over the query terms of the
        term's largest weight in that range: stored, quantised upward, for common terms; computed from the
        postings for rare ones), in one vectorised pass over the ranges. Ranges are then scored exactly (binary
        search of each range in the terms' doc-ordered lists, weights summed in query order, so scores are
        bit-identical to :meth:`scores`), best bound first, in doubling chunks, until no range left can reach
        the k-th best exact score found (ties included: a range whose bound equals it is still scored, since a
        lower document index wins a tie). This is block-max pruning over fixed document ranges, as in Mallia
        et al.'s block-max pruning (BMP, SIGIR 2024), with exact rather than quantised scores. Without the
        bounds, :meth:`search_threshold`.
        """
        self.rank(np.zeros(0), k)  # validates k
        if self.range_max is None:
            return self.search_threshold(query, k)
        terms, slots, mult = self._query_slots(query)
        if k == 0 or not terms:
            return []
        bound = self._range_bounds(terms, mult)
        # Chunks of the best-bounded ranges (doubling) are scored exactly, raising the k-th best exact score
        # theta, until no range left has a bound reaching it. Only when few ranges are left in reach are they
        # sorted by bound; before that each chunk is selected from them in linear time.
        chunk = self.first_chunk
        best_docs, best_scores = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        theta, rest, rest_bound = 0.0, None, None
        while True:
            # Relative slack: bounds are summed in float32 (and in another order than the exact scores).
            cut = theta - self._slack * abs(theta)
            if rest is not None:  # sorted by bound: the ranges still in reach are a prefix
                keep = np.count_nonzero(rest_bound >= cut)
                pick, rest, rest_bound = rest[:min(chunk, keep)], rest[chunk:keep], rest_bound[chunk:keep]
            else:
                # A range whose bound is <= 0 holds no positive score.
                in_reach = bound >= cut if theta > 0.0 else bound > 0.0
                if np.count_nonzero(in_reach) <= self.sort_ranges:
                    reach = np.flatnonzero(in_reach)
                    rest = reach[np.argsort(-bound[reach], kind="stable")]
                    rest_bound = bound[rest]
                    pick, rest, rest_bound = rest[:chunk], rest[chunk:], rest_bound[chunk:]
                else:  # more than `chunk` in reach: the best bounds are all in reach
                    pick = _best_bounded(bound, chunk)
            if not len(pick):
                return [int(d) for d in best_docs]
            docs, scores = self._score_ranges(np.sort(pick), terms, slots)
            docs, scores = np.concatenate([best_docs, docs]), np.concatenate([best_scores, scores])
            order = np.lexsort((docs, -scores))[:k]  # score descending, ties to the lower index
            best_docs, best_scores = docs[order], scores[order]
            theta = best_scores[k - 1] if len(best_scores) >= k else 0.0
            bound[pick] = -np.inf  # scored
            chunk *= 2


    def _range_bounds(self, terms: list[int], mult: np.ndarray) -> np.ndarray:
        """Per range of ``range_docs`` documents, an upper bound (float32) on the score of any of its documents."""
        bound = np.zeros(self.range_max.shape[1], dtype=np.float32)
        scaled = np.empty_like(bound)  # one buffer for every common term's row (no temporary per term)
        for j, t in enumerate(terms):
            top = float(self.term_max[t]) * int(mult[j])
            if top <= 0.0:
                continue
            row = int(self.range_row[t])
            if row >= 0:
                bound += np.multiply(self.range_max[row], np.float32(top / 255.0 * (1 + self._slack)), out=scaled)
            else:  # a rare term: bounds from its few postings
                lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
                docs = self.post_doc[lo:hi]
                ranges, peak = _range_peaks(docs, self._weights(t, docs, self.post_tf[lo:hi]), self.range_docs)
                bound[ranges] += (peak * (int(mult[j]) * (1 + self._slack))).astype(np.float32)  # ranges are unique
        return bound

    def _score_ranges(self, ranges: np.ndarray, terms: list[int], slots: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Exact scores of the documents in ``ranges`` (ascending): ``(docs, scores)`` of those scoring > 0.

        Each term's postings in those ranges are found by one binary search of the ranges' edges in its
        doc-ordered list; then every term's postings are weighted and summed into a dense ``[term, document]``
        block at once (a fixed number of numpy calls per chunk, not per term), and the terms' rows are added in
        query order, as :meth:`scores` sums them (so the scores are bit-identical).
        """
        width, n = self.range_docs, len(ranges)
        first = ranges * width
        # Needles of the lists' dtype (searchsorted would otherwise cast the whole int32 list to int64), the
        # ranges' starts and ends interleaved: ascending, so one call finds both.
        edges = np.empty(2 * n, dtype=self.post_doc.dtype)
        edges[0::2], edges[1::2] = first, first + width
        starts, counts = [], []
        for t in terms:
            lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
            found = np.searchsorted(self.post_doc[lo:hi], edges)
            starts.append(found[0::2] + lo)
            counts.append(found[1::2] - found[0::2])
        start, count = np.concatenate(starts), np.concatenate(counts)
        term_totals = [int(c.sum()) for c in counts]
        total = sum(term_totals)
        if not total:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        # Global positions start[i] .. start[i] + count[i] - 1 of every (term, range) pair, in one array.
        pos = np.arange(total) + np.repeat(start - np.cumsum(count) + count, count)
        docs = self.post_doc[pos]
        per_term = np.repeat(np.arange(len(terms)), term_totals)
        weights = okapi_weights(self.idf[np.asarray(terms)][per_term], self.post_tf[pos], self.doc_norm[docs],
                                self.k1)
        # Cell of each posting: its term's row, then its document's place among the ranges' documents.
        local = docs - np.repeat(np.tile(first - np.arange(n) * width, len(terms)), count)
        block = np.bincount(per_term * (n * width) + local, weights,  # one posting per cell
                            minlength=len(terms) * n * width).reshape(len(terms), n * width)
        out = np.zeros(n * width, dtype=np.float64)
        for slot in slots:  # query order, as BM25Okapi sums (adding 0.0 for absent documents is exact)
            out += block[slot]
        hit = np.flatnonzero(out > 0.0)
        return (np.repeat(first, width) + np.tile(np.arange(width), n))[hit], out[hit]

    def search_threshold(self, query: str, k: int) -> list[int]:
        """:meth:`search` without block-max bounds (the only way for an index built before they were added).

        Threshold algorithm with MaxScore's split: the heads of every impact-ordered list give real documents,
        whose exact scores give a lower bound ``theta`` on the k-th best score; the terms whose maximum weights
        sum (with their query multiplicity) below ``theta`` are *non-essential* (a document holding only those
        cannot make the top k), so only the essential lists are read further, head first, until the k-th best
        exact score beats the best score an unread document could reach. When that would read about as many
        postings as scoring every document, every document is scored instead.
        """
        self.rank(np.zeros(0), k)  # validates k
        terms, slots, mult = self._query_slots(query)
        if k == 0 or not terms:
            return []
        lo = np.array([int(self.indptr[t]) for t in terms], dtype=np.int64)
        length = np.array([int(self.indptr[t + 1]) for t in terms], dtype=np.int64) - lo
        total = int(length.sum())
        if total <= 8 * self.initial_depth:
            return self._score_all_postings(terms, slots, lo, length, k)
        top = [self._weight_at(t, 0) for t in terms]
        depth = np.minimum(length, max(self.initial_depth, 2 * k))
        cand = np.zeros(0, dtype=np.int32)
        scores = np.zeros(0, dtype=np.float64)
        essential = np.ones(len(terms), dtype=bool)
        while True:
            heads = [self.impact_doc[lo[j]: lo[j] + depth[j]] for j in range(len(terms)) if depth[j]]
            new = np.setdiff1d(np.concatenate(heads), cand)  # sorted, unique
            if len(new):
                cand, scores = self._add_candidates(cand, scores, new, terms, slots)
            nxt = [self._weight_at(t, int(d)) if essential[j] else top[j]
                   for j, (t, d) in enumerate(zip(terms, depth))]
            bound = 0.0  # the best score of a document in none of the heads, summed as a score is
            for slot in slots:
                bound += nxt[slot]
            positive = int(np.count_nonzero(scores > 0))
            theta = -np.partition(-scores, k - 1)[k - 1] if positive >= k else 0.0
            if bound <= 0.0 or theta > bound:
                order = np.lexsort((cand, -scores))[: min(k, positive)]
                return [int(d) for d in cand[order]]
            # Non-essential terms: the smallest maxima whose sum stays below theta.
            essential[:] = True
            by_max = sorted(range(len(terms)), key=lambda j: mult[j] * top[j])
            partial = 0.0
            for j in by_max:
                partial += mult[j] * top[j]
                if partial >= theta:
                    break
                essential[j] = False
            todo = essential & (depth < length)
            # Cost guard: reading the rest of the essential lists with random access into every list costs
            # about len(terms) binary searches per posting; scoring every posting costs one pass.
            remaining = int((length - depth)[todo].sum())
            if not todo.any():  # every essential list is read: a document outside cand scores at most
                bound = 0.0     # the non-essential maxima, summed as a score is
                for slot in slots:
                    bound += 0.0 if essential[slot] else top[slot]
                if theta > bound:
                    order = np.lexsort((cand, -scores))[: min(k, positive)]
                    return [int(d) for d in cand[order]]
            if remaining * len(terms) >= total or not todo.any():
                return self._score_all_postings(terms, slots, lo, length, k, theta)
            depth = self._deepen(terms, mult, depth, length, nxt, todo)

    def _add_candidates(self, cand, scores, new, terms, slots):
        per_term = [self._term_weights(t, new) for t in terms]
        new_scores = np.zeros(len(new), dtype=np.float64)
        for slot in slots:  # query order, repeated terms once per occurrence: BM25Okapi's summation
            new_scores += per_term[slot]
        return np.concatenate([cand, new]), np.concatenate([scores, new_scores])

    def _score_all_postings(self, terms, slots, lo, length, k, theta: float = 0.0) -> list[int]:
        """Exact top-k by scoring every posting of the query terms into a dense score vector.

        ``theta`` is a lower bound on the k-th best score (the k-th best of documents already scored, 0.0 if
        none): only the documents reaching it are ranked, instead of selecting among all ``len(self)``.
        """
        dense: dict[int, np.ndarray] = {}
        out = np.zeros(len(self), dtype=np.float64)
        for slot in slots:  # query order: BM25Okapi's summation (adding 0.0 for absent documents is exact)
            if slot not in dense:
                docs = self.post_doc[lo[slot]: lo[slot] + length[slot]]
                weights = self._weights(terms[slot], docs, self.post_tf[lo[slot]: lo[slot] + length[slot]])
                # bincount sums one weight per bin here (documents are unique within a list): exact.
                dense[slot] = np.bincount(docs, weights, minlength=len(self))
            out += dense[slot]
        if theta > 0.0:
            cand = np.flatnonzero(out >= theta)
            return [int(cand[i]) for i in self.rank(out[cand], k)]
        return self.rank(out, k)

    def _deepen(self, terms: list[int], mult: np.ndarray, depth: np.ndarray, length: np.ndarray,
                nxt: list[float], todo: np.ndarray) -> np.ndarray:
        """Double the essential heads that lower the bound most per posting read (all of them on flat
        stretches, where no head lowers it)."""
        new = np.where(todo, np.minimum(2 * np.maximum(depth, 1), length), depth)
        gain = np.zeros(len(terms))
        for j in np.flatnonzero(todo):
            gain[j] = mult[j] * (nxt[j] - self._weight_at(terms[j], int(new[j]))) / (new[j] - depth[j])
        if gain.max() <= 0.0:
            return np.where(todo, np.minimum(4 * np.maximum(depth, 1), length), depth)
        return np.where(gain >= 0.5 * gain.max(), new, depth)


class QuestionPool(QADataset):
    """Questions over a corpus that stays out of memory (an index's document store, or a retrieval server).

    Unlike :class:`~tasks.types.QADataset` it runs no checks over the documents (that would read them all);
    questions' supporting titles are kept unresolved in ``meta``.
    """

    def __init__(self, documents: Sequence[Document], questions: list[Question], name: str) -> None:
        if not questions:
            raise ValueError(f"{name}: no questions")
        self.documents, self.questions, self.name = documents, questions, name


def _open_index(path: str) -> BM25Index:
    return BM25Index(path)


__all__ = ["BM25Index", "QuestionPool"]
