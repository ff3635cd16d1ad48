"""Memory of the README's tiny SFT run: RSS every K steps and after each evaluation, and the peak (issue 51).

    python benchmarks/sft_memory.py --steps 2000                      # the README command's run, whole
    python benchmarks/sft_memory.py --steps 150 --set eval_every=50 eval_episodes=8 episodes=200   # a quick look
    python benchmarks/sft_memory.py --steps 150 --variant plain --variant MALLOC_ARENA_MAX=2  # side by side

Each variant runs in a fresh Python process (so peak RSS, ``ru_maxrss``, compares like with like) the config
``memenv train --algo sft --out OUT --steps N`` builds (the CLI's own parser and defaults; ``--set`` adds any
config field as the CLI's ``--set`` does), with ``OUT`` a temporary folder. Printed per variant: the host line
(CPU capability, native bf16, compute dtype, torch threads), RSS every ``--every`` steps and after each
evaluation (with the live ``torch.Tensor`` count there), the growth from the first evaluation to the end and the
peak. A variant is ``plain`` or ``NAME=VALUE`` environment settings joined by commas (e.g.
``MALLOC_ARENA_MAX=2``, ``MEMENV_MALLOC_TUNING=0``: the library's allocator settings off).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile


def rss_mb() -> float:
    """Current resident set size in MB (Linux /proc; the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # pragma: no cover - non-Linux
        return peak_mb()


def peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def live_tensors() -> int:
    import torch

    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def child(steps: int, every: int, sets: list[str]) -> dict:
    """One run in this process; prints a JSON line per sample and returns the summary."""
    import agents.llm.sft as sft
    from agents.llm.cli import build_config, register_cli
    from agents.llm.precision import host_line, resolve_autocast

    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    out = tempfile.mkdtemp(prefix="sft_memory_")
    args = parser.parse_args(["train", "--algo", "sft", "--out", out, "--steps", str(steps), "--quiet"]
                             + (["--set", *sets] if sets else []))
    cfg = build_config(args)
    samples: list[dict] = []
    counter = {"step": 0}
    step_fn, eval_fn = sft.sft_step, sft.evaluate_off_budget

    def sample(kind: str, **extra) -> None:
        row = {"kind": kind, "step": counter["step"], "rss_mb": round(rss_mb(), 1), **extra}
        samples.append(row)
        print(json.dumps(row), flush=True)

    def timed_step(cfg_, run, batch, step):
        result = step_fn(cfg_, run, batch, step)
        counter["step"] = step + 1
        if counter["step"] == 1:
            print(host_line(run.autocast, run.dist.device), flush=True)
        if every and counter["step"] % every == 0:
            sample("step")
        return result

    def measured_eval(*a, **k):
        result = eval_fn(*a, **k)
        sample("eval", tensors=live_tensors(), f1=round(result["eval_f1"], 3))
        return result

    sft.sft_step, sft.evaluate_off_budget = timed_step, measured_eval
    print(f"config: steps {cfg.steps}, batch {cfg.batch_size}, eval every {cfg.eval_every} x {cfg.eval_episodes} "
          f"episodes, {cfg.episodes} demonstrations, autocast {resolve_autocast(cfg.autocast)}, pad_multiple "
          f"{getattr(cfg, 'pad_multiple', 1)}", flush=True)
    sft.train_sft(cfg)
    evals = [s for s in samples if s["kind"] == "eval"]
    first = evals[0]["rss_mb"] if evals else None
    return {"peak_mb": round(peak_mb(), 1), "end_mb": round(rss_mb(), 1), "first_eval_mb": first,
            "growth_after_first_eval_mb": round(rss_mb() - first, 1) if first is not None else None,
            "samples": samples}


def run_variant(variant: str, steps: int, every: int, sets: list[str]) -> dict:
    env = dict(os.environ)
    if variant != "plain":
        for item in variant.split(","):
            name, _, value = item.partition("=")
            env[name.strip()] = value.strip()
    cmd = [sys.executable, __file__, "--child", "--steps", str(steps), "--every", str(every)]
    if sets:
        cmd += ["--set", *sets]
    summary = None
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("SUMMARY "):
                summary = json.loads(line[len("SUMMARY "):])
            else:
                print(f"[{variant}] {line}", flush=True)
    if proc.returncode != 0 or summary is None:
        raise SystemExit(f"variant {variant!r} failed (exit {proc.returncode})")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=50, help="print RSS every K steps (0: only at evaluations)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config fields, as memenv train --set")
    p.add_argument("--variant", action="append", help="plain, or NAME=VALUE[,NAME=VALUE] env settings (repeat)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        summary = child(args.steps, args.every, args.set)
        print("SUMMARY " + json.dumps(summary), flush=True)
        return
    results = {v: run_variant(v, args.steps, args.every, args.set) for v in (args.variant or ["plain"])}
    print(f"\n{'variant':<40} {'first eval':>10} {'end':>8} {'growth':>8} {'peak':>8}  (MB RSS)")
    for v, s in results.items():
        print(f"{v:<40} {s['first_eval_mb'] or float('nan'):>10.1f} {s['end_mb']:>8.1f} "
              f"{s['growth_after_first_eval_mb'] or 0.0:>8.1f} {s['peak_mb']:>8.1f}")


if __name__ == "__main__":
    main()
