"""Why the SB3 snippet of docs/envs.md could take minutes: torch threads x progress bar x a busy core.

Runs ``MaskablePPO("MlpPolicy", MemQANumeric(), seed=0).learn(N, progress_bar=...)`` in a fresh process per
configuration, side by side in one run: progress bar on/off, torch threads at the default (one per core)
or 1, OpenMP spin-waiting on or off (``OMP_WAIT_POLICY=PASSIVE``), and the machine idle or with one core
held by a busy loop (another job, as on a shared 2-core machine). Prints the seconds ``learn`` took.

    python benchmarks/sb3_snippet_speed.py                 # learn(2048), every configuration
    python benchmarks/sb3_snippet_speed.py --steps 4096 --no-busy

What it shows (2-core machine, see docs/envs.md, "Stable-Baselines3"): with the default threads, the bar and a busy
core, torch's OpenMP workers spin between the MLP's small matrix products while the bar's refresh thread
(rich) waits for the GIL, and ``learn`` takes ~10x longer; one torch thread, no bar, or passive OpenMP
waiting each remove it. The wrapper itself steps ~1,400 times per second (``--wrapper-only``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import torch
threads = int(sys.argv[1]); bar = sys.argv[2] == "bar"; steps = int(sys.argv[3])
if threads:
    torch.set_num_threads(threads)
from sb3_contrib import MaskablePPO
from memenv.wrappers import MemQANumeric
model = MaskablePPO("MlpPolicy", MemQANumeric(), seed=0)
start = time.perf_counter()
model.learn(steps, progress_bar=bar)
print(json.dumps({"learn_s": time.perf_counter() - start, "threads": torch.get_num_threads()}))
"""


def run_child(threads: int, bar: bool, steps: int, passive: bool, timeout: float) -> dict:
    env = dict(os.environ)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, str(threads), "bar" if bar else "nobar", str(steps)],
                              capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"learn_s": float("inf"), "threads": threads or os.cpu_count()}
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def wrapper_steps_per_s(steps: int = 3000) -> float:
    import numpy as np

    from memenv.wrappers import MemQANumeric, masked_random_action

    env, rng = MemQANumeric(), np.random.default_rng(0)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(masked_random_action(env, rng))
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2048, help="learn() timesteps per run")
    parser.add_argument("--no-busy", action="store_true", help="skip the runs with one core held busy")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a run is cut (shown as inf)")
    parser.add_argument("--wrapper-only", action="store_true", help="only the wrapper's steps/s")
    args = parser.parse_args()

    import torch

    print(f"host: {os.cpu_count()} CPUs, torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, dtype float32, default torch threads "
          f"{torch.get_num_threads()}")
    print(f"MemQANumeric with a masked-random policy: {wrapper_steps_per_s():,.0f} steps/s")
    if args.wrapper_only:
        return
    print(f"MaskablePPO('MlpPolicy', MemQANumeric(), seed=0).learn({args.steps}):")
    print(f"{'core held busy':>14} {'OMP wait':>8} {'threads':>7} {'bar':>4} {'learn s':>8} {'load avg (1 min)':>16}")
    for busy in ([False] if args.no_busy else [False, True]):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for passive, threads, bar in itertools.product([False, True], [0, 1], [True, False]):
                if passive and threads == 1:
                    continue  # one thread has no workers to spin
                result = run_child(threads, bar, args.steps, passive, args.timeout)
                print(f"{'yes' if busy else 'no':>14} {'passive' if passive else 'spin':>8} "
                      f"{result['threads']:>7} {'on' if bar else 'off':>4} {result['learn_s']:>8.1f} "
                      f"{os.getloadavg()[0]:>16.1f}", flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()


if __name__ == "__main__":
    main()
