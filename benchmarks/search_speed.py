"""Search speed: the sparse BM25 backend against the rank_bm25 reference on a synthetic corpus.

Builds a seeded corpus of made-up words with a Zipf-like frequency profile, indexes it with both backends,
runs the same queries through both, checks that every query measured by both gets the same ranking, and
prints build times, queries/s of each and the speed ratio (target: fast/reference >= 50x).

    python benchmarks/search_speed.py [--docs 20000] [--queries 200] [--ref-queries 100] [--k 3] [--seed 0]

Exit status 1 if any ranking differs; the speed target is reported, not enforced (timings are machine
dependent).
"""

from __future__ import annotations

import argparse
import string
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:
    from memenv.search import STOPWORDS, SearchBackend, make_backend
except ImportError:  # run as a script from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from memenv.search import STOPWORDS, SearchBackend, make_backend

TARGET_RATIO = 50.0


def make_vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    """``size`` distinct made-up lowercase words (3-10 letters), none of them a stopword."""
    letters = np.array(list(string.ascii_lowercase))
    words: dict[str, None] = {}  # ordered set, so the vocabulary depends only on the seed
    while len(words) < size:
        word = "".join(rng.choice(letters, size=int(rng.integers(3, 11))))
        if word not in STOPWORDS:
            words[word] = None
    return list(words)


def zipf_probabilities(size: int, exponent: float = 1.05) -> np.ndarray:
    """p(rank r) proportional to 1 / r**exponent: a few very common words and a long tail of rare ones."""
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** exponent
    return weights / weights.sum()


def make_corpus(
    n_docs: int, vocab: Sequence[str], probs: np.ndarray, rng: np.random.Generator
) -> list[str]:
    """``n_docs`` documents of 40-120 words drawn from ``vocab`` with probabilities ``probs``."""
    lengths = rng.integers(40, 121, size=n_docs)
    flat = rng.choice(len(vocab), size=int(lengths.sum()), p=probs)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(vocab[i] for i in flat[bounds[d] : bounds[d + 1]]) for d in range(n_docs)]


def make_queries(
    n_queries: int, vocab: Sequence[str], probs: np.ndarray, rng: np.random.Generator
) -> list[str]:
    """Queries of 2-6 words, drawn from the corpus distribution (so common, long-posting terms occur)."""
    return [
        " ".join(vocab[i] for i in rng.choice(len(vocab), size=int(rng.integers(2, 7)), p=probs))
        for _ in range(n_queries)
    ]


def time_queries(
    backend: SearchBackend, queries: Sequence[str], k: int, min_seconds: float
) -> tuple[float, list[list[int]]]:
    """Queries/s of ``backend`` over ``queries`` (repeated until ``min_seconds`` elapse) and the rankings."""
    start = time.perf_counter()
    results = [backend.search(q, k) for q in queries]
    done = len(queries)
    # Fast backends finish one pass in milliseconds; repeat so timer resolution and noise don't dominate.
    while time.perf_counter() - start < min_seconds:
        for q in queries:
            backend.search(q, k)
        done += len(queries)
    return done / (time.perf_counter() - start), results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000, help="number of documents (default 20000)")
    parser.add_argument("--queries", type=int, default=200, help="number of queries (default 200)")
    parser.add_argument(
        "--ref-queries",
        type=int,
        default=100,
        help="how many of the queries the slow rank_bm25 reference runs (default 100; <=0: all)",
    )
    parser.add_argument("--k", type=int, default=3, help="results per query (default 3)")
    parser.add_argument("--vocab", type=int, default=20000, help="vocabulary size (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--min-seconds", type=float, default=1.0, help="minimum timing window per backend (default 1.0)"
    )
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    vocab = make_vocabulary(args.vocab, rng)
    probs = zipf_probabilities(len(vocab))
    t0 = time.perf_counter()
    texts = make_corpus(args.docs, vocab, probs, rng)
    queries = make_queries(args.queries, vocab, probs, rng)
    n_ref = len(queries) if args.ref_queries <= 0 else min(args.ref_queries, len(queries))
    print(
        f"corpus: {len(texts)} docs, {sum(len(t.split()) for t in texts)} tokens, vocab {len(vocab)}; "
        f"{len(queries)} queries (reference runs {n_ref}); k={args.k}; seed={args.seed} "
        f"[generated in {time.perf_counter() - t0:.2f}s]"
    )

    backends: dict[str, SearchBackend] = {}
    for name in ("bm25", "rank_bm25"):
        t0 = time.perf_counter()
        backends[name] = make_backend(name, texts)
        print(f"build {name:>9}: {time.perf_counter() - t0:.2f}s")

    fast_qps, fast_res = time_queries(backends["bm25"], queries, args.k, args.min_seconds)
    ref_qps, ref_res = time_queries(backends["rank_bm25"], queries[:n_ref], args.k, args.min_seconds)

    mismatches = [i for i in range(n_ref) if fast_res[i] != ref_res[i]]
    max_diff = max(
        float(np.max(np.abs(backends["bm25"].scores(q) - backends["rank_bm25"].scores(q)), initial=0.0))
        for q in queries[:n_ref]
    )
    ratio = fast_qps / ref_qps
    print(f"queries/s      bm25: {fast_qps:12.1f}  ({len(queries)} queries)")
    print(f"queries/s rank_bm25: {ref_qps:12.1f}  ({n_ref} queries)")
    print(f"ratio fast/reference: {ratio:.1f}x  (target >= {TARGET_RATIO:.0f}x: "
          f"{'met' if ratio >= TARGET_RATIO else 'NOT met'})")
    print(f"rankings agree on {n_ref - len(mismatches)}/{n_ref} queries; max |score diff| {max_diff:.3g}")
    for i in mismatches[:5]:
        print(f"  MISMATCH query {i} {queries[i]!r}: bm25 {fast_res[i]} vs rank_bm25 {ref_res[i]}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
