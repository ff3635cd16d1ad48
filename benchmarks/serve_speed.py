"""Served throughput: a memenv OpenEnv server (``memenv serve``) against the in-process env, loopback only.

    python benchmarks/serve_speed.py [--env MemQA-v0] [--kw objectives=2] [--clients 1 8 32] [--seconds 8] [--json PATH]

The server runs in its own process on 127.0.0.1 (a free port), as ``memenv serve`` would. For each number of
concurrent clients, that many client threads (each a :func:`memenv.openenv.connect` session, the way a trainer's
rollout workers use it) play episodes with the scripted ``relevance`` strategy for ``--seconds``; the in-process
baseline plays the same strategy on ``gym.make`` in one thread. Printed: episodes/s, steps/s and the p50/p99
latency of one ``step`` call (client side: request, the server's env.step, the reply), and the served overhead as
a ratio of step latencies (served p50 / in-process p50). The policy's own time is outside the step latencies and
inside episodes/s. Bounded: about 4 x ``--seconds`` plus the server's start (~10 s for openenv's imports). The
first lines name the host and the OpenEnv package serving (``openenv`` 0.10, or the older ``openenv-core``), so
two stacks can be run one after the other on a loaded machine and compared (docs/openenv.md, Throughput);
``--json`` also writes the rows, with those lines, to PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import memenv  # noqa: F401
from agents.scripted import make_strategy
from memenv.cli_common import parse_kwargs

ROOT = Path(__file__).resolve().parents[1]


def host_line() -> str:
    try:
        import torch

        from agents.llm.models.precision import host_line as llm_host_line

        torch.set_num_threads(1)
        line = llm_host_line()
    except ImportError:
        line = "host: (torch not installed)"
    return (f"{line}; {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
            f"Python {platform.python_version()}")


def openenv_line() -> str:
    """Which OpenEnv package (and version) this Python serves with."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("openenv", "openenv-core"):
        try:
            return f"OpenEnv package: {dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "OpenEnv package: none installed"


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux's /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def play_for(env, strategy_name: str, env_id: str, seconds: float, seed0: int, latencies: list[float]) -> tuple[int, int]:
    """Play episodes until ``seconds`` have passed (the episode under way is finished); ``(episodes, steps)``."""
    strategy = make_strategy(strategy_name, env_id)
    episodes = steps = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        obs, _ = env.reset(seed=seed0 + episodes)
        strategy.reset(None)
        done = False
        while not done:
            action = strategy.act(obs)
            t0 = time.perf_counter()
            obs, _, terminated, truncated, _ = env.step(action)
            latencies.append(time.perf_counter() - t0)
            steps += 1
            done = terminated or truncated
        episodes += 1
    return episodes, steps


