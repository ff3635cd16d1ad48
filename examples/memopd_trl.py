"""MemOPD on TRL: GRPO + lambda x the teacher's full-vocabulary reverse KL, one row per invocation
(:class:`distill.trl.MemOPDTrainer`, ``pip install -e '.[trl]'``).

CPU, tiny checkpoints that share one tokenizer (teacher trained longer than the student)::

    memenv train --algo sft --out runs/teacher --steps 600
    memenv train --algo sft --out runs/student --steps 100
    python examples/memopd_trl.py --teacher runs/teacher/checkpoint-0000600 \\
        --student runs/student/checkpoint-0000100 --steps 8

Several CPU processes (gloo)::

    accelerate launch --multi_gpu --num_processes 2 examples/memopd_trl.py --teacher T --student S --steps 8

GPUs with vLLM generation and DeepSpeed ZeRO or FSDP (docs/distill_scale.md, "MemOPD on TRL"; not run here: no GPU)::

    accelerate launch --config_file zero2.yaml examples/memopd_trl.py --teacher /models/Qwen2.5-7B-Instruct \\
        --student /models/Qwen2.5-1.5B-Instruct --use-vllm --bf16 --steps 200 --max-new-tokens 256

Each dataset prompt is one task seed; ``num_generations = episodes_per_group x rows_per_episode`` rows hold that
many episodes of the task, one row per invocation (the exact prompt ids of that turn and the sampled ids), short
episodes padded with rows that carry no loss. The distillation term covers the trained completion tokens
(``completion_mask x env_mask``); lambda (``--lambda``) weighs it as ``MemOPDConfig.distill_coef`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", required=True, help="teacher checkpoint (same tokenizer as the student)")
    p.add_argument("--student", required=True, help="student checkpoint")
    p.add_argument("--out", default="runs/memopd_trl")
    p.add_argument("--objectives", type=int, default=1)
    p.add_argument("--hops", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=4, help="the env's turn limit = rows per episode")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--episodes-per-group", type=int, default=4, help="episodes per task seed (the GRPO group)")
    p.add_argument("--batch-tasks", type=int, default=2, help="task seeds per step and process")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per invocation")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lambda", dest="distill_coef", type=float, default=1.0, help="weight of the distillation term")
    p.add_argument("--loss", default="reverse_kl", choices=["reverse_kl", "forward_kl", "jsd"])
    p.add_argument("--beta", type=float, default=0.5, help="JSD(beta)")
    p.add_argument("--top-k", type=int, default=None, help="teacher top-k approximation (default: exact)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--use-vllm", action="store_true", help="sample with vLLM (GPU; colocate mode)")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16
    import trl

    from agents.llm.models.local import load_pretrained
    from agents.llm.adapters.trl import MemenvRollout, episode_return_reward, vllm_generation_kwargs
    from distill.losses import DistillLossConfig
    from distill.trl import MemOPDTrainer

    model, tokenizer = load_pretrained(args.student)
    rollout = MemenvRollout("MemQA-v0", {"objectives": args.objectives, "hops": args.hops,
                                         "max_turns": args.max_turns}, max_new_tokens=args.max_new_tokens)
    rows = rollout.rows_per_episode
    extra = {"use_vllm": True, "vllm_mode": "colocate", "generation_kwargs": vllm_generation_kwargs()} \
        if args.use_vllm else {}
    config = trl.GRPOConfig(
        output_dir=args.out, num_generations=args.episodes_per_group * rows,
        per_device_train_batch_size=args.batch_tasks * args.episodes_per_group * rows, max_steps=args.steps,
        learning_rate=args.lr, temperature=args.temperature, max_completion_length=args.max_new_tokens,
        beta=0.0, logging_steps=1, save_strategy="no", report_to=[], bf16=args.bf16,
        mask_truncated_completions=False, **extra)
    trainer = MemOPDTrainer(
        model=model, teacher=args.teacher, distill_coef=args.distill_coef,
        distill_loss=DistillLossConfig(kind=args.loss, beta=args.beta, top_k=args.top_k),
        reward_funcs=episode_return_reward, args=config, train_dataset=rollout.dataset(max(64, 4 * args.steps)),
        processing_class=tokenizer, rollout_func=rollout)
    trainer.train()
    trainer.save_model(args.out)
    logged = [row for row in trainer.state.log_history if "distill_loss" in row]
    result = {"steps": trainer.state.global_step, "distill_loss": [row["distill_loss"] for row in logged],
              "reward": [row.get("reward") for row in logged]}
    if trainer.accelerator.is_main_process:
        print(result)
    return result


if __name__ == "__main__":
    main()
