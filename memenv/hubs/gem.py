"""memenv's envs in `GEM <https://github.com/axon-rl/gem>`_ (``pip install 'memenv[gem]'``: the package
``gem-llm``, 0.1): importing this module registers every memenv env in GEM's registry as ``memenv:ENV_ID``
(:func:`memenv.hubs.gem_id`), so ``gem.make("memenv:MemQA-v0", objectives=1)`` and ``gem.make_vec(...)`` give
a :class:`MemenvGemEnv`.

GEM's interface is Gymnasium's without spaces: ``reset(seed) -> (obs, info)``, ``step(action) -> (obs, reward,
terminated, truncated, info)``, text in and text out. Its loops add history only through an opt-in observation
wrapper (``concat``, ``concat_chat``, ...), so the observation here is what the memenv env shows at that
invocation: the prompt it rebuilds from the memory every turn, nothing accreted. Do not add GEM's ``concat*``
wrappers: they would append every earlier observation and action, which is exactly what a memory env takes away
(the env's own ``context="history"`` mode is the transcript baseline, if that is what is wanted).
``episode_tracking`` and the vector envs work as they do for GEM's own envs.

Everything else is the env's, untouched: rewards, ``info`` (``info["invocation"]`` on every step, the snapshot of
that invocation; ``info["summary"]`` at the end), memory-tools mode (the tools are action text, as in-process),
a malformed action as an invalid step with a notice in the observation, and the errors. ``gem.make`` passes its
kwargs to :class:`MemenvGemEnv`, which passes them to ``gym.make``: a kwarg the env refuses is the same
exception with the same one-line message as in-process; an unknown ``memenv:`` id is GEM's own one-line
``ValueError`` (``Environment memenv:X not found in registry.``).

Two things follow GEM's conventions rather than Gymnasium's: the constructor takes ``seed`` (``gem.make_vec``
passes ``seed + i`` to env ``i``), used by the first ``reset()`` given no seed; and ``reset(seed)`` seeds
Python's and numpy's global generators as every GEM env does (``gem.Env.reset``); memenv's episodes use only the
env's own generator. GEM's vector envs reset an env in the step that ends its episode and return the reset's
info, so the last step's info (the summary, the last snapshot) would be lost: the next reset's info carries it
as ``prev_ep_final_info``, beside the ``prev_ep_*`` keys of GEM's ``EpisodeTrackingWrapper``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

try:
    import gem
    from gem.core import Env as _GemEnv
    from gem.envs.registration import ENV_REGISTRY
except ModuleNotFoundError as exc:  # gem itself missing; a module gem needs is left to its own message
    if (exc.name or "").split(".")[0] != "gem":
        raise
    raise ModuleNotFoundError("memenv.hubs.gem needs GEM: pip install 'memenv[gem]' (the package gem-llm)",
                              name="gem") from exc

import memenv  # noqa: F401 - registers the envs with Gymnasium
from memenv.envs.base import check_reset_args
from memenv.hubs import ENVIRONMENTS, gem_id

#: Key of a reset's info holding the info of the previous episode's last step (when that episode ended).
PREVIOUS_FINAL_INFO = "prev_ep_final_info"


class MemenvGemEnv(_GemEnv):
    """A GEM env over ``gym.make(memenv_id, **env_kwargs)``: observations, rewards and infos are the memenv env's.

    ``seed`` (GEM's constructor argument) is the seed of the first ``reset()`` called without one; later
    unseeded resets go on with the env's own generator, as in-process. A bad ``seed`` is refused here, before
    the env is made, with the message ``reset`` would give.
    """

    def __init__(self, memenv_id: str, seed: int | None = None, **env_kwargs: Any) -> None:
        super().__init__()
        self.seed = check_reset_args(seed, None)
        self.memenv_id = memenv_id  # not env_id: gem.make sets that to GEM's id, and gem.register takes it
        self.env_kwargs = dict(env_kwargs)
        self.env = gym.make(memenv_id, **self.env_kwargs)
        self._pending_seed = self.seed
        self._final_info: dict[str, Any] | None = None

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = check_reset_args(seed, None)  # memenv's refusal, before GEM seeds anything
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        super().reset(seed)  # GEM's convention: Python's and numpy's global generators
        obs, info = self.env.reset(seed=seed)
        if self._final_info is not None:
            info = {**info, PREVIOUS_FINAL_INFO: self._final_info}
            self._final_info = None
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            self._final_info = info
        return obs, reward, terminated, truncated, info

    @property
    def memory(self) -> str:
        """The memory the next observation shows (the env's state, for inspection)."""
        return getattr(self.env.unwrapped, "_memory", "")

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        kwargs = "".join(f", {k}={v!r}" for k, v in self.env_kwargs.items())
        return f"MemenvGemEnv({self.memenv_id!r}{kwargs})"


def register_envs() -> list[str]:
    """Register every memenv env in GEM's registry as ``memenv:ENV_ID`` (idempotent: GEM's ``register`` refuses
    an id twice); returns GEM's ids."""
    ids = []
    for env_id in ENVIRONMENTS:
        ids.append(gem_id(env_id))
        if ids[-1] not in ENV_REGISTRY:
            gem.register(ids[-1], f"{__name__}:MemenvGemEnv", memenv_id=env_id)
    return ids


register_envs()

__all__ = ["MemenvGemEnv", "PREVIOUS_FINAL_INFO", "register_envs"]
