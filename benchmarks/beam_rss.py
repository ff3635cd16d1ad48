"""MemDialog-BEAM memory flatness: one episode per chat length (128K, 1M, 10M tokens), peak RSS and steps/s.

    python benchmarks/beam_rss.py [--sizes 128000 1000000 10000000] [--strategy relevance] [--source synthetic]

Each length runs in a fresh Python process (so peak RSS, ``ru_maxrss``, compares like with like): build the
env (tools mode, ``keep_snapshots=False``; ``--snapshots default``: the env's default, the last 256 kept), warm it up on a short chat, then run one full episode of a scripted
tools strategy, timed. ``--source disk`` first writes the synthetic chat in BEAM's layout to a temporary
folder (not timed; written batch by batch) and reads it back through the streaming ``chat.json`` parser
(``data_path=``). Printed per length: batches (sessions), messages, steps, steps/s, the process's peak RSS,
the RSS growth over the episode, and the BEAM score (judge-free approximation).

Flat memory: the env holds one batch at a time, so the 10M-token peak RSS should stay within a few MB of the
128K one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from memread_rss import _peak_rss_mb, _rss_mb  # the same RSS probes as the MemRead benchmark (benchmarks/ is on sys.path)


def child(chat_tokens: int, strategy: str, seed: int, source: str, snapshots: str = "none") -> dict:
    from agents.scripted.bench import run_episode
    from agents.scripted.strategies.qa_strategies import make_strategy
    from memenv.envs.beam import MemDialogBeamEnv
    from tasks.beam import SyntheticBeamChat, write_beam_directory

    policy = make_strategy(strategy, "MemDialog-BEAM-v0")
    kwargs = {**({"keep_snapshots": False} if snapshots == "none" else {}), **policy.env_kwargs}
    run_episode(MemDialogBeamEnv(chat_tokens=8_000, **kwargs), policy, seed + 1)  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        if source == "disk":
            write_beam_directory(SyntheticBeamChat(seed, chat_tokens), os.path.join(tmp, "conv"))
            env = MemDialogBeamEnv(data_path=tmp, **kwargs)
        else:
            env = MemDialogBeamEnv(chat_tokens=chat_tokens, **kwargs)
        before = _rss_mb()
        start = time.perf_counter()
        summary, steps = run_episode(env, policy, seed)
        elapsed = time.perf_counter() - start
        after, peak = _rss_mb(), _peak_rss_mb()
    source_obj = env.source
    return {"chat_tokens": chat_tokens, "batches": env.n_sessions,
            "messages": getattr(source_obj, "n_messages", None), "steps": steps, "score": summary["score"],
            "steps_per_s": steps / elapsed, "seconds": elapsed, "peak_rss_mb": peak, "rss_growth_mb": after - before,
            "store_tokens": summary["store_tokens"]}


def _host() -> str:
    """CPU capability (torch's, when installed), cores and Python; the env does no tensor work (no dtype)."""
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except ImportError:  # pragma: no cover - torch is optional here
        capability = "unknown (no torch)"
    return (f"CPU capability {capability}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
            "single-threaded env (no tensors, no dtype)")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128_000, 1_000_000, 10_000_000])
    parser.add_argument("--strategy", default="relevance", help="a MemDialog-BEAM tools strategy")
    parser.add_argument("--source", choices=("synthetic", "disk"), default="synthetic",
                        help="stream the synthetic chat directly, or write it in BEAM's layout and stream chat.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--snapshots", choices=("none", "default"), default="none",
                        help="keep_snapshots=False, or the env's default (the last 256 kept for the summary)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    from records import add_record_option  # benchmarks/records.py: the committed record

    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.strategy, args.seed, args.source, args.snapshots)))
        return []
    rows = []
    for size in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--child", str(size), "--strategy", args.strategy,
                              "--seed", str(args.seed), "--source", args.source, "--snapshots", args.snapshots],
                             check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"MemDialog-BEAM-v0 (memory_mode=tools), strategy {args.strategy}, source {args.source}, seed {args.seed}, "
          f"keep_snapshots={'False' if args.snapshots == 'none' else 'default (the last 256)'}, one process per length")
    print(f"host: {_host()}")
    print(f"{'chat tokens':>12} {'batches':>8} {'steps':>7} {'steps/s':>8} {'seconds':>8} {'peak RSS MB':>12} "
          f"{'RSS growth MB':>14} {'store tokens':>13} {'score':>6}")
    for r in rows:
        print(f"{r['chat_tokens']:>12,} {r['batches']:>8,} {r['steps']:>7,} {r['steps_per_s']:>8,.0f} {r['seconds']:>8.1f} "
              f"{r['peak_rss_mb']:>12.1f} {r['rss_growth_mb']:>14.1f} {r['store_tokens']:>13,} {r['score']:>6.3f}")
    base = rows[0]
    for r in rows[1:]:
        print(f"peak RSS at {r['chat_tokens']:,} tokens - at {base['chat_tokens']:,}: "
              f"{r['peak_rss_mb'] - base['peak_rss_mb']:+.1f} MB")
    if args.record:
        from records import write_record

        write_record(args.record, __file__, argv, {"strategy": args.strategy, "source": args.source, "seed": args.seed,
                                                   "snapshots": args.snapshots, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
