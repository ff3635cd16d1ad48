"""A tiny LLM agent on MemQA, end to end on CPU (no hub, no GPU).

    python examples/llm_tiny_memqa.py --steps 300 --updates 5   # 11-22 wall-min, 650-1,280 CPU-s, 3.4-3.6 GB peak

Measured twice with `/usr/bin/time -v`, one torch thread: 11 wall-min, 648 CPU-s, 3.6 GB on a quiet 2-core machine
(issue 65's); 21.5 wall-min, 1,276 CPU-s (SFT 721 + its evaluation 68, GRPO 414), 3.4 GB on this project's
AVX2-only dev host without native bf16 (AMD EPYC, fp32, load 1.4-1.9 of 2 cores, 2026-12-07). At 300 SFT steps the
d=64 model does not yet act validly (held-out F1 0.000, every action invalid); GRPO's last update then saw reward
0.031 on its training episodes: this example shows the pipeline, not a trained agent (README: ~2,000 steps).

1. builds a byte-level BPE tokenizer from oracle trajectories and a small Qwen2 model (agents.llm.models.local);
2. behaviour-clones the oracle (agents.llm.training.sft), evaluating held-out F1 with greedy decoding;
3. fine-tunes with GRPO (agents.llm.training.ppo) from that checkpoint;
4. samples one episode and prints its invocation records (token-exact: ids, behaviour log-probs, masks).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/example_llm")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--updates", type=int, default=5)
    args = p.parse_args()
    import gymnasium as gym
    import torch

    import memenv  # noqa: F401
    from agents.llm.generation.policy import LLMPolicy, sequence_logprobs
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.ppo import PPOConfig, train_rl
    from agents.llm.records.rollouts import rollout
    from agents.llm.training.sft import SFTConfig, train_sft
    from agents.llm.training.common import latest_checkpoint

    torch.set_num_threads(1)
    env_kwargs = {"objectives": 1, "hops": 2}
    sft = SFTConfig(env_kwargs=env_kwargs, out_dir=f"{args.out}/sft", steps=args.steps, episodes=1000,
                    eval_every=max(1, args.steps // 3), eval_episodes=32, save_every=args.steps)
    print("SFT:", train_sft(sft))
    start = latest_checkpoint(sft.out_dir)
    grpo = PPOConfig(algo="grpo", model=str(start), env_kwargs=env_kwargs, out_dir=f"{args.out}/grpo",
                     updates=args.updates, episodes_per_update=32, group_size=8, eval_every=args.updates,
                     eval_episodes=32, save_every=args.updates, lr=2e-4)
    print("GRPO:", train_rl(grpo))

    model, tok = load_pretrained(latest_checkpoint(grpo.out_dir))
    policy = LLMPolicy(model, tok, temperature=1.0, max_new_tokens=96, seed=0)
    episode = rollout(policy, [gym.make("MemQA-v0", **env_kwargs)], [12345])[0]
    print(f"\nepisode {episode.episode_id}: reward {episode.reward:.3f}, {episode.turns} invocations")
    for r in episode.records:
        check = (sequence_logprobs(model, r.prompt_ids, r.response_ids, r.temperature)
                 - torch.tensor(r.response_logprobs)).abs().max().item()
        print(f"  turn {r.turn}: {len(r.prompt_ids)} prompt ids, {len(r.response_ids)} sampled ids "
              f"({sum(r.memory_mask)} in <memory>), max |re-scored - behaviour logprob| {check:.1e}")
        print(f"    action: {r.snapshot['action'][:150]!r}")


if __name__ == "__main__":
    main()
