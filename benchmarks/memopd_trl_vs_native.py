"""MemOPD on TRL (:class:`distill.trl.MemOPDTrainer`, ``loss_type="dapo"``) against the native ``train_memopd``
on the same rollouts: does TRL's gradient equal the native one however TRL cuts the batch?

    python benchmarks/memopd_trl_vs_native.py                  # GA 1, 4, 12 and 2 ranks; a few minutes on 2 cores
    python benchmarks/memopd_trl_vs_native.py --cases 1x1 1x4  # processes x gradient_accumulation_steps

Both trainers start from the same tiny student (seed 1), score against the same teacher (seed 2), see the same
episodes with the same lambda, AdamW settings (no clipping: the clip threshold is out of reach) and one optimizer
step per update. The native trainer samples the episodes (MemQA, ``rows_per_episode`` turns at most, an
``LLMPolicy`` seeded 0); each update's episodes are then shaped deterministically so that every term and every
batching hazard is present, and TRL is handed exactly those episodes through ``MemenvRollout`` (its sampler is
replaced by a replay of them):

- episodes cut short (3, 2, 3, 1 invocations of 3): TRL gets padding rows (``env_mask`` 0);
- responses cut to different lengths: the rows' completions differ in length;
- returns spread within every group (a fixed pseudo-random value per episode): the GRPO term is active.

The native run uses ``grpo_drop_zero_variance=False`` (TRL has no such option; the groups here all have a spread
anyway). Printed per case (ranks x accumulation, the micro-batch size being the generation batch / both): the
cosine between the two first-update gradients, their norm ratio, and the per-update distillation loss of each
trainer (the token mean over the update's batch, as each logs it) with the largest relative gap. The targets
are a cosine >= 0.99999, a norm ratio within 1e-4 of 1 and the 3-update distillation losses within 1%."""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {"objectives": 1, "hops": 2}
ROWS = 3  # rows_per_episode = the env's turn limit
GROUP = 2  # episodes per task seed (GRPO group)
TASKS = 2  # task seeds per update (per process x processes)
KEEP = (3, 2, 3, 1)  # invocations kept per episode, cycling: 3 of 12 rows are padding rows
MAX_NEW_TOKENS = 10
TARGETS = {"cosine": 0.99999, "norm": 1e-4, "trajectory": 0.01}


@dataclass
class Setup:
    """Everything both trainers share (picklable: a TRL worker process rebuilds the models from it)."""

    updates: int = 3
    lr: float = 3e-3
    distill_coef: float = 1.0
    seed: int = 0
    returns: str = "spread"  # "spread": a return per episode; "zero": every return 0 (only the distillation acts)


@dataclass
class Run:
    grads: list = field(default_factory=list)  # flat gradient per optimizer step (before the step)
    distill: list[float] = field(default_factory=list)  # logged distillation loss per update
    forward_rows: list[int] = field(default_factory=list)  # TRL: rows of each student forward (this rank)
    teacher_rows: list[int] = field(default_factory=list)  # TRL: rows of each teacher forward (this rank)


def tokenizer():
    from agents.llm.models.local import build_tokenizer, task_texts

    return build_tokenizer(task_texts("MemQA-v0", ENV, episodes=20, seed=10**6), vocab_size=600)


def student(tok):
    from agents.llm.models.local import build_tiny_model

    return build_tiny_model(tok, seed=1, hidden_size=32, layers=2, heads=2, max_positions=1024)


def teacher_model(tok):
    from agents.llm.models.local import build_tiny_model

    return build_tiny_model(tok, seed=2, hidden_size=32, layers=2, heads=2, max_positions=1024,
                            initializer_range=0.3)


def flat_grad(model):
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().double().clone()
                      for _, p in sorted(model.named_parameters())])


