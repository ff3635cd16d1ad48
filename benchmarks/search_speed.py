"""Search speed: memenv's BM25 backends against rank_bm25 and bm25s on a synthetic corpus, side by side.

Builds a seeded corpus of made-up words with a Zipf-like frequency profile (40-120 words per document) and
measures, in one run:

* ``index``: the disk-backed index (:mod:`memenv.search.index`): build time and RSS added (measured in a fresh
  subprocess: VmHWM minus the RSS before the build, tokenising workers reported apart), load time
  (memory-map + vocabulary + first query, in another fresh process) and per-query ms; every timed top-k is
  checked against exhaustive BM25 scoring of the same index (bit-identical to rank_bm25's scores);
* ``bm25s`` (if installed): the same figures, on the same tokens (memenv's tokeniser), saved and loaded back
  memory-mapped;
* ``bm25`` (in-memory sparse backend) and ``rank_bm25`` (the reference) on a sample of the corpus
  (``--ref-docs``; rank_bm25 cannot index 1M documents), with the index built over the same sample: the
  rankings of all three must agree.

    python benchmarks/search_speed.py [--docs 20000] [--ref-docs 20000] [--queries 200] [--k 3] [--seed 0]
        [--workdir DIR [--reuse]]

``--reuse`` keeps the corpus files and the indexes an earlier run left in ``--workdir`` (same ``--docs``,
``--ref-docs``, ``--vocab`` and ``--seed``, checked against ``params.json`` there; each index is checked against
its corpus by fingerprint) instead of writing and building them again: query timings at 1M documents without a
2-minute build each time. The build figures are then the stored ones.

Exit status 1 if any ranking differs; speed targets are reported, not enforced (timings are machine
dependent; the host line says what was measured on, and the load average how contended it was).
"""

from __future__ import annotations

import argparse
import json
import os
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:
    from memenv.search.bm25 import STOPWORDS, SearchBackend, make_backend, tokenize
except ImportError:  # run as a script from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from memenv.search.bm25 import STOPWORDS, SearchBackend, make_backend, tokenize

from memenv.search.index.build import build_index
from memenv.search.index.search import BM25Index

TARGET_RATIO = 50.0
TARGET_QUERY_MS = 2.0


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


def vm_kib(field: str) -> int:
    """A ``/proc/self/status`` memory figure (VmRSS, VmHWM) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def write_corpus(path: Path, texts: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": str(i), "title": "", "text": text}) + "\n")


def read_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [f"\n{json.loads(line)['text']}" for line in f]  # what the index tokenises: title "" + "\n" + text


def per_query_ms(search, queries: Sequence[str], min_seconds: float) -> float:
    start = time.perf_counter()
    done = 0
    while done == 0 or time.perf_counter() - start < min_seconds:
        for q in queries:
            search(q)
        done += len(queries)
    return 1000 * (time.perf_counter() - start) / done


# ---------------------------------------------------------------------------------------------- child processes
def child_index_build(corpus: str, out: str) -> dict:
    import resource

    base = vm_kib("VmRSS")
    t0 = time.perf_counter()
    build_index(corpus, out, progress=False)
    seconds = time.perf_counter() - t0
    worker_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"build_s": seconds, "rss_added_mb": (vm_kib("VmHWM") - base) / 1024, "worker_peak_mb": worker_kib / 1024}


def per_query_distribution(search, queries: Sequence[str], min_seconds: float) -> dict:
    """Mean, median and 95th percentile over the queries of each one's ms (averaged over repeated passes)."""
    total = np.zeros(len(queries))
    passes = 0
    start = time.perf_counter()
    while passes == 0 or time.perf_counter() - start < min_seconds:
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            search(q)
            total[i] += time.perf_counter() - t0
        passes += 1
    ms = 1000 * total / passes
    return {"mean": float(ms.mean()), "median": float(np.median(ms)), "p95": float(np.percentile(ms, 95)),
            "at_most_2ms": float(np.mean(ms <= TARGET_QUERY_MS)), "passes": passes}


def child_index_query(out: str, queries: list[str], k: int, n_check: int, min_seconds: float) -> dict:
    t0 = time.perf_counter()
    index = BM25Index(out)
    index.search(queries[0], k)  # the vocabulary is read on first use: part of loading
    load_s = time.perf_counter() - t0
    ms = per_query_ms(lambda q: index.search(q, k), queries, min_seconds)
    dist = per_query_distribution(lambda q: index.search(q, k), queries, min_seconds)
    # The threshold algorithm (indexes without block-max bounds), on the same queries in the same process.
    threshold = per_query_distribution(lambda q: index.search_threshold(q, k), queries, min_seconds)
    mismatches = [q for q in queries[:n_check] if index.search(q, k) != SearchBackend.rank(index.scores(q), k)]
    t0 = time.perf_counter()
    for q in queries[:n_check]:
        SearchBackend.rank(index.scores(q), k)
    exhaustive_ms = 1000 * (time.perf_counter() - t0) / max(1, n_check)
    mismatches += [q for q in queries[:n_check] if index.search_threshold(q, k) != index.search(q, k)]
    return {"load_s": load_s, "query_ms": ms, "dist": dist, "threshold": threshold,
            "exhaustive_ms": exhaustive_ms, "checked": n_check,
            "mismatches": mismatches[:5], "n_mismatches": len(mismatches),
            "rankings": [index.search(q, k) for q in queries]}


