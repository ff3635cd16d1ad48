"""GRPO with TRL on MemQA-v0 through memenv's rollout_func (``pip install -e '.[trl]'``).

CPU, tiny model (no hub, no GPU)::

    python examples/trl_grpo_memqa.py                       # make_tiny model, 8 GRPO steps: shows the plumbing
    python examples/trl_grpo_memqa.py --sft-steps 300 --steps 50   # plumbing too: the return stays 0 (below)
    memenv train --algo sft --out runs/sft --steps 2000 --threads 1 && \\
        python examples/trl_grpo_memqa.py --model runs/sft/checkpoint-0002000 --steps 50   # a start that answers

A random tiny model almost never emits a valid action, so its episode returns are all 0 and GRPO has no
signal (every advantage is 0). Neither has ``--sft-steps 300`` (measured for issue 65, 20 GRPO steps: 148 s wall,
1.55 GB, an episode return of 0 at every step, every group's rewards equal, completions clipped at 48 tokens):
300 behaviour-cloning steps of its d=64 model (2 hops, ``SFTConfig``'s defaults otherwise) write no valid action yet.
What the return needs to move: a start whose sampled episodes score F1 > 0 in some of a step's groups. The
README's tiny agent is one (the chain above: 46 CPU-min of SFT, held-out F1 0.57; its F1 starts rising near step
650, docs/llm_agents.md), on the example's default task (1 objective, 2 hops); GRPO from it has not been measured
here. A reward the start can already earn moves it sooner: docs/own_algorithm.md's RLOO, on a 1-hop task with
``invalid_penalty=0.25`` (malformed actions cost), raised the mean return by 0.21-0.42 (3 seeds) from 200
behaviour-cloning steps of a d=64 model in 7.8-8.6 CPU-min a run, F1 staying near 0 (this example's env takes
``objectives`` and ``hops`` only, so its return is F1 alone).

A real checkpoint on a GPU with vLLM (colocated in the training process; trl 1.16, ``pip install vllm``)::

    python examples/trl_grpo_memqa.py --model /path/to/Qwen2.5-1.5B-Instruct --sft-steps 0 \\
        --use-vllm --bf16 --steps 200 --episodes-per-group 8 --batch-tasks 4 --max-new-tokens 256 \\
        --objectives 2

    # several GPUs: accelerate launch --num_processes 4 examples/trl_grpo_memqa.py ... (vllm_mode colocate)

How the pieces fit (see agents/llm/adapters/trl.py): each dataset prompt is one task seed; ``num_generations =
episodes_per_group x rows_per_episode`` row slots hold that many episodes of the task, one row per invocation
(each invocation is its own sequence: the prompt is that turn's observation with the rewritten memory), short
episodes padded with rows that carry no loss; every row carries its episode's return, so GRPO's group
baseline is over episodes and all rows of an episode share one advantage. Sampling happens at
``GRPOConfig.temperature`` (TRL recomputes log-probs at that temperature) and actions stop at
``</search>``/``</answer>``, so ``mask_truncated_completions`` must stay off. The vLLM path is untested here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="local checkpoint path (default: build a tiny model)")
    p.add_argument("--out", default="runs/trl_grpo_memqa")
    p.add_argument("--objectives", type=int, default=1)
    p.add_argument("--hops", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=0, help="oracle behaviour cloning before GRPO (tiny model)")
    p.add_argument("--steps", type=int, default=8, help="GRPO optimizer steps")
    p.add_argument("--episodes-per-group", type=int, default=4, help="episodes per task seed (the GRPO group)")
    p.add_argument("--batch-tasks", type=int, default=2, help="task seeds per step")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per invocation")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--use-vllm", action="store_true", help="sample with vLLM (GPU; colocate mode)")
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from agents.llm.models.local import load_pretrained, make_tiny
    from agents.llm.adapters.trl import MemenvRollout, episode_return_reward, vllm_generation_kwargs

    env_kwargs = {"objectives": args.objectives, "hops": args.hops}
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.model:
        model, tokenizer = load_pretrained(args.model)
    elif args.sft_steps > 0:
        from agents.llm.training.sft import SFTConfig, train_sft
        from agents.llm.training.common import latest_checkpoint

        sft = SFTConfig(env_kwargs=env_kwargs, out_dir=f"{args.out}/sft", steps=args.sft_steps, episodes=400,
                        eval_every=args.sft_steps, eval_episodes=16, save_every=args.sft_steps, tiny_vocab=1024,
                        tiny_hidden=64, tiny_layers=2)
        print("SFT warm-up:", train_sft(sft))
        model, tokenizer = load_pretrained(latest_checkpoint(sft.out_dir))
    else:
        model, tokenizer = make_tiny(env_kwargs=env_kwargs, episodes=100, vocab_size=1024, hidden_size=64, layers=2)

    rollout = MemenvRollout("MemQA-v0", env_kwargs, max_new_tokens=args.max_new_tokens)
    rows = rollout.rows_per_episode
    num_generations = args.episodes_per_group * rows
    config = GRPOConfig(
        output_dir=f"{args.out}/grpo", max_steps=args.steps, learning_rate=args.lr, temperature=args.temperature,
        num_generations=num_generations, per_device_train_batch_size=args.batch_tasks * num_generations,
        max_completion_length=args.max_new_tokens, beta=0.0, logging_steps=1, save_strategy="no", report_to=[],
        bf16=args.bf16, mask_truncated_completions=False, use_vllm=args.use_vllm, vllm_mode="colocate",
        generation_kwargs=vllm_generation_kwargs() if args.use_vllm else None, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=episode_return_reward, args=config, processing_class=tokenizer,
                          train_dataset=rollout.dataset(max(64, args.steps * args.batch_tasks)), rollout_func=rollout)
    print(f"rows_per_episode={rows} (MemQA turn limit), num_generations={num_generations}, "
          f"{args.batch_tasks} tasks x {args.episodes_per_group} episodes per step")
    result = trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    if rewards:
        k = max(1, len(rewards) // 4)
        print(f"mean episode return: first {k} steps {sum(rewards[:k]) / k:.3f}, last {k} steps "
              f"{sum(rewards[-k:]) / k:.3f}")
    return {"train_loss": result.training_loss, "rewards": rewards}


if __name__ == "__main__":
    main()
