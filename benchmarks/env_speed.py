"""Environment throughput: steps/s of MemQA-v0 driven by the oracle, single process.

    python benchmarks/env_speed.py [--episodes 500] [--objectives 2] [--hops 2]

Prints steps/s of the env alone (env.step time only) and of env + oracle policy (wall time). Target: >= 1,000
steps/s for env + oracle on the default MemQA-v0.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import memenv  # noqa: F401
from agents.scripted.strategies.qa_strategies import OraclePolicy


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--objectives", type=int, default=2)
    parser.add_argument("--hops", type=int, default=2)
    args = parser.parse_args(argv)
    env = gym.make("MemQA-v0", objectives=args.objectives, hops=args.hops).unwrapped
    policy = OraclePolicy()
    env.reset(seed=0)  # build the world and the index outside the timed loop
    steps, env_time, f1 = 0, 0.0, 0.0
    start = time.perf_counter()
    for seed in range(args.episodes):
        obs, _ = env.reset(seed=seed)
        policy.reset(env)
        done = False
        while not done:
            action = policy.act(obs)
            t0 = time.perf_counter()
            obs, _, terminated, truncated, info = env.step(action)
            env_time += time.perf_counter() - t0
            steps += 1
            done = terminated or truncated
        f1 += info["summary"]["f1"]
    wall = time.perf_counter() - start
    result = {"steps": steps, "env_steps_per_s": steps / env_time, "env_plus_oracle_steps_per_s": steps / wall,
              "oracle_f1": f1 / args.episodes}
    print(f"MemQA-v0 objectives={args.objectives} hops={args.hops}: {args.episodes} episodes, {steps} steps")
    print(f"  env.step alone      : {result['env_steps_per_s']:,.0f} steps/s")
    print(f"  env + oracle policy : {result['env_plus_oracle_steps_per_s']:,.0f} steps/s (target >= 1,000)")
    print(f"  oracle F1           : {result['oracle_f1']:.3f}")
    return result


if __name__ == "__main__":
    main()