def start_server(env_id: str, kwargs: dict, max_sessions: int) -> tuple[subprocess.Popen, str]:
    code = ("import sys; from memenv.openenv import serve; "
            f"serve({env_id!r}, {kwargs!r}, host='127.0.0.1', port=0, max_sessions={max_sessions}, "
            "ready=lambda url: print(url, flush=True))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"the server did not start (got {url!r})")
    return proc, url


def summarise(label: str, episodes: int, steps: int, wall: float, latencies: list[float], errors: int = 0,
              server_cpu_s: float | None = None, client_cpu_s: float = 0.0) -> dict:
    """One row. The CPU columns (ms per step: the server process's, and this process's, policy included) are
    what a step costs whatever else the machine runs, where latencies and rates are not."""
    ms = np.asarray(latencies) * 1e3
    row = {"label": label, "episodes_per_s": episodes / wall, "steps_per_s": steps / wall,
           "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "episodes": episodes,
           "errors": errors, "server_cpu_ms_per_step": None if server_cpu_s is None else 1e3 * server_cpu_s / steps,
           "client_cpu_ms_per_step": 1e3 * client_cpu_s / steps}
    server = "-" if server_cpu_s is None else f"{row['server_cpu_ms_per_step']:.3f}"
    print(f"  {label:<22} {row['episodes_per_s']:>9.1f} {row['steps_per_s']:>9.0f} {row['p50_ms']:>9.3f} "
          f"{row['p99_ms']:>9.3f} {episodes:>9d} {errors:>7d} {server:>10} {row['client_cpu_ms_per_step']:>10.3f}",
          flush=True)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="MemQA-v0")
    parser.add_argument("--kw", nargs="*", default=[], metavar="KEY=VALUE", help="env kwargs")
    parser.add_argument("--strategy", default="relevance", help="scripted strategy (reads observations only)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=8.0, help="playing time per configuration")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the rows here")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.clients) or args.seconds <= 0:
        parser.error("--clients must be >= 1 and --seconds > 0")
    kwargs = parse_kwargs(args.kw)
    host = host_line()
    print(host)
    print(openenv_line())
    print(f"{args.env} {kwargs or ''} strategy {args.strategy}, {args.seconds:g} s per configuration, loopback")
    print(f"  {'configuration':<22} {'episodes/s':>9} {'steps/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'episodes':>9} "
          f"{'errors':>7} {'srv cpu ms':>10} {'cli cpu ms':>10}  (CPU: per step)")

    local = gym.make(args.env, **kwargs)
    play_for(local, args.strategy, args.env, 0.5, 10**6, [])  # warm-up: world, index, caches
    latencies: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    episodes, steps = play_for(local, args.strategy, args.env, args.seconds, 0, latencies)
    rows = [summarise("in-process, 1 thread", episodes, steps, time.perf_counter() - t0, latencies,
                      client_cpu_s=time.process_time() - c0)]

    from memenv.openenv import connect

    proc, url = start_server(args.env, kwargs, max_sessions=max(args.clients))
    try:
        for n in args.clients:
            envs = [connect(url) for _ in range(n)]
            warm = threading.Barrier(n + 1)
            results: list = [None] * n
            failures: list[str] = []
            per_client: list[list[float]] = [[] for _ in range(n)]

            def run(i: int) -> None:
                play_for(envs[i], args.strategy, args.env, 0.2, 10**6 + i, [])  # warm-up
                warm.wait()
                try:
                    results[i] = play_for(envs[i], args.strategy, args.env, args.seconds, 1000 * i, per_client[i])
                except Exception as exc:  # noqa: BLE001 - counted and shown: the table says how many clients failed
                    failures.append(f"client {i}: {type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            warm.wait()
            t0, c0, s0 = time.perf_counter(), time.process_time(), process_cpu_s(proc.pid)
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            client_cpu, s1 = time.process_time() - c0, process_cpu_s(proc.pid)
            done = [r for r in results if r is not None]
            rows.append(summarise(f"served, {n} client{'s' if n > 1 else ''}", sum(r[0] for r in done),
                                  sum(r[1] for r in done), wall, [x for c in per_client for x in c],
                                  errors=n - len(done), client_cpu_s=client_cpu,
                                  server_cpu_s=None if s0 is None or s1 is None else s1 - s0))
            for failure in failures[:3]:
                print(f"    {failure}", flush=True)
            for env in envs:
                env.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    base = rows[0]
    print("served overhead (served / in-process):")
    for row in rows[1:]:
        print(f"  {row['label']:<22} step p50 x{row['p50_ms'] / base['p50_ms']:.1f}, "
              f"p99 x{row['p99_ms'] / base['p99_ms']:.1f}, episodes/s x{row['episodes_per_s'] / base['episodes_per_s']:.2f}")
    if args.json is not None:  # atomically: a reader never sees half a file
        tmp = args.json.with_name(f".{args.json.name}.tmp")
        tmp.write_text(json.dumps({"host": host, "openenv": openenv_line(), "env": args.env, "kwargs": kwargs,
                                   "seconds": args.seconds, "rows": rows}, indent=2))
        os.replace(tmp, args.json)
    return rows


if __name__ == "__main__":
    main()