def child_bm25s(corpus: str, out: str, queries: list[str], k: int, min_seconds: float) -> dict:
    import bm25s

    texts = read_texts(Path(corpus))
    base = vm_kib("VmRSS")
    t0 = time.perf_counter()
    model = bm25s.BM25(method="robertson", k1=1.5, b=0.75)
    model.index([tokenize(t) for t in texts], show_progress=False)
    build_s = time.perf_counter() - t0
    rss = (vm_kib("VmHWM") - base) / 1024
    model.save(out)
    del model
    t0 = time.perf_counter()
    model = bm25s.BM25.load(out, mmap=True)
    load_s = time.perf_counter() - t0
    known = set(model.vocab_dict)

    def search(q: str):
        toks = [t for t in tokenize(q) if t in known] or [next(iter(known))]
        return model.retrieve([toks], k=k, show_progress=False, n_threads=1)

    return {"build_s": build_s, "rss_added_mb": rss, "load_s": load_s,
            "query_ms": per_query_ms(search, queries, min_seconds)}


def run_child(name: str, *args) -> dict:
    """Run ``child_<name>(*args)`` in a fresh interpreter (clean RSS figures) and return its result."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, __file__, "--child", name, json.dumps(args)], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"child {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def host_line() -> str:
    try:
        import torch

        cap, threads = torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()
    except ImportError:
        cap, threads = "unknown (no torch)", "-"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"host: {os.cpu_count()} CPUs, capability {cap}, torch threads {threads}, numpy float64 scores, "
            f"index build workers {min(2, os.cpu_count() or 1)}, queries single-threaded; load average {load}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000, help="number of documents (default 20000)")
    parser.add_argument("--ref-docs", type=int, default=20000,
                        help="sample size for the in-memory bm25 and rank_bm25 backends (default 20000)")
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
    parser.add_argument("--workdir", type=Path, default=None, help="where corpora and indexes go (default: temp)")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the corpus files and indexes already in --workdir (see the module docstring)")
    parser.add_argument("--no-bm25s", action="store_true", help="skip bm25s")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from records import add_record_option  # benchmarks/records.py: the committed record

    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(globals()[f"child_{args.child[0]}"](*json.loads(args.child[1]))))
        return 0

    print(host_line())
    rng = np.random.default_rng(args.seed)
    vocab = make_vocabulary(args.vocab, rng)
    probs = zipf_probabilities(len(vocab))
    t0 = time.perf_counter()
    texts = make_corpus(args.docs, vocab, probs, rng)
    queries = make_queries(args.queries, vocab, probs, rng)
    n_ref = len(queries) if args.ref_queries <= 0 else min(args.ref_queries, len(queries))
    n_sample = min(args.ref_docs, args.docs)
    print(
        f"corpus: {len(texts)} docs, vocab {len(vocab)}; {len(queries)} queries (reference runs {n_ref}); "
        f"k={args.k}; seed={args.seed}; in-memory sample {n_sample} docs "
        f"[generated in {time.perf_counter() - t0:.2f}s]"
    )
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="search_speed_"))
    workdir.mkdir(parents=True, exist_ok=True)
    corpus, sample = workdir / "corpus.jsonl", workdir / "sample.jsonl"
    params = {"docs": args.docs, "ref_docs": n_sample, "vocab": args.vocab, "seed": args.seed}
    params_path = workdir / "params.json"
    reuse = args.reuse and corpus.is_file() and sample.is_file() and params_path.is_file()
    if args.reuse and reuse and json.loads(params_path.read_text()) != params:
        parser.error(f"--reuse: {params_path} holds {params_path.read_text().strip()}, this run {params}")
    if not reuse:
        write_corpus(corpus, texts)
        write_corpus(sample, texts[:n_sample])
        params_path.write_text(json.dumps(params) + "\n")
    del texts
    failures = 0

    def build(corpus_file: Path, out: Path) -> dict:
        """Build (in a fresh process), or with --reuse keep an index still matching its corpus."""
        if reuse and (out / "manifest.json").is_file():
            try:
                manifest = BM25Index(out, corpus_path=corpus_file).manifest
                if "range_docs" in manifest:
                    return {"build_s": manifest["build_seconds"]["total"], "reused": True}
            except ValueError:
                pass
        return run_child("index_build", str(corpus_file), str(out))

    # --- the full corpus: the disk index and bm25s, each in fresh processes
    built = build(corpus, workdir / "index")
    q = run_child("index_query", str(workdir / "index"), queries, args.k, n_ref, args.min_seconds)
    built_line = (f"build {built['build_s']:.1f}s (reused: the build of an earlier run)" if built.get("reused") else
                  f"build {built['build_s']:.1f}s, RSS added {built['rss_added_mb']:.0f} MB (+ each of 2 tokenising "
                  f"workers peaked at {built['worker_peak_mb']:.0f} MB)")
    d, t = q["dist"], q["threshold"]
    print(f"index  ({args.docs} docs): {built_line}, load {q['load_s']:.3f}s, {q['query_ms']:.3f} ms/query (target "
          f"<= {TARGET_QUERY_MS} ms), exhaustive scoring {q['exhaustive_ms']:.2f} ms/query; top-{args.k} equal to "
          f"exhaustive (and block-max = threshold) on {q['checked'] - q['n_mismatches']}/{q['checked']}")
    print(f"  per query, block-max: mean {d['mean']:.3f} ms, median {d['median']:.3f}, p95 {d['p95']:.3f}, "
          f"{100 * d['at_most_2ms']:.0f}% <= {TARGET_QUERY_MS} ms")
    print(f"  per query, threshold algorithm (no range bounds): mean {t['mean']:.3f} ms, median {t['median']:.3f}, "
          f"p95 {t['p95']:.3f}; block-max speed-up (mean) {t['mean'] / d['mean']:.1f}x")
    failures += q["n_mismatches"]
    for bad in q["mismatches"]:
        print(f"  MISMATCH index vs exhaustive: {bad!r}")
    if not args.no_bm25s:
        try:
            r = run_child("bm25s", str(corpus), str(workdir / "bm25s"), queries, args.k, args.min_seconds)
            print(f"bm25s  ({args.docs} docs): build {r['build_s']:.1f}s, RSS added {r['rss_added_mb']:.0f} MB, "
                  f"load (mmap) {r['load_s']:.3f}s, {r['query_ms']:.3f} ms/query (same tokens, method robertson)"
                  f"; index/bm25s per query: {r['query_ms'] / q['query_ms']:.1f}x")
        except RuntimeError as exc:
            print(f"bm25s: skipped ({str(exc).strip().splitlines()[-1]})")

    # --- the sample: in-memory bm25, rank_bm25 and the index over the same documents must rank alike
    build(sample, workdir / "sample_index")
    sample_index = BM25Index(workdir / "sample_index")
    sample_texts = read_texts(sample)
    backends: dict[str, SearchBackend] = {}
    for name in ("bm25", "rank_bm25"):
        t0 = time.perf_counter()
        backends[name] = make_backend(name, sample_texts)
        print(f"build {name:>9} ({n_sample} docs, in memory): {time.perf_counter() - t0:.2f}s")
    fast_qps, fast_res = time_queries(backends["bm25"], queries, args.k, args.min_seconds)
    ref_qps, ref_res = time_queries(backends["rank_bm25"], queries[:n_ref], args.k, args.min_seconds)
    idx_qps, idx_res = time_queries(sample_index, queries, args.k, args.min_seconds)
    mismatches = [i for i in range(n_ref) if not fast_res[i] == ref_res[i] == idx_res[i]]
    max_diff = max(
        float(np.max(np.abs(backends["bm25"].scores(q) - backends["rank_bm25"].scores(q)), initial=0.0))
        for q in queries[:n_ref]
    )
    ratio = fast_qps / ref_qps
    print(f"queries/s      bm25: {fast_qps:12.1f}  ({len(queries)} queries, {n_sample} docs)")
    print(f"queries/s     index: {idx_qps:12.1f}  ({len(queries)} queries, {n_sample} docs)")
    print(f"queries/s rank_bm25: {ref_qps:12.1f}  ({n_ref} queries, {n_sample} docs)")
    print(f"ratio bm25/reference: {ratio:.1f}x, index/reference: {idx_qps / ref_qps:.1f}x  (target >= "
          f"{TARGET_RATIO:.0f}x: {'met' if ratio >= TARGET_RATIO else 'NOT met'})")
    print(f"rankings agree (bm25 = rank_bm25 = index) on {n_ref - len(mismatches)}/{n_ref} queries; "
          f"max |score diff| {max_diff:.3g}")
    for i in mismatches[:5]:
        print(f"  MISMATCH query {i} {queries[i]!r}: bm25 {fast_res[i]} vs rank_bm25 {ref_res[i]} "
              f"vs index {idx_res[i]}")
    failures += len(mismatches)
    if args.record:
        from records import write_record

        write_record(args.record, __file__, argv, {
            "host_line": host_line(), "docs": args.docs, "ref_docs": n_sample, "queries": len(queries),
            "ref_queries": n_ref, "k": args.k, "seed": args.seed, "index_build": built, "index_query": q,
            "queries_per_s": {"bm25": fast_qps, "index": idx_qps, "rank_bm25": ref_qps}, "ratio_bm25_reference": ratio,
            "ranking_mismatches": len(mismatches), "max_score_diff": max_diff})
    if args.workdir is None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
