"""The reference policy of memenv's OpenEnv manifest (openenv.yaml): the oracle on MemQA-v0, and the runtime plan
`openenv validate` replays (deploy/openenv/runtime.json).

The oracle (``agents.scripted`` ``OraclePolicy``) reads the gold task from the env, so it plays in-process; its
episode at the plan's seed is the plan: the reset (seed, episode id) and the oracle's action texts, which a
served MemQA-v0 must answer with the same episode, ending at reward 1.0, the top of the manifest's reward range.

    python deploy/openenv/oracle.py            # play it: the actions, the return, whether the plan is current
    python deploy/openenv/oracle.py --write    # rewrite runtime.json from a fresh oracle run (atomically)

Exit status 1 when the committed plan differs from what the oracle plays now (``--check``, the default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import gymnasium as gym

ROOT = Path(__file__).resolve().parents[2]
PLAN = Path(__file__).with_name("runtime.json")
ENV_ID, SEED = "MemQA-v0", 0


def oracle_episode(env_id: str = ENV_ID, seed: int = SEED, env_kwargs: dict | None = None) -> tuple[list[str], list[float]]:
    """The oracle's action texts and rewards for one seeded episode, in-process."""
    import memenv  # noqa: F401 - registers the envs
    from agents.scripted import make_strategy

    env = gym.make(env_id, **(env_kwargs or {}))
    oracle = make_strategy("oracle", env_id)
    obs, _ = env.reset(seed=seed)
    oracle.reset(env.unwrapped)
    actions, rewards = [], []
    while True:
        action = oracle.act(obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        actions.append(action)
        rewards.append(float(reward))
        if terminated or truncated:
            env.close()
            return actions, rewards


def runtime_plan(actions: list[str], seed: int = SEED) -> dict:
    """OpenEnv's runtime plan (schema 1): one reset, then the actions as MemenvAction data."""
    return {"plan_schema_version": "1",
            "reset": {"episode_id": f"memqa-oracle-seed-{seed}", "seed": seed, "options": {}},
            "actions": [{"text": action} for action in actions]}


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite runtime.json from a fresh oracle run")
    args = parser.parse_args(argv)
    actions, rewards = oracle_episode()
    plan = json.dumps(runtime_plan(actions), indent=2) + "\n"
    print(f"oracle on {ENV_ID} seed {SEED}: {len(actions)} steps, rewards {rewards}, return {sum(rewards):g}")
    if args.write:
        write_atomically(PLAN, plan)
        print(f"wrote {PLAN.relative_to(ROOT)}")
        return 0
    current = PLAN.is_file() and PLAN.read_text() == plan
    print(f"{PLAN.relative_to(ROOT)}: {'current' if current else 'STALE (run with --write)'}")
    return 0 if current else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
