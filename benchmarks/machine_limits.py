"""What this CPU can do at the project's own model shapes (issue 62): the matmul rate of every product of the
models' bodies and heads, at training/prefill rows (512) and at a decode batch (8), in fp32 and in bf16 where the
CPU computes bf16 natively (as agents/llm/models/precision.py detects it; emulated bf16 is not a limit), at 1 thread and
at all threads; and the memory bandwidth of a STREAM-style triad (``a = b + s c`` over arrays far larger than the
last-level cache; bytes counted as STREAM does, two reads and a write per element).

Models: ``smollm2-135m`` (hidden 576, intermediate 1,536, 9 heads of 64, 3 KV heads, vocab 49,152: the
real-model benchmarks' teacher, and their student cut to fewer layers of the same shapes), ``tiny`` (the tiny
presets' Qwen2: hidden 128, intermediate 384, vocab 4,096), and any ``--model DIR`` (its config.json).

Timing: ``time.perf_counter`` around a loop sized to >= ``--min-time`` seconds (timeit's autorange), after a
warm-up call, ``--repeats`` times; the best (the limit) and the median per call are kept. The inputs are made once
(the weights as a model holds them: ``[n, k]``, applied as ``F.linear``). Wall-clock figures: the load average
in the host line says how shared the machine was.

    python benchmarks/machine_limits.py --json results/limits/machine_limits.json
    python benchmarks/machine_limits.py --models smollm2-135m --threads 1 --triad-mib 128

:mod:`benchmarks.limits` reads the record (``arm_update_cost.py --limits``, ``rollout_throughput.py --limits``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.limits import (DECODE_ROWS, TRAIN_ROWS, Shapes, host_info, host_text,  # noqa: E402
                               model_matmuls)

MODELS = {"smollm2-135m": Shapes(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64,
                                 vocab=49152, tied=True),
          "tiny": Shapes(hidden=128, intermediate=384, layers=4, heads=4, kv_heads=4, head_dim=32, vocab=4096,
                         tied=True)}


def time_call(fn, repeats: int = 5, min_time: float = 0.05) -> dict[str, float]:
    """Seconds per call of ``fn``, best and median over ``repeats`` timed loops, on the wall clock
    (``time.perf_counter``) and in this process's CPU time (``time.process_time``, all threads): one warm-up call,
    then loops of as many calls as take >= ``min_time`` wall seconds."""
    fn()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= min_time or number >= 1 << 16:
            break
        number *= 2
    wall, cpu = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(number):
            fn()
        wall.append((time.perf_counter() - start) / number)
        cpu.append((time.process_time() - cpu_start) / number)
    return {"best_s": min(wall), "median_s": statistics.median(wall), "cpu_best_s": min(cpu),
            "cpu_median_s": statistics.median(cpu), "calls_per_loop": number}


def rates(timing: dict[str, float], amount: float, unit: str) -> dict[str, float]:
    """``amount`` (FLOPs or bytes) per second, in units of 1e9, for each timing: ``{unit}_best`` (wall),
    ``{unit}_median``, ``{unit}_cpu_best`` (per CPU-second), ``{unit}_cpu_median``."""
    return {f"{unit}_best": amount / timing["best_s"] / 1e9, f"{unit}_median": amount / timing["median_s"] / 1e9,
            f"{unit}_cpu_best": amount / max(timing["cpu_best_s"], 1e-12) / 1e9,
            f"{unit}_cpu_median": amount / max(timing["cpu_median_s"], 1e-12) / 1e9}


def matmul(m: int, k: int, n: int, dtype: str, threads: int, repeats: int, min_time: float) -> dict:
    """One product ``[m, k] x [n, k]^T`` at ``threads`` torch threads: seconds and GFLOP/s."""
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(getattr(torch, dtype))
    w = torch.randn(n, k, generator=gen).to(getattr(torch, dtype))
    with torch.no_grad():
        timing = time_call(lambda: torch.nn.functional.linear(x, w), repeats, min_time)
    return {"m": m, "k": k, "n": n, "dtype": dtype, "threads": threads, **timing,
            **rates(timing, 2.0 * m * k * n, "gflops")}


def triad(threads: int, mib: int, repeats: int, min_time: float) -> dict:
    """``a = b + 3 c`` over float32 arrays of ``mib`` MiB each, at ``threads`` torch threads (bytes: 3 per
    element, STREAM's count; a CPU without streaming stores also reads ``a`` before writing it)."""
    import torch

    torch.set_num_threads(threads)
    count = mib * (1 << 20) // 4
    a, b, c = torch.empty(count), torch.rand(count), torch.rand(count)
    timing = time_call(lambda: torch.add(b, c, alpha=3.0, out=a), repeats, min_time)
    moved = 3 * count * 4
    return {"threads": threads, "mib_per_array": mib, "bytes": moved, **timing, **rates(timing, moved, "gbps")}


def measure(models: dict[str, Shapes], threads: list[int], dtypes: list[str], rows: tuple[int, ...] = (TRAIN_ROWS,
            DECODE_ROWS), triad_mib: int = 256, repeats: int = 5, min_time: float = 0.05, log=print) -> dict:
    """The record: the host, every distinct product of ``models`` at ``rows`` x ``dtypes`` x ``threads``, the
    triad at each thread count."""
    import torch

    before = torch.get_num_threads()
    products = list(dict.fromkeys(p for shapes in models.values() for p in model_matmuls(shapes, rows)))
    record = {"host": host_info(), "models": {name: asdict(s) for name, s in models.items()},
              "matmul": [], "triad": []}
    try:
        for t in threads:
            for dtype in dtypes:
                for m, k, n in products:
                    record["matmul"].append(matmul(m, k, n, dtype, t, repeats, min_time))
                    row = record["matmul"][-1]
                    log(f"  matmul {m}x{k}x{n} {dtype} {t} thread(s): {row['gflops_best']:.1f} GFLOP/s best wall, "
                        f"{row['gflops_cpu_best']:.1f} per CPU-s", flush=True)
            record["triad"].append(triad(t, triad_mib, repeats, min_time))
            log(f"  triad {t} thread(s): {record['triad'][-1]['gbps_best']:.1f} GB/s best wall, "
                f"{record['triad'][-1]['gbps_cpu_best']:.1f} per CPU-s", flush=True)
    finally:
        torch.set_num_threads(before)
    record["host_after"] = host_info()
    return record


def body_rate(record: dict, shapes: Shapes, m: int, dtype: str, threads: int, basis: str = "cpu") -> float:
    """The body's FLOP-weighted rate (GFLOP/s) at ``m`` rows: its FLOPs over the time its products take (per
    CPU-second, or wall with ``basis="wall"``)."""
    from benchmarks.limits import body_seconds

    return 1.0 / body_seconds(record, shapes, 1e9, m, dtype, threads, basis=basis)


def table(record: dict) -> str:
    """The record as a table: per model, its body (FLOP-weighted over its products) and its head at the measured
    row counts, per dtype and thread count, on the wall clock and per CPU-second; then the products one by one
    and the triad."""
    from benchmarks.limits import matmul_rate

    lines = [host_text(record["host"]), f"load after: {' '.join(map(str, record['host_after']['load']))}", "",
             "GFLOP/s: best over the repeats; wall = per second of the clock, CPU = per CPU-second of this process",
             f"{'model':14s} {'rows':>5s} {'dtype':9s} {'threads':>7s} {'body wall':>10s} {'body CPU':>9s} "
             f"{'head wall':>10s} {'head CPU':>9s}"]
    combos = sorted({(r["dtype"], r["threads"]) for r in record["matmul"]})
    for name, fields in record["models"].items():
        shapes = Shapes(**fields)
        for m in sorted({r["m"] for r in record["matmul"]}, reverse=True):
            for dtype, t in combos:
                try:
                    cells = [body_rate(record, shapes, m, dtype, t, b) for b in ("wall", "cpu")]
                    cells += [matmul_rate(record, m, shapes.hidden, shapes.vocab, dtype, t, basis=b)
                              for b in ("wall", "cpu")]
                except KeyError:
                    continue
                lines.append(f"{name:14s} {m:>5d} {dtype:9s} {t:>7d} {cells[0]:>10.1f} {cells[1]:>9.1f} "
                             f"{cells[2]:>10.1f} {cells[3]:>9.1f}")
    lines += ["", f"{'product m x k x n':22s} {'dtype':9s} {'threads':>7s} {'wall best':>10s} {'median':>7s} "
                  f"{'CPU best':>9s} {'median':>7s}"]
    for r in record["matmul"]:
        product = f"{r['m']} x {r['k']} x {r['n']}"
        lines.append(f"{product:22s} {r['dtype']:9s} {r['threads']:>7d} {r['gflops_best']:>10.1f} "
                     f"{r['gflops_median']:>7.1f} {r['gflops_cpu_best']:>9.1f} {r['gflops_cpu_median']:>7.1f}")
    lines.append("")
    for r in record["triad"]:
        lines.append(f"triad ({r['mib_per_array']} MiB arrays) {r['threads']} thread(s): {r['gbps_best']:.1f} GB/s "
                     f"best wall ({r['gbps_median']:.1f} median), {r['gbps_cpu_best']:.1f} per CPU-s "
                     f"({r['gbps_cpu_median']:.1f} median)")
    return "\n".join(lines)


def parse_threads(text: str) -> list[int]:
    """``"1,all"`` -> ``[1, N]`` (N: the CPUs this process may run on), duplicates dropped."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    out = []
    for part in text.split(","):
        value = cpus if part.strip() == "all" else int(part)
        if value < 1:
            raise ValueError(f"threads must be >= 1, got {value}")
        out.append(value)
    return list(dict.fromkeys(out))


def model_shapes(folder: str) -> Shapes:
    config = json.loads((Path(folder).expanduser() / "config.json").read_text())
    return Shapes.from_config(config)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--models", default="smollm2-135m,tiny", help=f"of {', '.join(MODELS)} (comma-separated)")
    parser.add_argument("--model", action="append", default=[], metavar="DIR",
                        help="also a model folder's shapes (its config.json); repeatable")
    parser.add_argument("--threads", default="1,all", help="thread counts, e.g. 1,all (default) or 1")
    parser.add_argument("--rows", type=int, default=TRAIN_ROWS, help="rows of the prefill/training-shaped products")
    parser.add_argument("--decode-batch", type=int, default=DECODE_ROWS, help="rows of the decode-shaped products")
    parser.add_argument("--triad-mib", type=int, default=256, help="MiB per triad array (>> the last-level cache)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds one timed loop runs at least")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the record here (atomically)")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODELS)}")
    try:
        threads = parse_threads(args.threads)
    except ValueError as err:
        parser.error(f"--threads: {err}")
    if args.repeats < 1 or args.triad_mib < 1 or args.rows < 1 or args.decode_batch < 1:
        parser.error("--repeats, --triad-mib, --rows and --decode-batch must be >= 1")

    from agents.llm.models.precision import native_bf16

    models = {n: MODELS[n] for n in names}
    for folder in args.model:
        models[Path(folder).name] = model_shapes(folder)
    dtypes = ["float32"] + (["bfloat16"] if native_bf16("cpu") else [])
    print(host_text(host_info()), flush=True)
    if "bfloat16" not in dtypes:
        print("bf16: not native on this CPU (emulated bf16 is no limit): fp32 only", flush=True)
    record = measure(models, threads, dtypes, (args.rows, args.decode_batch), args.triad_mib, args.repeats,
                     args.min_time)
    record["command"] = " ".join(["python", "benchmarks/machine_limits.py", *(argv if argv is not None else sys.argv[1:])])
    print(table(record))
    if args.json:
        from memenv.files import write_text_atomic

        write_text_atomic(args.json, json.dumps(record, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