def shape(episodes, update: int, returns: str = "spread") -> None:
    """Cut episodes short, responses to different lengths, and give each episode a return (in place)."""
    for i, ep in enumerate(episodes):
        del ep.records[KEEP[(i + update) % len(KEEP)]:]
        for j, rec in enumerate(ep.records):
            n = len(rec.response_ids)
            keep = max(1, n - ((i * ROWS + j + update) % 3) * (n // 3))
            for name in ("response_ids", "response_logprobs", "action_mask", "memory_mask"):
                setattr(rec, name, getattr(rec, name)[:keep])
            rec.reward, rec.done = 0.0, False
        ep.records[-1].done = True
        if returns == "spread":  # a spread within every group
            ep.records[-1].reward = round(math.sin(7 * i + 3 * update + 1), 3)


def native_run(setup: Setup, tok, out_dir: str) -> tuple[Run, list[list]]:
    """``train_memopd`` for ``setup.updates`` updates on shaped episodes; returns its run and the episodes."""
    import torch

    import agents.llm.training.ppo as ppo
    from distill.trainer import MemOPDConfig, train_memopd

    cfg = MemOPDConfig(out_dir=out_dir, env_kwargs={**ENV, "max_turns": ROWS}, algo="grpo", updates=setup.updates,
                       episodes_per_update=TASKS * GROUP, group_size=GROUP, epochs=1, num_minibatches=1,
                       lr=setup.lr, grad_clip=1e9, weight_decay=0.0, max_new_tokens=MAX_NEW_TOKENS,
                       num_envs=TASKS * GROUP, eval_every=0, save_every=10**6, progress=False,
                       distill_coef=setup.distill_coef, packing="padded", seed=setup.seed, chunk=64,
                       grpo_drop_zero_variance=False)
    run, episodes = Run(), []
    model = student(tok)
    sample, original_step = ppo.rollout, torch.optim.AdamW.step

    def shaped_rollout(*args, **kwargs):
        batch = sample(*args, **kwargs)
        shape(batch, len(episodes), setup.returns)
        episodes.append(copy.deepcopy(batch))
        return batch

    def step(self, *a, **k):
        run.grads.append(flat_grad(model))
        return original_step(self, *a, **k)

    ppo.rollout, torch.optim.AdamW.step = shaped_rollout, step
    try:
        train_memopd(cfg, model=model, tokenizer=tok, teacher=teacher_model(tok))
    finally:
        ppo.rollout, torch.optim.AdamW.step = sample, original_step
    with open(Path(out_dir) / "metrics.csv") as fh:
        run.distill = [float(row["distill_loss"]) for row in csv.DictReader(fh) if row.get("distill_loss")]
    return run, episodes


def trl_run(setup: Setup, tok, episodes: list[list], accumulation: int, out_dir: str,
            loss_type: str = "dapo") -> Run:
    """``MemOPDTrainer`` on ``episodes`` (replayed) with ``accumulation`` micro-batches per optimizer step, in
    this process (one rank) or, under ``accelerate launch``, as one of its ranks. With every return 0 only the
    distillation term acts, whatever ``loss_type``."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    import agents.llm.adapters.trl as adapter
    from distill.teacher import Teacher
    from distill.trl import MemOPDTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    queue = [list(batch) for batch in episodes]

    def replay(policy, envs, seeds, groups=None, **kwargs):  # this update's episodes, by task seed
        pool = queue.pop(0)
        out = []
        for s in seeds:
            k = next(k for k, ep in enumerate(pool) if ep.seed == s)
            out.append(copy.deepcopy(pool.pop(k)))
        return out

    seeds = [s for batch in episodes for s in dict.fromkeys(ep.seed for ep in batch)]
    dataset = Dataset.from_dict({"prompt": [adapter.task_prompt("MemQA-v0", s) for s in seeds], "seed": seeds})
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    rows = TASKS * GROUP * ROWS // processes  # this rank's rows per update
    if rows % accumulation:
        raise ValueError(f"{rows} rows per rank do not split into {accumulation} micro-batches")
    args = trl.GRPOConfig(output_dir=out_dir, num_generations=GROUP * ROWS, per_device_train_batch_size=rows //
                          accumulation, gradient_accumulation_steps=accumulation, max_steps=setup.updates,
                          learning_rate=setup.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                          max_grad_norm=1e9, optim="adamw_torch", logging_steps=1, report_to=[], bf16=False,
                          max_completion_length=MAX_NEW_TOKENS, save_strategy="no", beta=0.0, seed=setup.seed,
                          disable_tqdm=True, use_cpu=True, shuffle_dataset=False, loss_type=loss_type)
    model = student(tok)
    run = Run()

    class Measure(TrainerCallback):
        def on_pre_optimizer_step(self, args_, state, control, **kw):
            run.grads.append(flat_grad(model))

    rollout = adapter.MemenvRollout("MemQA-v0", ENV, rows_per_episode=ROWS, max_new_tokens=MAX_NEW_TOKENS)
    teacher = Teacher(teacher_model(tok), tok, student_tokenizer=tok)
    trainer = MemOPDTrainer(model=model, teacher=teacher,
                            distill_coef=setup.distill_coef, reward_funcs=adapter.episode_return_reward, args=args,
                            train_dataset=dataset, processing_class=tok, rollout_func=rollout)
    trainer.add_callback(Measure())
    counts = [body.register_forward_pre_hook(lambda module, args, kwargs, rows=rows: rows.append(
        int(kwargs["input_ids"].shape[0])), with_kwargs=True)
        for body, rows in ((model.base_model, run.forward_rows), (teacher.model.base_model, run.teacher_rows))]
    sample = adapter.rollout
    adapter.rollout = replay
    try:
        torch.manual_seed(setup.seed)
        trainer.train()
    finally:
        adapter.rollout = sample
        for count in counts:
            count.remove()
    run.distill = [row["distill_loss"] for row in trainer.state.log_history if "distill_loss" in row]
    return run


def trl_run_ranks(setup: Setup, episodes: list[list], accumulation: int, processes: int, work: Path,
                  timeout: float = 600.0) -> Run:
    """:func:`trl_run` under ``accelerate launch --num_processes processes`` (gloo on CPU)."""
    import pickle

    import torch

    job = work / f"job_{processes}x{accumulation}"
    job.mkdir(parents=True, exist_ok=True)
    with open(job / "input.pkl", "wb") as fh:
        pickle.dump({"setup": setup, "episodes": episodes, "accumulation": accumulation}, fh)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu",
           "--main_process_port", str(29500 + os.getpid() % 1000 + processes * 7 + accumulation),
           str(Path(__file__).resolve()), "--worker", str(job)]
    proc = subprocess.Popen(cmd, env=env, cwd=job, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = proc.communicate(timeout=timeout)[0]
    finally:  # bounded: a hang is an error, not a stall
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the {processes}-rank TRL run failed:\n{log[-4000:]}")
    result = torch.load(job / "result.pt")
    return Run(grads=result["grads"], distill=result["distill"])


def _worker(job: str) -> None:
    import pickle

    import torch

    torch.set_num_threads(1)
    with open(Path(job) / "input.pkl", "rb") as fh:
        spec = pickle.load(fh)
    run = trl_run(spec["setup"], tokenizer(), spec["episodes"], spec["accumulation"], str(Path(job) / "out"))
    if int(os.environ.get("RANK", "0")) == 0:
        path = Path(job) / "result.pt"
        torch.save({"grads": run.grads, "distill": run.distill}, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)


def compare(native: Run, other: Run) -> dict[str, float]:
    """First-update gradient cosine and norm ratio (other / native); the largest relative gap of the
    per-update distillation losses."""
    import torch

    a, b = native.grads[0], other.grads[0]
    gaps = [abs(y / x - 1) for x, y in zip(native.distill, other.distill)]
    return {"cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
            "norm_ratio": float(b.norm() / a.norm()), "trajectory_gap": max(gaps) if gaps else math.nan,
            "updates": min(len(native.distill), len(other.distill))}


def meets_targets(row: dict[str, float], updates: int) -> bool:
    return (row["cosine"] >= TARGETS["cosine"] and abs(row["norm_ratio"] - 1) <= TARGETS["norm"]
            and row["trajectory_gap"] <= TARGETS["trajectory"] and row["updates"] == updates)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--distill-coef", type=float, default=1.0)
    parser.add_argument("--cases", nargs="+", default=["1x1", "1x4", "1x12", "2x1", "2x3"],
                        help="PROCESSESxACCUMULATION (the per-rank micro-batch: 12 rows / processes / accumulation)")
    parser.add_argument("--returns", choices=["spread", "zero"], default="spread",
                        help="zero: every return 0, so only the distillation term acts")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
    import torch
    import trl

    from agents.llm.models.precision import host_line

    torch.set_num_threads(1)
    setup = Setup(updates=args.updates, lr=args.lr, distill_coef=args.distill_coef, returns=args.returns)
    print(host_line("none", "cpu") + f" (fp32, 1 thread); trl {trl.__version__}; {TASKS} tasks x {GROUP} episodes x "
          f"{ROWS} rows per update (invocations kept {KEEP}), lambda={setup.distill_coef}, lr={setup.lr}")
    tok = tokenizer()
    work = Path(tempfile.mkdtemp(prefix="memopd_trl_vs_native_"))
    native, episodes = native_run(setup, tok, str(work / "native"))
    rows = [len(ep.records) for batch in episodes for ep in batch]
    print(f"native: distill_loss per update {' '.join(f'{v:.5f}' for v in native.distill)}; invocations per "
          f"episode {rows[:TASKS * GROUP]} (update 1); returns "
          f"{[round(ep.reward, 3) for ep in episodes[0]]}")
    print(f"{'ranks x accum':>14} {'rows/micro':>10} {'cosine':>12} {'norm ratio':>11} {'distill_loss per update':>30}"
          f" {'max gap':>8}  ok")
    ok = True
    for case in args.cases:
        processes, accumulation = (int(v) for v in case.split("x"))
        if processes == 1:
            other = trl_run(setup, tok, episodes, accumulation, str(work / f"trl_{case}"))
        else:
            other = trl_run_ranks(setup, episodes, accumulation, processes, work)
        row = compare(native, other)
        good = meets_targets(row, setup.updates)
        ok &= good
        micro = TASKS * GROUP * ROWS // processes // accumulation
        print(f"{case:>14} {micro:>10} {row['cosine']:12.9f} {row['norm_ratio']:11.8f} "
              f"{' '.join(f'{v:.5f}' for v in other.distill):>30} {row['trajectory_gap']:8.2e}  "
              f"{'yes' if good else 'NO'}")
    print(json.dumps({"targets": TARGETS}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
