"""Gymnasium registration of every memenv environment.

``gym.make("memenv:MemQA-v0")`` imports this package (which registers) and then makes the env;
``import memenv; gym.make("MemQA-v0")`` works too. No ``max_episode_steps`` is set: each env enforces its own
turn limit, because the remaining turns are part of what the policy sees.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

# id -> (entry point, default kwargs)
ENVIRONMENTS: dict[str, tuple[str, dict]] = {
    "MemQA-v0": ("memenv.memqa:MemQAEnv", {}),
    "MemQA-Hotpot-v0": ("memenv.memqa:MemQAEnv", {"dataset": "hotpotqa", "objectives": 1}),
}


def register_envs() -> None:
    """Register every environment of :data:`ENVIRONMENTS` (idempotent)."""
    for env_id, (entry_point, kwargs) in ENVIRONMENTS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs), disable_env_checker=False)
