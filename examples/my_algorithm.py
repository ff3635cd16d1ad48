"""Your own RL algorithm on memenv, top to bottom (docs/own_algorithm.md): RLOO, REINFORCE with a leave-one-out
baseline, written against memenv's public pieces: envs -> ``rollout`` -> invocation records -> the loss below -> an
optimizer step.

    python examples/my_algorithm.py --out runs/my_algorithm                # 8.5 CPU-min: mean return -0.51 -> -0.11
    python examples/my_algorithm.py --start runs/sft/checkpoint-0002000 --env-kwargs '{"objectives": 1, "hops": 2}'  # not measured

Without ``--start`` it first behaviour-clones the oracle for ``--sft-steps`` steps (a fresh tiny model writes no
valid action, so RL would see no reward); ``--start`` takes any checkpoint instead (``memenv train --algo sft``).
Measured (docs/own_algorithm.md): on 1-hop MemQA with ``invalid_penalty=0.25`` the mean return of the first 5 vs
the last 5 of 25 updates went -0.51 -> -0.11, -0.47 -> -0.04, -0.42 -> -0.21 (seeds 0, 1, 2; without learning,
``--lr 0``: -0.54 -> -0.49), 7.8-8.6 CPU-min a run, 1 thread, fp32, AVX2 CPU, peak RSS < 1 GB. What it learns in
minutes is the protocol (malformed actions cost), not the answers: F1 stays near 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Args:
    out: str = "runs/my_algorithm"
    start: str = ""  # a checkpoint to start from; "" = a fresh tiny model behaviour-cloned for sft_steps
    env_kwargs: dict = field(default_factory=lambda: {"objectives": 1, "hops": 1, "comparison_rate": 0.0,
                                                      "invalid_penalty": 0.25})
    sft_steps: int = 200
    sft_episodes: int = 1000  # oracle demonstrations for those steps
    updates: int = 25
    tasks_per_update: int = 4  # task seeds per update, each played group_size times
    group_size: int = 8
    lr: float = 1e-3
    temperature: float = 1.0
    max_new_tokens: int = 48
    micro_batch: int = 8  # records per forward/backward (gradients accumulate: one optimizer step per update)
    seed: int = 0
    threads: int = 1


def rloo_advantages(episodes) -> None:
    """Each episode's return minus the mean return of the other episodes of its group, on each of its records."""
    groups = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    for members in groups.values():
        total = sum(ep.reward for ep in members)
        for ep in members:
            baseline = (total - ep.reward) / max(1, len(members) - 1)
            for record in ep.records:
                record.advantage = ep.reward - baseline


def token_logprobs(model, records, pad_id: int):
    """log pi(token) of every sampled token of ``records``, one right-padded row per record (positions from 0)."""
    rows = [r.prompt_ids + r.response_ids for r in records]
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    out = []
    for i, r in enumerate(records):
        start, n = len(r.prompt_ids), len(r.response_ids)
        step = logits[i, start - 1:start - 1 + n] / r.temperature
        out.append(step.log_softmax(-1).gather(-1, ids[i, start:start + n, None])[:, 0])
    return out


def rloo_loss(model, records, pad_id: int, micro_batch: int) -> float:
    """-mean over sampled tokens of advantage * log pi(token); backward per micro-batch (gradients accumulate)."""
    tokens = sum(sum(r.action_mask) for r in records)
    total = 0.0
    for i in range(0, len(records), micro_batch):
        chunk = records[i:i + micro_batch]
        loss = sum(-(r.advantage * lp * torch.tensor(r.action_mask)).sum()
                   for r, lp in zip(chunk, token_logprobs(model, chunk, pad_id))) / tokens
        loss.backward()
        total += loss.item()
    return total


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Args):
        kind = json.loads if f.name == "env_kwargs" else type(f.default)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default if f.name != "env_kwargs" else None)
    args = Args(**{k: v for k, v in vars(p.parse_args(argv)).items() if v is not None})
    import gymnasium as gym

    import memenv  # noqa: F401  (registers the envs)
    from agents.llm import LLMPolicy, load_pretrained, records_of, rollout
    from agents.llm.models.precision import host_line
    from agents.llm.training.recipes import tiny_sft_config
    from agents.llm.training.sft import train_sft
    from agents.llm.training.common import latest_checkpoint

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    print(host_line(), flush=True)  # the figures' host: CPU capability, dtype (fp32 here), torch threads
    clock = time.process_time()
    start = args.start
    if not start:  # stage 0: behaviour cloning of the oracle, the project's recipe on a smaller model
        sft = tiny_sft_config(env_kwargs=args.env_kwargs, out_dir=f"{args.out}/sft", steps=args.sft_steps, warmup=20,
                              episodes=args.sft_episodes, tiny_hidden=64, tiny_layers=2, tiny_heads=4, eval_every=0,
                              save_every=args.sft_steps, threads=args.threads, seed=args.seed, progress=False)
        train_sft(sft)
        start = latest_checkpoint(sft.out_dir)
    sft_cpu = time.process_time() - clock
    model, tok = load_pretrained(start)
    policy = LLMPolicy(model, tok, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    envs = [gym.make("MemQA-v0", **args.env_kwargs) for _ in range(args.tasks_per_update * args.group_size)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    returns, loss = [], 0.0
    for update in range(args.updates):  # task seeds from 10,000 (the demonstrations played seeds 0 .. 999)
        tasks = [10_000 * (args.seed + 1) + update * args.tasks_per_update + k for k in range(args.tasks_per_update)]
        seeds = [t for t in tasks for _ in range(args.group_size)]
        episodes = rollout(policy, envs, seeds, groups=seeds)  # 1. the envs, through memenv's rollout
        records = records_of(episodes)  # 2. its invocation records, token-exact
        rloo_advantages(episodes)  # 3. my algorithm: advantages, loss, one optimizer step
        optimizer.zero_grad()
        loss = rloo_loss(model, records, tok.pad_token_id, args.micro_batch)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        returns.append(sum(ep.reward for ep in episodes) / len(episodes))
        invalid = sum(not r.snapshot.get("valid", True) for r in records) / len(records)
        f1 = sum(ep.f1 for ep in episodes) / len(episodes)
        print(f"update {update + 1}: mean return {returns[-1]:+.3f} (F1 {f1:.3f}, invalid actions {invalid:.2f}), "
              f"loss {loss:+.4f}, {time.process_time() - clock:.0f} CPU-s", flush=True)
    k = max(1, len(returns) // 5)
    print(f"mean return: first {k} updates {sum(returns[:k]) / k:+.3f}, last {k} {sum(returns[-k:]) / k:+.3f}; "
          f"{sft_cpu:.0f} CPU-s behaviour cloning + {time.process_time() - clock - sft_cpu:.0f} CPU-s RLOO; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return {"returns": returns, "loss": loss, "sft_cpu_s": sft_cpu, "cpu_s": time.process_time() - clock,
            "records": records, "model": model}


if __name__ == "__main__":
    main()
