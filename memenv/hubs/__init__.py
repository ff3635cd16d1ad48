"""memenv's envs in the environment hubs that LLM-RL users train from: GEM and SkyRL-Gym (docs/hubs.md).

Each hub module registers every env of :data:`memenv.registration.ENVIRONMENTS` in that hub's own registry
when it is imported, under the hub's id convention (:func:`gem_id`, :func:`skyrl_id`), and wraps one
``gym.make(env_id, **kwargs)`` in the hub's env class: :mod:`memenv.hubs.gem` (``pip install 'memenv[gem]'``:
``gem.make("memenv:MemQA-v0")``, a ``gem.Env`` whose observation is the prompt the env rebuilds from the memory
every turn) and :mod:`memenv.hubs.skyrl` (``pip install 'memenv[skyrl]'``: ``skyrl_gym.make("memenv-MemQA-v0",
env_config=..., extras=...)``, a ``BaseTextEnv`` whose each step's observation is that full new prompt). Both
keep the env's own behaviour: its rewards, its ``info`` (``info["invocation"]``, the snapshot of the invocation,
and ``info["summary"]``), a malformed action as an invalid step with a notice (never an exception), and the
errors ``gym.make`` and ``reset`` raise for an unknown id, a refused kwarg or a bad seed, word for word. This
package imports neither hub: ``import memenv`` and ``import memenv.hubs`` work without them.
"""

from __future__ import annotations

from memenv.registration import ENVIRONMENTS

#: The namespace of memenv's ids in both hubs' registries.
HUB_NAMESPACE = "memenv"


def gem_id(env_id: str) -> str:
    """GEM's id of a memenv env: ``namespace:Name-vN``, as GEM's own (``game:Wordle-v0-easy``, ``qa:HotpotQA``)."""
    return f"{HUB_NAMESPACE}:{env_id}"


def skyrl_id(env_id: str) -> str:
    """SkyRL-Gym's id (a dataset row's ``env_class``) of a memenv env: ``memenv-MemQA-v0``; no colon or dot, so
    that it is also a key of SkyRL's Hydra config (``environment.skyrl_gym.memenv-MemQA-v0``)."""
    return f"{HUB_NAMESPACE}-{env_id}"


__all__ = ["ENVIRONMENTS", "HUB_NAMESPACE", "gem_id", "skyrl_id"]
