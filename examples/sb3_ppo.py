"""Train Stable-Baselines3 PPO and sb3-contrib MaskablePPO on MemQA through the numeric wrapper.

    python examples/sb3_ppo.py                      # defaults: 60k steps each, ~3-5 CPU-minutes in all
    python examples/sb3_ppo.py --timesteps 150000 --eval-episodes 500

The wrapper (:class:`memenv.wrappers.MemQANumeric`) turns MemQA into a ``Box`` observation and ``Discrete``
macro-actions (search / answer with a candidate string, keep / drop a memory sentence) with
``action_masks()``. Its default task is one single-hop question per episode over a 300-document synthetic
corpus. Both agents are evaluated, deterministically, on held-out seeds (never seen in training) against a
uniformly random policy (unmasked, and masked to valid macro-actions). Prints F1 of each and wall time.
Needs ``stable-baselines3`` and ``sb3-contrib`` (``pip install -e '.[sb3]'`` in the repository).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3 import PPO

from memenv.wrappers import MemQANumeric, masked_random_action

HELD_OUT_SEED = 1_000_000  # evaluation seeds start here; training episodes are seeded from --seed


def evaluate(env: MemQANumeric, act, episodes: int, seed: int = HELD_OUT_SEED) -> float:
    """Mean F1 of ``act(obs, env, rng) -> action`` over ``episodes`` held-out seeded episodes."""
    rng = np.random.default_rng(seed)
    scores = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        while True:
            obs, _, terminated, truncated, info = env.step(act(obs, env, rng))
            if terminated or truncated:
                scores.append(info["f1"])
                break
    return float(np.mean(scores))


def train(algo: type, env: MemQANumeric, timesteps: int, seed: int, progress: bool):
    model = algo("MlpPolicy", env, seed=seed, n_steps=1024, batch_size=128, n_epochs=10, learning_rate=5e-4,
                 gamma=0.99, ent_coef=0.01, policy_kwargs={"net_arch": [128, 128]}, verbose=0, device="cpu")
    model.learn(total_timesteps=timesteps, progress_bar=progress)
    return model


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=60_000, help="training steps per algorithm")
    parser.add_argument("--eval-episodes", type=int, default=300, help="held-out episodes per policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--kw", nargs="*", default=[], metavar="KEY=VALUE",
                        help="MemQA kwargs for the wrapper's task, e.g. hops=2")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from memenv.cli_common import parse_kwargs

    task = parse_kwargs(args.kw)
    start = time.perf_counter()
    results: dict[str, float] = {}
    env = MemQANumeric(**task)
    results["random"] = evaluate(env, lambda obs, e, rng: int(rng.integers(e.action_space.n)), args.eval_episodes)
    results["masked_random"] = evaluate(env, lambda obs, e, rng: masked_random_action(e, rng), args.eval_episodes)
    print(f"random F1 {results['random']:.3f} | masked-random F1 {results['masked_random']:.3f}")

    for name, algo in (("PPO", PPO), ("MaskablePPO", MaskablePPO)):
        t0 = time.perf_counter()
        train_env = MemQANumeric(**task)
        model = train(algo, train_env, args.timesteps, args.seed, not args.no_progress)
        seconds = time.perf_counter() - t0
        if algo is MaskablePPO:
            act = lambda obs, e, rng: int(model.predict(obs, action_masks=e.action_masks(), deterministic=True)[0])  # noqa: E731
        else:
            act = lambda obs, e, rng: int(model.predict(obs, deterministic=True)[0])  # noqa: E731
        results[name] = evaluate(MemQANumeric(**task), act, args.eval_episodes)
        results[f"{name}_train_s"] = seconds
        print(f"{name}: F1 {results[name]:.3f} after {args.timesteps} steps ({seconds:.0f} s)")

    wall = time.perf_counter() - start
    results["wall_s"] = wall
    base = results["masked_random"]
    print("\npolicy          F1     vs masked-random")
    for name in ("random", "masked_random", "PPO", "MaskablePPO"):
        print(f"{name:<14} {results[name]:.3f}  {results[name] - base:+.3f}")
    print(f"wall time {wall:.0f} s ({wall / 60:.1f} min), torch threads {args.threads}")
    return results


if __name__ == "__main__":
    main()
