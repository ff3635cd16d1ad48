"""MemRead memory flatness: one episode per document length, peak RSS and steps/s.

    python benchmarks/memread_rss.py [--sizes 10000 100000 1000000] [--strategy relevance] [--seed 0]

Each length runs in a fresh Python process (so peak RSS, ``ru_maxrss``, compares like with like): build the
env (``keep_snapshots=False``) and warm it up on a short episode, then run one full episode of a memory-only
scripted strategy, timed; then the same episode again under ``tracemalloc``. Printed per length: chunks,
steps, steps/s, the process's peak RSS, the RSS growth over the episode, and the tracemalloc peak of the
episode (Python allocations made during it, the world and caches excluded).

Flat memory: the env streams chunks from a plan of paragraph indices, so the 1M-token peak RSS should stay
within a few MB of the 10k-token one.

    python benchmarks/memread_rss.py --huge-paragraph 6000000 [--chunk-tokens 512]

A document that is one paragraph of that many words instead: ``env.step`` time per step at the first, middle
and last chunk (means over windows of steps), and beside it the time to render one chunk there, now (the
paragraph scanned once, piece by piece) and as it was (the whole paragraph split for every chunk). The step
time should not grow with the position.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
import tracemalloc


def _rss_mb() -> float:
    """Current resident set size in MB (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:  # pragma: no cover - non-Linux
        return _peak_rss_mb()


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _episode(env, policy, seed: int) -> tuple[int, float]:
    obs, _ = env.reset(seed=seed)
    policy.reset(env)
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        steps += 1
        if terminated or truncated:
            return steps, info["summary"]["f1"]


def child(doc_tokens: int, strategy: str, seed: int) -> dict:
    from agents.scripted.strategies.qa_strategies import make_strategy
    from memenv.envs.memread import MemReadEnv

    policy = make_strategy(strategy, "MemRead-v0")
    _episode(MemReadEnv(doc_tokens=2000, keep_snapshots=False, context=policy.context), policy, seed + 1)  # warm-up
    env = MemReadEnv(doc_tokens=doc_tokens, keep_snapshots=False, context=policy.context)
    before = _rss_mb()
    start = time.perf_counter()
    steps, f1 = _episode(env, policy, seed)
    elapsed = time.perf_counter() - start
    after, peak = _rss_mb(), _peak_rss_mb()
    tracemalloc.start()
    _episode(env, policy, seed)
    traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return {
        "doc_tokens": env.plan.total_tokens, "chunks": env.plan.n_chunks, "steps": steps, "f1": f1,
        "steps_per_s": steps / elapsed, "seconds": elapsed, "peak_rss_mb": peak, "rss_growth_mb": after - before,
        "tracemalloc_peak_mb": traced_peak,
    }


def _old_piece(text: str, piece: int, width: int) -> str:
    """A piece of a split paragraph as it was rendered before: the whole paragraph split for every chunk."""
    return " ".join(text.split()[piece * width:(piece + 1) * width])


def huge_paragraph(words: int, chunk_tokens: int, window: int = 50) -> dict:
    """Per-step times on a one-paragraph document of ``words`` words (see the module docstring)."""
    import torch

    from memenv.envs.memread import MemReadEnv
    from tasks.types import Document, QADataset, Question

    text = " ".join(f"w{i}" for i in range(words))
    source = QADataset([Document("big", "Big", text)], [Question("q", "Which word comes first?", ("w0",), ("big",))],
                       name="huge-paragraph")
    env = MemReadEnv(source=source, doc_tokens=words, chunk_tokens=chunk_tokens, keep_snapshots=False)
    env.reset(seed=0)
    n, width = env.n_chunks, int(env.plan.piece_words[0])
    marks = {"first": 0, "middle": max(0, n // 2 - window // 2), "last": max(0, n - window - 1)}
    step_ms: dict[str, float] = {}
    shown = 0  # the chunk on screen: each memory-only step moves to the next one
    for label, first in marks.items():
        while shown < first:
            env.step("<memory></memory>")
            shown += 1
        start = time.perf_counter()
        for _ in range(window):
            env.step("<memory></memory>")
        step_ms[label] = (time.perf_counter() - start) / window * 1e3
        shown += window
    render_new, render_old = {}, {}
    for label, c in marks.items():
        start = time.perf_counter()
        env.plan.chunk_text(c, env.documents)
        render_new[label] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        _old_piece(env.documents[0].text, c, width)
        render_old[label] = (time.perf_counter() - start) * 1e3
    print(f"host: {platform.machine()}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} torch threads (unused here), text only (no dtype)")
    print(f"one paragraph of {words:,} words, chunk_tokens {chunk_tokens}: {n:,} chunks of {width} words")
    print(f"{'chunk':>7} {'env.step ms':>12} {'render now ms':>14} {'render before ms':>17} {'before/now':>11}")
    for label in marks:
        print(f"{label:>7} {step_ms.get(label, float('nan')):>12.3f} {render_new[label]:>14.3f} "
              f"{render_old[label]:>17.1f} {render_old[label] / render_new[label]:>11.0f}x")
    return {"chunks": n, "step_ms": step_ms, "render_new_ms": render_new, "render_old_ms": render_old}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--strategy", default="relevance", help="a memory-only MemRead strategy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--huge-paragraph", type=int, metavar="WORDS",
                        help="time steps on a document that is one paragraph of WORDS words instead")
    parser.add_argument("--chunk-tokens", type=int, default=512, help="with --huge-paragraph (default: 512)")
    from records import add_record_option  # benchmarks/records.py: the committed record

    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.huge_paragraph is not None:
        return [huge_paragraph(args.huge_paragraph, args.chunk_tokens)]
    if args.child is not None:
        print(json.dumps(child(args.child, args.strategy, args.seed)))
        return []
    rows = []
    for size in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(size), "--strategy", args.strategy,
                              "--seed", str(args.seed)], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"MemRead-v0, strategy {args.strategy}, seed {args.seed}, keep_snapshots=False, one process per length")
    print(f"{'doc tokens':>11} {'chunks':>7} {'steps':>6} {'steps/s':>8} {'peak RSS MB':>12} "
          f"{'RSS growth MB':>14} {'tracemalloc peak MB':>20} {'F1':>5}")
    for r in rows:
        print(f"{r['doc_tokens']:>11,} {r['chunks']:>7,} {r['steps']:>6,} {r['steps_per_s']:>8,.0f} "
              f"{r['peak_rss_mb']:>12.1f} {r['rss_growth_mb']:>14.1f} {r['tracemalloc_peak_mb']:>20.2f} {r['f1']:>5.2f}")
    base = rows[0]
    for r in rows[1:]:
        print(f"peak RSS at {r['doc_tokens']:,} tokens - at {base['doc_tokens']:,}: "
              f"{r['peak_rss_mb'] - base['peak_rss_mb']:+.1f} MB")
    if args.record:
        from records import write_record

        write_record(args.record, __file__, argv,
                     {"strategy": args.strategy, "seed": args.seed, "keep_snapshots": False, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
