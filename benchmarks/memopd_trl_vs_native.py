"""MemOPD on TRL (:class:`distill.trl.MemOPDTrainer`) against ``train_memopd`` on the tiny MemQA task: same student
initialisation, same teacher, same task seeds, same lambda, optimizer settings and one optimizer step per update.

    python benchmarks/memopd_trl_vs_native.py            # about a minute on 2 cores
    python benchmarks/memopd_trl_vs_native.py --updates 5 --lr 3e-3

What it prints, per trainer: the on-policy distillation loss (reverse KL of the student against the teacher on
episodes the *current* student samples on held-out seeds, the objective MemOPD lowers) before training and after
each update, and the cosine between the two trainers' first-update gradients. Both samplers are an
``LLMPolicy`` seeded 0 on the same task seeds with the same initial weights, so the first update's episodes are
the same ones; later updates sample from slightly different weights. The claim checked is the direction: both
lower the loss, and their first gradients point the same way (cosine > 0). With rewards the magnitudes differ
by construction: TRL's ``grpo`` loss averages per sequence then over rows, ``train_memopd`` over action tokens
(the tiny random student earns reward 0, so here only the distillation term acts); TRL pads each episode to
``rows_per_episode`` rows (no loss on padding)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {"objectives": 1, "hops": 2, "max_turns": 2}


def _flat(model):
    import torch

    return torch.cat([p.detach().flatten().float().clone() for _, p in sorted(model.named_parameters())])


def _flat_grad(model):
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().float().clone()
                      for _, p in sorted(model.named_parameters())])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--distill-coef", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import gymnasium as gym
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    import memenv  # noqa: F401 - registers the environments
    from agents.llm.models import build_tiny_model, build_tokenizer, load_pretrained, task_texts
    from agents.llm.policy import LLMPolicy
    from agents.llm.ppo import task_seeds
    from agents.llm.precision import host_line
    from agents.llm.rollouts import records_of, rollout
    from agents.llm.training import latest_checkpoint
    from agents.llm.trl import MemenvRollout, episode_return_reward, task_prompt
    from distill.losses import DistillLossConfig
    from distill.teacher import ScoringLayout, Teacher
    from distill.trainer import MemOPDConfig, distillation_loss, train_memopd
    from distill.trl import MemOPDTrainer

    torch.set_num_threads(args.threads)
    print(host_line("none", "cpu") + f" (fp32, {args.threads} thread(s)); trl {trl.__version__}")
    tok = build_tokenizer(task_texts("MemQA-v0", {"objectives": 1, "hops": 2}, episodes=20, seed=10**6),
                          vocab_size=600)

    def student():
        return build_tiny_model(tok, seed=1, hidden_size=32, layers=2, heads=2, max_positions=1024)

    teacher_lm = build_tiny_model(tok, seed=2, hidden_size=32, layers=2, heads=2, max_positions=1024,
                                  initializer_range=0.3)
    teacher = Teacher(teacher_lm, tok, student_tokenizer=tok)
    layout, loss = ScoringLayout("aligned", "padded"), DistillLossConfig()

    def on_policy_loss(model):
        envs = [gym.make("MemQA-v0", **ENV) for _ in range(4)]
        policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=10, seed=99)
        records = records_of(rollout(policy, envs, [10**7 + i for i in range(8)]))
        return distillation_loss(model, teacher, records, layout, loss)

    cfg = MemOPDConfig(out_dir=tempfile.mkdtemp(prefix="memopd_native_"), env_kwargs=ENV, algo="grpo",
                       updates=1, episodes_per_update=4, group_size=2, epochs=1, num_minibatches=1, lr=args.lr,
                       max_new_tokens=10, num_envs=4, eval_every=0, save_every=10**6, progress=False,
                       distill_coef=args.distill_coef, packing="padded", seed=args.seed, chunk=64)
    # the same task seeds for both: train_memopd's per-update seeds (update u), as TRL dataset prompts
    seeds = [s for u in range(args.updates) for s in dict.fromkeys(task_seeds(cfg, u, 0)[0])]

    results = {}
    # ---- train_memopd: one update per call (resume continues it), the loss measured in between
    native = student()
    start = _flat(native)
    curve = [on_policy_loss(native)]
    first_grad = []
    original_step = torch.optim.AdamW.step

    def step(self, *a, **k):  # the gradient of the first update, before the optimizer acts
        if not first_grad:
            first_grad.append(_flat_grad(native))
        return original_step(self, *a, **k)

    for u in range(args.updates):
        torch.optim.AdamW.step = step
        try:
            train_memopd(MemOPDConfig(**{**cfg.__dict__, "updates": u + 1, "resume": u > 0, "save_every": 1}),
                         model=native if u == 0 else None, tokenizer=tok, teacher=teacher_lm)
        finally:
            torch.optim.AdamW.step = original_step
        native, _ = load_pretrained(latest_checkpoint(Path(cfg.out_dir)))
        if u == 0:
            first_delta = _flat(native) - start
        curve.append(on_policy_loss(native))
    results["train_memopd"] = (curve, first_delta, first_grad[0])

    # ---- MemOPDTrainer: one optimizer step per generation batch (2 tasks x 2 episodes x 2 rows)
    trl_student = student()
    rows = 2
    dataset = Dataset.from_dict({"prompt": [task_prompt("MemQA-v0", s) for s in seeds], "seed": seeds})
    grpo = trl.GRPOConfig(output_dir=tempfile.mkdtemp(prefix="memopd_trl_"), num_generations=2 * rows,
                          per_device_train_batch_size=4 * rows, max_steps=args.updates, learning_rate=args.lr,
                          lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                          report_to=[], bf16=False, max_completion_length=10, save_strategy="no", beta=0.0,
                          seed=args.seed, disable_tqdm=True, use_cpu=True, shuffle_dataset=False)
    trainer = MemOPDTrainer(model=trl_student, teacher=teacher, distill_coef=args.distill_coef,
                            reward_funcs=episode_return_reward, args=grpo, train_dataset=dataset,
                            processing_class=tok, rollout_func=MemenvRollout("MemQA-v0", ENV, rows_per_episode=rows))
    start = _flat(trl_student)
    curve = [on_policy_loss(trl_student)]
    deltas = []

    grads = []

    class Measure(TrainerCallback):
        def on_pre_optimizer_step(self, args_, state, control, **kw):
            grads.append(_flat_grad(trl_student))

        def on_step_end(self, args_, state, control, **kw):
            deltas.append(_flat(trl_student) - start)
            curve.append(on_policy_loss(trl_student))

    trainer.add_callback(Measure())
    trainer.train()
    first_delta = deltas[0]
    results["MemOPDTrainer (TRL)"] = (curve, first_delta, grads[0])

    print(f"on-policy distillation loss (reverse KL, 8 held-out episodes), lambda={args.distill_coef}, "
          f"lr={args.lr}, {args.updates} updates")
    print(f"{'trainer':>22} " + " ".join(f"{'u' + str(u):>7}" for u in range(args.updates + 1)) + f" {'change':>8}")
    for name, (curve, _, _) in results.items():
        print(f"{name:>22} " + " ".join(f"{v:7.4f}" for v in curve) + f" {curve[-1] / curve[0] - 1:+8.1%}")
    (_, da, ga), (_, db, gb) = results.values()
    cosine = float(torch.nn.functional.cosine_similarity(ga, gb, dim=0))
    step_cosine = float(torch.nn.functional.cosine_similarity(da, db, dim=0))
    print(f"first update: cosine of the two gradients {cosine:.6f} (norms {ga.norm():.4f} vs {gb.norm():.4f}, "
          f"max |difference| {float((ga - gb).abs().max()):.2e}); "
          f"of the weight changes {step_cosine:.3f} (Adam's first step is close to lr x sign(gradient))")
    same = all(c[-1] < c[0] for c, _, _ in results.values()) and cosine > 0
    print("direction: " + ("the same (both lower the loss; first updates point the same way)" if same else
                           "NOT the same"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
