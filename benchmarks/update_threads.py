"""Issue 46's lever (c): on a 2-core machine, one arm process at 2 torch threads against two arm processes at 1
thread each (what the experiment's ``--workers 2`` does), the same update in each, measured in one run.

Three settings, each the update now (``benchmarks/arm_update_cost.py --side after``) run in child processes:

- **1 x 1**: one process, 1 thread, alone (the reference: one core idle);
- **1 x 2**: one process, 2 threads, alone;
- **2 x 1**: two processes, 1 thread each, started together.

Printed per setting: the updates done, the wall seconds from the first child's training start to the last one's
end (model loading and imports excluded; the children's whole lives are printed too), the machine's throughput in
updates per wall-hour over that span, the CPU seconds per update (the parts' sum of every child over its updates)
and the tokens sampled per action (the settings sample with different thread counts, so their tokens may differ;
the throughput is per update, so check that the work is alike). The ratio that decides the lever is **2 x 1 against
1 x 2 in updates per wall-hour**. With ``--rounds`` > 1 the settings' order rotates by round.

It only means something on a machine left to it: the load average is printed at the start and the end of every
setting, and a warning at the start when it is over 0.5.

    python benchmarks/update_threads.py --base ~/.cache/memenv/models/smollm2-135m-instruct --student-layers 6 --updates 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = {"1x1": (1, 1), "1x2": (1, 2), "2x1": (2, 1)}  # name: (processes, threads per process)


def child_command(args: argparse.Namespace, threads: int) -> list[str]:
    cmd = [sys.executable, str(HERE / "arm_update_cost.py"), "--side", "after", "--json", "--threads", str(threads),
           "--updates", str(args.updates), "--arm", args.arm]
    cmd += ["--run", args.run] if args.run else ["--base", args.base]
    if args.student_layers is not None:
        cmd += ["--student-layers", str(args.student_layers)]
    return cmd


def run_setting(args: argparse.Namespace, processes: int, threads: int) -> dict:
    """``processes`` children at ``threads`` threads each, started together; their JSON lines and the wall span."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    children = [subprocess.Popen(child_command(args, threads), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env) for _ in range(processes)]
    results = []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"a child ({' '.join(child.args)}) failed with exit code {child.returncode}:\n"
                             f"{err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    whole = time.perf_counter() - start
    wall = max(r["train_end"] for r in results) - min(r["train_start"] for r in results)
    updates = sum(r["updates"] for r in results)
    return {"processes": processes, "threads": threads, "wall": wall, "whole_wall": whole, "updates": updates,
            "updates_per_hour": updates / wall * 3600, "cpu_per_update": sum(r["update_cpu"] for r in results) / updates,
            "tokens_per_action": sum(r.get("response_tokens", 0.0) for r in results) / len(results),
            "peak_rss_gb": max(r["peak_rss_gb"] for r in results), "load": (load_start, os.getloadavg()[0])}


def summary(rows: dict[str, list[dict]]) -> list[str]:
    """The table's lines and the ratios (means over rounds)."""
    def mean(name: str, key: str) -> float:
        return sum(r[key] for r in rows[name]) / len(rows[name])

    lines = [f"{'setting':<8}{'updates':>8}{'wall-s':>9}{'(whole)':>9}{'updates/wall-h':>16}{'CPU-s/update':>14}"
             f"{'tokens/action':>15}{'peak RSS GB':>13}{'load start-end':>16}"]
    for name, runs in rows.items():
        for r in runs:
            lines.append(f"{name:<8}{r['updates']:>8}{r['wall']:>9.0f}{r['whole_wall']:>9.0f}{r['updates_per_hour']:>16.2f}"
                         f"{r['cpu_per_update']:>14.1f}{r['tokens_per_action']:>15.1f}{r['peak_rss_gb']:>13.1f}"
                         f"{r['load'][0]:>8.2f}-{r['load'][1]:<7.2f}")
    if {"1x2", "2x1"} <= rows.keys():
        lines.append(f"2 x 1 / 1 x 2, updates per wall-hour: {mean('2x1', 'updates_per_hour') / mean('1x2', 'updates_per_hour'):.2f}x")
    if {"1x1", "1x2"} <= rows.keys():
        lines.append(f"1 x 2 / 1 x 1, updates per wall-hour (what the second thread buys one process): "
                     f"{mean('1x2', 'updates_per_hour') / mean('1x1', 'updates_per_hour'):.2f}x; CPU-s per update "
                     f"{mean('1x2', 'cpu_per_update') / mean('1x1', 'cpu_per_update'):.2f}x")
    if {"1x1", "2x1"} <= rows.keys():
        lines.append(f"2 x 1 / 1 x 1, CPU-s per update (what sharing the machine costs each process): "
                     f"{mean('2x1', 'cpu_per_update') / mean('1x1', 'cpu_per_update'):.2f}x")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="the experiment's --out folder (teacher and student built)")
    source.add_argument("--base", help="a prepared base model folder (as benchmarks/arm_update_cost.py --base)")
    parser.add_argument("--arm", choices=["rl", "memopd", "teacher_persistent"], default="memopd")
    parser.add_argument("--updates", type=int, default=2, help="updates per process (default 2)")
    parser.add_argument("--student-layers", type=int, default=None, metavar="N")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if args.updates < 1 or args.rounds < 1:
        parser.error("--updates and --rounds must be >= 1")

    from agents.llm.models.precision import host_line

    print(host_line(), f"| {os.cpu_count()} CPUs; {args.arm}, {args.updates} update(s) per process", flush=True)
    if os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.2f} at the start: the machine is not left to this "
              "benchmark, so its wall-clock figures measure that load too", flush=True)
    rows: dict[str, list[dict]] = {name: [] for name in args.settings}
    for rnd in range(args.rounds):
        order = args.settings[rnd % len(args.settings):] + args.settings[:rnd % len(args.settings)]
        for name in order:
            rows[name].append(run_setting(args, *SETTINGS[name]))
            r = rows[name][-1]
            print(f"round {rnd + 1}, {name}: {r['updates']} updates in {r['wall']:.0f} wall-s "
                  f"({r['updates_per_hour']:.2f} per wall-hour), {r['cpu_per_update']:.1f} CPU-s per update", flush=True)
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    raise SystemExit(main())
