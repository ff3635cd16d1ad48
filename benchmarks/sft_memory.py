"""Memory of the README's tiny SFT run: RSS every K steps and after each evaluation, and the peak (issue 51).

    python benchmarks/sft_memory.py --steps 2000                      # the README command's run, whole
    python benchmarks/sft_memory.py --steps 150 --set eval_every=50 eval_episodes=8 episodes=200   # a quick look
    python benchmarks/sft_memory.py --steps 150 --variant plain --variant MALLOC_ARENA_MAX=2  # side by side

Each variant runs in a fresh Python process (so peak RSS, ``ru_maxrss``, compares like with like) the config
``memenv train --algo sft --out OUT --steps N`` builds (the CLI's own parser and defaults; ``--set`` adds any
config field as the CLI's ``--set`` does), with ``OUT`` a temporary folder. Printed per variant: the host line
(CPU capability, native bf16, compute dtype, torch threads), RSS every ``--every`` steps and after each
evaluation (with the live ``torch.Tensor`` count there), the growth from the first evaluation to the end and the
peak. A variant is ``plain`` or ``NAME=VALUE`` environment settings joined by commas, e.g.
``MALLOC_ARENA_MAX=2``, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0``, or ``SFT_MEMORY_UNPADDED_TARGETS=1``: the
action-token count left unpadded, as before issue 51's fix (the "before" of a side-by-side run).
``--head 200``: the mechanism alone, cheap (seconds): the tiny model's LM head (a 128 x 4096 linear) under bf16
autocast, forward and backward at 200 different row counts (100..697, as SFT's action-token counts vary), in a
fresh process per variant: the rows unpadded, padded to a multiple of 64, and unpadded with oneDNN's primitive
cache off; RSS growth printed for each.

``--jobs 2`` runs the variants at the same time (each its own process: a busy machine lends each a share).

Figures (issue 51, AVX512 CPU with native bf16, bf16 autocast, 2 torch threads, a busy machine): see
docs/llm_agents.md ("Memory of a CPU SFT run").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


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
    import agents.llm.training.sft as sft
    from agents.llm.training.cli import build_config, register_cli
    from agents.llm.models.precision import host_line, resolve_autocast

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
        row = {"kind": kind, "step": counter["step"], "rss_mb": round(rss_mb(), 1),
               "cpu_s": round(time.process_time(), 1), **extra}
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
    if os.environ.get("SFT_MEMORY_UNPADDED_TARGETS") == "1":  # as before the fix: the target count as it comes
        from agents.llm.training.common import Batch

        inputs = Batch.inputs
        Batch.inputs = lambda self, target_multiple=1: inputs(self)
    print(f"config: steps {cfg.steps}, batch {cfg.batch_size}, eval every {cfg.eval_every} x {cfg.eval_episodes} "
          f"episodes, {cfg.episodes} demonstrations, autocast {resolve_autocast(cfg.autocast)}, pad_multiple "
          f"{getattr(cfg, 'pad_multiple', 1)}", flush=True)
    try:
        sft.train_sft(cfg)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    evals = [s for s in samples if s["kind"] == "eval"]
    first = evals[0]["rss_mb"] if evals else None
    return {"peak_mb": round(peak_mb(), 1), "end_mb": round(rss_mb(), 1), "first_eval_mb": first,
            "growth_after_first_eval_mb": round(rss_mb() - first, 1) if first is not None else None,
            "first_sample_mb": samples[0]["rss_mb"] if samples else None, "samples": samples}


def head_child(counts: int, pad: int) -> float:
    """RSS growth (MB) of the tiny LM head's bf16 forward + backward at ``counts`` row counts, padded to ``pad``."""
    import torch

    torch.set_num_threads(1)
    head = torch.nn.Linear(128, 4096)
    start = rss_mb()
    for n in range(100, 100 + 3 * counts, 3):
        x = torch.randn(-(-n // pad) * pad, 128, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(x).float()
        torch.log_softmax(logits[:n], dim=-1)[:, 0].sum().backward()
    return rss_mb() - start


def head_variants(counts: int) -> None:
    import torch

    from agents.llm.models.precision import host_line

    torch.set_num_threads(1)  # as each child runs
    print(host_line("bf16"), flush=True)
    for label, pad, env in (("unpadded", 1, {}), ("padded to 64", 64, {}),
                            ("unpadded, ONEDNN_PRIMITIVE_CACHE_CAPACITY=0", 1, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"})):
        out = subprocess.run([sys.executable, __file__, "--head", str(counts), "--head-pad", str(pad), "--child"],
                             env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
        print(f"LM head, {counts} row counts, {label:<45} RSS growth {float(out.split()[-1]):7.1f} MB", flush=True)


def run_variant(variant: str, steps: int, every: int, sets: list[str]) -> dict:
    env = dict(os.environ)
    if variant != "plain":
        for item in variant.split(","):
            name, _, value = item.partition("=")
            env[name.strip()] = value.strip()
    cmd = [sys.executable, __file__, "--child", "--steps", str(steps), "--every", str(every)]
    if sets:
        cmd += ["--set", *sets]
    return child_summary(cmd, env, variant)


def child_summary(cmd: list[str], env: dict, variant: str) -> dict:
    """Run a variant's child process, echo its lines tagged with the variant, return its ``SUMMARY`` JSON line."""
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
    p.add_argument("--jobs", type=int, default=1, help="variants run at the same time")
    p.add_argument("--head", type=int, default=0, help="the LM head alone at this many row counts (see above)")
    p.add_argument("--head-pad", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.head and args.child:
        print(f"{head_child(args.head, args.head_pad):.1f}")
        return
    if args.head:
        head_variants(args.head)
        return
    if args.child:
        summary = child(args.steps, args.every, args.set)
        print("SUMMARY " + json.dumps(summary), flush=True)
        return
    variants = args.variant or ["plain"]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = pool.map(lambda v: run_variant(v, args.steps, args.every, args.set), variants)
        results = dict(zip(variants, done))
    print(f"\n{'variant':<40} {'1st sample':>10} {'1st eval':>8} {'end':>8} {'growth':>8} {'peak':>8}  (MB RSS; "
          "growth: end - 1st eval)")
    nan = float("nan")
    for v, s in results.items():
        growth = s["growth_after_first_eval_mb"]
        print(f"{v:<40} {s['first_sample_mb'] or nan:>10.1f} {s['first_eval_mb'] or nan:>8.1f} {s['end_mb']:>8.1f} "
              f"{nan if growth is None else growth:>8.1f} {s['peak_mb']:>8.1f}")


if __name__ == "__main__":
    main()
