"""What the README's SmolLM2 SFT command's peak memory is made of, phase by phase (issue 51).

    python benchmarks/smol_sft_memory.py                            # 3 steps, 2 checkpoints, 16 eval episodes
    python benchmarks/smol_sft_memory.py --steps 2 --save-every 1 --eval-episodes 0 \
        --variant plain --variant gradient_checkpointing=false     # with and without activation checkpointing
    mkdir /tmp/base && git archive f69a324 agents memenv tasks distill | tar -x -C /tmp/base  # the code before issue 51's changes
    python benchmarks/smol_sft_memory.py --variant code=/tmp/base,gradient_checkpointing=false --variant plain

Each variant runs, in a fresh Python process (so peaks compare like with like), the config the README's command
builds (:data:`README_ARGS`, through the CLI's own parser: ``memenv train --algo sft --model smollm2-135m-instruct
... --threads 1``) with ``--steps``, ``--save-every`` and the evaluation shortened (``--eval-episodes``: the
evaluation's peak is one batch of ``num_envs`` episodes, so 16 show it; 0: no evaluation) and ``OUT`` a temporary
folder. A variant is ``plain`` or ``--set`` items joined by commas (``gradient_checkpointing=true``), and may
start with ``code=DIR,``: the packages imported from ``DIR`` (e.g. an export of an earlier commit: the "before"
of a side-by-side run).

A thread samples the resident set every 5 ms; hooks on the model and the optimizer mark the phases (model load,
demonstrations, each step's forward, loss + backward, optimizer step, each checkpoint write, the evaluation).
Printed per variant: the host line, each phase's peak and its RSS at the end, the bytes saved for the backward
(``torch.autograd.graph.saved_tensors_hooks``: activations plus autocast's bf16 weight copies, parameters
excluded), the sizes of weights, gradients and Adam's state, the files of one checkpoint, and the CPU seconds of
each step (``time.process_time``). Figures: docs/real_models.md ("Memory and disk of the real-model commands").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sft_memory import child_summary, peak_mb, rss_mb  # benchmarks/ is on sys.path

#: the README's SmolLM2 SFT command, as its arguments (tests/test_readme.py checks the README still says this)
README_ARGS = ("train --algo sft --model smollm2-135m-instruct --kw objectives=1 hops=1 question_split=train "
               "--episodes 400 --steps 60 --batch-size 4 --lr 1e-4 --save-every 20 --eval-every 100000 "
               "--max-new-tokens 64 --out runs/smol_sft --set warmup=5 gradient_checkpointing=true --threads 1").split()


class Phases:
    """The RSS sampled every 5 ms, its peak per named phase."""

    def __init__(self) -> None:
        self.name, self.rows, self.peak = "start", [], rss_mb()
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.done.is_set():
            now = rss_mb()
            with self.lock:
                self.peak = max(self.peak, now)
            time.sleep(0.005)

    def mark(self, name: str) -> None:
        """End the current phase (its peak and its RSS now) and start ``name``."""
        now = rss_mb()
        with self.lock:
            self.rows.append({"phase": self.name, "peak_mb": round(max(self.peak, now), 1), "end_mb": round(now, 1),
                              "cpu_s": round(time.process_time(), 2)})
            print(json.dumps(self.rows[-1]), flush=True)  # as it goes: a slow run shows where it is
            self.name, self.peak = name, now


def child(steps: int, save_every: int, eval_episodes: int, sets: list[str]) -> dict:
    import torch

    import agents.llm.training.sft as sft
    from agents.llm.training.cli import build_config, check_setup, register_cli
    from agents.llm.models.precision import host_line
    from agents.llm.models.pretrained import default_folder, is_registered

    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    out = tempfile.mkdtemp(prefix="smol_sft_memory_")
    argv = [*README_ARGS, "--quiet", "--steps", str(steps), "--save-every", str(save_every),
            "--eval-episodes", str(max(1, eval_episodes))]
    argv[argv.index("--out") + 1] = out
    sets_end = argv.index("--set") + 1
    while sets_end < len(argv) and not argv[sets_end].startswith("--"):
        sets_end += 1
    argv[sets_end:sets_end] = [*sets, *([] if eval_episodes else ["eval_every=0"])]  # after the README's: they win
    cfg = build_config(parser.parse_args(argv))
    # the prepared folder (`memenv models prepare`), found without the package that ships the GGUF
    cfg.model = str(default_folder(cfg.model)) if is_registered(cfg.model) else cfg.model
    check_setup(cfg)
    phases = Phases()
    info: dict = {"saved_for_backward_mb": [], "step_cpu_s": []}
    setup, expert, save, evaluate, step_fn = (sft.sft_setup, sft.expert_data, sft._save, sft.evaluate_off_budget,
                                              sft.sft_step)

    def mb(tensors) -> float:
        return round(sum(t.numel() * t.element_size() for t in tensors) / 2**20, 1)

    def traced_setup(cfg_, data):
        phases.mark("model load, optimizer")
        run = setup(cfg_, data)
        info["host"] = host_line(run.autocast, run.dist.device)
        params = list(run.model.parameters())
        info["weights_mb"] = mb(params)
        run.train_model.register_forward_pre_hook(lambda *a: phases.mark("forward"))
        run.train_model.register_forward_hook(lambda *a: phases.mark("loss, backward, clip"))
        run.optimizer.register_step_pre_hook(lambda *a: phases.mark("optimizer step"))
        run.optimizer.register_step_post_hook(lambda *a: phases.mark("between steps (batch)"))
        info["params"] = {p.untyped_storage().data_ptr() for p in params}
        info["run"] = run
        return run

    def traced_expert(*a, **k):
        phases.mark("demonstrations")
        data = expert(*a, **k)
        lengths = sorted(len(d.prompt_ids) + len(d.response_ids) for d in data)
        info["demonstrations"] = {"n": len(data), "median_tokens": lengths[len(lengths) // 2], "max_tokens": lengths[-1]}
        phases.mark("envs, log")
        return data

    def traced_step(cfg_, run, batch, step):
        saved: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in info["params"]:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        started = time.process_time()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = step_fn(cfg_, run, batch, step)
        info["step_cpu_s"].append(round(time.process_time() - started, 2))
        info["saved_for_backward_mb"].append(round(sum(saved.values()) / 2**20, 1))
        info.setdefault("batch_widths", []).append(list(batch.input_ids.shape))
        return result

    def traced_save(cfg_, dist, out_, step, *a, **k):
        phases.mark(f"checkpoint write (step {step})")
        save(cfg_, dist, out_, step, *a, **k)
        phases.mark("after the write")

    def traced_eval(*a, **k):
        phases.mark("evaluation")
        result = evaluate(*a, **k)
        phases.mark("after the evaluation")
        return result

    sft.sft_setup, sft.expert_data, sft._save, sft.evaluate_off_budget, sft.sft_step = (
        traced_setup, traced_expert, traced_save, traced_eval, traced_step)
    try:
        sft.train_sft(cfg)
        phases.mark("end")
        phases.done.set()
        run = info.pop("run")
        info.pop("params")
        info["grads_mb"] = mb(p.grad for p in run.model.parameters() if p.grad is not None)
        info["adam_state_mb"] = mb(v for s in run.optimizer.state.values() for v in s.values()
                                   if isinstance(v, torch.Tensor))
        ckpts = sorted(p for p in os.listdir(out) if p.startswith("checkpoint-"))
        info["checkpoints_kept"] = ckpts
        info["checkpoint_files_mb"] = {f: round(os.path.getsize(os.path.join(out, ckpts[-1], f)) / 2**20, 1)
                                       for f in sorted(os.listdir(os.path.join(out, ckpts[-1])))}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"phases": phases.rows, "peak_mb": round(peak_mb(), 1), **info}


def run_variant(variant: str, args) -> dict:
    sets = [] if variant == "plain" else [s.strip() for s in variant.split(",")]
    env = dict(os.environ)
    if sets and sets[0].startswith("code="):
        code = os.path.abspath(sets.pop(0)[len("code="):])
        env["PYTHONPATH"] = os.pathsep.join([code, os.path.dirname(os.path.abspath(__file__))])
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--save-every", str(args.save_every),
           "--eval-episodes", str(args.eval_episodes), "--set", *sets]
    return child_summary(cmd, env, variant)


def report(variant: str, s: dict) -> None:
    print(f"\n== {variant}: {s['host']}")
    print(f"{'phase':<32} {'peak MB':>9} {'end MB':>9} {'CPU-s':>8}")
    for row in s["phases"]:
        print(f"{row['phase']:<32} {row['peak_mb']:>9.1f} {row['end_mb']:>9.1f} {row['cpu_s']:>8.1f}")
    print(f"peak RSS (ru_maxrss) {s['peak_mb']:.1f} MB; weights {s['weights_mb']} MB, gradients {s['grads_mb']} MB, "
          f"Adam state {s['adam_state_mb']} MB")
    print(f"saved for backward per step (MB): {s['saved_for_backward_mb']}; batch shapes {s['batch_widths']}")
    print(f"CPU-s per step: {s['step_cpu_s']}; demonstrations {s['demonstrations']}")
    print(f"checkpoints kept {s['checkpoints_kept']}; the newest holds (MB) {s['checkpoint_files_mb']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--eval-episodes", type=int, default=16)
    p.add_argument("--set", nargs="*", default=[], help=argparse.SUPPRESS)
    p.add_argument("--variant", action="append", help="plain, or KEY=VALUE[,KEY=VALUE] config fields (repeat)")
    p.add_argument("--jobs", type=int, default=1, help="variants run at the same time")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        summary = child(args.steps, args.save_every, args.eval_episodes, args.set)
        print("SUMMARY " + json.dumps(summary), flush=True)
        return
    variants = args.variant or ["plain"]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = dict(zip(variants, pool.map(lambda v: run_variant(v, args), variants)))
    for variant, summary in results.items():
        report(variant, summary)


if __name__ == "__main__":
    main()
