"""MemDialog-LongMemEval memory flatness: peak RSS of one episode on an oracle item vs a ~1.5M-token M-size item.

    python benchmarks/longmemeval_rss.py [--strategy recency] [--memory-mode tools] [--m-sessions 500]

Each case runs in a fresh Python process (peak RSS, ``ru_maxrss``, compares like with like): build the env
(``keep_snapshots=False``; the file is indexed at make time, which the peak includes), warm up on the oracle item,
then run one full episode of a scripted strategy, timed. The cases:

* ``oracle``: the first item of the shared dev slice (``../shared/data/longmemeval/longmemeval_dev.json``, the
  oracle variant: 1-6 evidence sessions), or a 3-session synthetic item when the slice is absent;
* ``M``: a synthetic item in the official layout written to a temporary file
  (:func:`tasks.longmemeval.write_synthetic_longmemeval`: ``--m-sessions`` sessions of 10 turns of 300 words,
  1.5M whitespace tokens at 500 sessions, ~11 MB of JSON).

Flat memory: the loader keeps no item and decodes one session at a time, so the M item's peak RSS should stay
within +50 MB of the oracle item's (the issue's target). Printed: sessions, messages, tokens, steps, steps/s,
peak RSS and its difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from beam_rss import _host  # the host line of the BEAM benchmark (benchmarks/ is on sys.path)
from memread_rss import _peak_rss_mb, _rss_mb  # the same RSS probes as the MemRead benchmark

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "longmemeval" / "longmemeval_dev.json"


def child(case: str, strategy: str, memory_mode: str, m_sessions: int) -> dict:
    from agents.scripted.bench import run_episode
    from agents.scripted.strategies.qa_strategies import make_strategy
    from memenv.envs.beam import MemDialogBeamEnv
    from tasks.longmemeval import write_synthetic_longmemeval

    policy = make_strategy(strategy, "MemDialog-LongMemEval-v0", memory_mode)
    kwargs = {"keep_snapshots": False, "memory_mode": memory_mode, **getattr(policy, "env_kwargs", {})}
    kwargs["context"] = getattr(policy, "context", "memory")
    with tempfile.TemporaryDirectory() as tmp:
        small = str(DEV) if DEV.is_file() else str(write_synthetic_longmemeval(Path(tmp) / "oracle.json", 1, 3))
        run_episode(MemDialogBeamEnv(small, dataset="longmemeval", conversation=0, **kwargs), policy, 1)  # warm-up
        if case == "oracle":
            path = small
        else:
            path = str(write_synthetic_longmemeval(Path(tmp) / "m.json", 1, m_sessions, 10, 300, seed=1))
        size_mb = os.path.getsize(path) / 2**20
        before = _rss_mb()
        start = time.perf_counter()
        env = MemDialogBeamEnv(path, dataset="longmemeval", conversation=0, **kwargs)
        summary, steps = run_episode(env, policy, 0)
        elapsed = time.perf_counter() - start
        after, peak = _rss_mb(), _peak_rss_mb()
    return {"case": case, "file_mb": size_mb, "sessions": env.n_sessions, "messages": env.source.n_messages,
            "tokens": env.source.n_tokens, "steps": steps, "steps_per_s": steps / elapsed, "seconds": elapsed,
            "peak_rss_mb": peak, "rss_growth_mb": after - before, "accuracy": summary["accuracy"]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="recency", help="a MemDialog-LongMemEval strategy")
    parser.add_argument("--memory-mode", dest="memory_mode", default="tools", choices=("tools", "rewrite"))
    parser.add_argument("--m-sessions", dest="m_sessions", type=int, default=500)
    parser.add_argument("--child", choices=("oracle", "M"), help=argparse.SUPPRESS)
    from records import add_record_option  # benchmarks/records.py: the committed record

    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.strategy, args.memory_mode, args.m_sessions)))
        return []
    rows = []
    for case in ("oracle", "M"):
        out = subprocess.run([sys.executable, __file__, "--child", case, "--strategy", args.strategy,
                              "--memory-mode", args.memory_mode, "--m-sessions", str(args.m_sessions)],
                             check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"MemDialog-LongMemEval-v0 (memory_mode={args.memory_mode}), strategy {args.strategy}, "
          "keep_snapshots=False, one process per case")
    print(f"host: {_host()}")
    print(f"{'case':>7} {'file MB':>8} {'sessions':>9} {'messages':>9} {'tokens':>10} {'steps':>7} {'steps/s':>8} "
          f"{'seconds':>8} {'peak RSS MB':>12} {'RSS growth MB':>14}")
    for r in rows:
        print(f"{r['case']:>7} {r['file_mb']:>8.1f} {r['sessions']:>9,} {r['messages']:>9,} {r['tokens']:>10,} "
              f"{r['steps']:>7,} {r['steps_per_s']:>8,.0f} {r['seconds']:>8.1f} {r['peak_rss_mb']:>12.1f} "
              f"{r['rss_growth_mb']:>14.1f}")
    delta = rows[1]["peak_rss_mb"] - rows[0]["peak_rss_mb"]
    print(f"peak RSS at the M-size item - at the oracle item: {delta:+.1f} MB (target: at most +50 MB)")
    if args.record:
        from records import write_record

        write_record(args.record, __file__, argv, {"strategy": args.strategy, "memory_mode": args.memory_mode,
                                                   "m_sessions": args.m_sessions, "rows": rows,
                                                   "peak_rss_delta_mb": delta})
    return rows


if __name__ == "__main__":
    main()
