"""memenv's envs in `SkyRL-Gym <https://github.com/NovaSky-AI/SkyRL>`_ (``pip install 'memenv[skyrl]'``: the
package ``skyrl-gym``, 0.4): importing this module registers every memenv env in ``skyrl_gym``'s registry as
``memenv-ENV_ID`` (:func:`memenv.hubs.skyrl_id`), so a dataset row whose ``env_class`` is ``memenv-MemQA-v0``
plays MemQA-v0 through :class:`MemenvTextEnv`, a ``BaseTextEnv``.

SkyRL's generator (``SkyRLGymGenerator`` in skyrl-train) makes one env per row with ``skyrl_gym.make(env_class,
env_config=..., extras=...)``, calls ``init(prompt)`` for the first chat, then loops ``step(model_output)`` until
``done``, appending the model's output and the step's ``observations`` (chat messages) to one growing chat (or
its token ids). Here:

- ``env_config`` (the trainer's ``environment.skyrl_gym.<env_class>``) may hold ``env_kwargs``, passed to
  ``gym.make``; ``extras`` (the row's other fields) may hold ``seed``, at the top or in ``extra_info``
  (:func:`dataset_rows` builds such rows). A refused kwarg or seed raises what ``gym.make`` or ``reset`` raise
  in-process (``skyrl_gym.make`` appends to a ``TypeError``'s message the id and kwargs it was made with).
- ``init(prompt)`` resets the env: the row's system messages are kept, its other messages replaced by the env's
  first observation.
- ``step(action)`` is ``env.step(action)``: ``observations`` is one user message holding the **full new prompt**
  (the task, the rewritten memory, the new information), ``reward`` the env's, ``done`` terminated or
  truncated, ``metadata`` the step's info (``info["invocation"]``, the snapshot of the invocation, and
  ``info["summary"]`` at the end). A malformed action is an invalid step with a notice, as in-process.
- ``get_metrics()`` is the finished episode's summary numbers (f1, em, turns, peak context, ...).

**What the append-only generator loses.** The memory env's point is that an invocation sees only its prompt,
rebuilt from the memory the model just wrote. SkyRL's generator keeps every earlier message in the chat, so at
turn t the model is conditioned on all earlier prompts and its own earlier outputs, followed by the new prompt:
the last message is exactly the memory state, but nothing stops the model from reading what its memory dropped,
and the chat grows with every turn (each prompt repeats the task block, so it grows faster than the transcript of
``context="history"``) until ``max_input_length`` stops the episode. The episode is one training sample over
that accreted chat, not one sample per invocation in the state it was sampled in, so the snapshots in
``metadata`` (and the summary's ``peak_context_tokens``) describe what the env showed, not what the trainer
conditioned on. Rewards, env dynamics and memory rewriting (the env keeps what the ``<memory>`` block says) are
unchanged. SkyRL's one precedent for dropping old messages (its RLM env) edits the generator's chat list by
reference, which works only as long as the generator never copies that list (its own comment says so); memenv
does not do that. Per-invocation training needs a loop that feeds each prompt alone: memenv's own rollouts, its
TRL and verl adapters.
"""

from __future__ import annotations

from typing import Any, Iterable

import gymnasium as gym

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
    from skyrl_gym.envs.registration import register, registry
except ModuleNotFoundError as exc:  # skyrl_gym itself missing; a module it needs is left to its own message
    if (exc.name or "").split(".")[0] != "skyrl_gym":
        raise
    raise ModuleNotFoundError("memenv.hubs.skyrl needs SkyRL-Gym: pip install 'memenv[skyrl]' (the package "
                              "skyrl-gym)", name="skyrl_gym") from exc

import memenv  # noqa: F401 - registers the envs with Gymnasium
from memenv.envs.base import check_reset_args
from memenv.hubs import ENVIRONMENTS, HUB_NAMESPACE, skyrl_id

#: What ``env_config`` may hold.
ENV_CONFIG_KEYS = ("env_kwargs",)
#: The numbers of an episode's summary that :meth:`MemenvTextEnv.get_metrics` reports (those the env has).
SUMMARY_METRICS = ("f1", "em", "f1_sum", "em_sum", "turns", "invalid_actions", "peak_context_tokens",
                   "total_context_tokens", "score")


def _plain(value: Any) -> Any:
    """An OmegaConf ``DictConfig`` / ``ListConfig`` (what SkyRL's trainer passes) as plain dicts and lists."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _row_seed(extras: dict[str, Any]) -> Any:
    """The seed of a dataset row: ``extras["seed"]``, else ``extras["extra_info"]["seed"]``, else None."""
    if "seed" in extras:
        return extras["seed"]
    extra_info = extras.get("extra_info")
    return extra_info.get("seed") if isinstance(extra_info, dict) else None


class MemenvTextEnv(BaseTextEnv):
    """A SkyRL-Gym text env over ``gym.make(memenv_id, **env_config["env_kwargs"])``, reset with the row's seed
    (module docstring: what it keeps and what SkyRL's append-only generator loses)."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None,
                 memenv_id: str = "MemQA-v0") -> None:
        super().__init__()
        config, extras = _plain(env_config) or {}, _plain(extras) or {}
        if not isinstance(config, dict):
            raise TypeError(f"env_config must be a mapping with {', '.join(ENV_CONFIG_KEYS)}, got "
                            f"{type(config).__name__}")
        unknown = sorted(set(config) - set(ENV_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"env_config: unknown key(s) {unknown}: memenv's SkyRL env takes "
                             f"{', '.join(ENV_CONFIG_KEYS)}")
        env_kwargs = config.get("env_kwargs") or {}
        if not isinstance(env_kwargs, dict):
            raise TypeError(f"env_config['env_kwargs'] must be a mapping, got {type(env_kwargs).__name__}")
        self.seed = check_reset_args(_row_seed(extras if isinstance(extras, dict) else {}), None)
        self.memenv_id = memenv_id
        self.env_kwargs = dict(env_kwargs)
        self.env = gym.make(memenv_id, **self.env_kwargs)
        self.info: dict[str, Any] = {}
        self.episode_return = 0.0

    def init(self, prompt: list[dict[str, str]] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset the env (the row's seed); the chat is the row's system messages, then the first observation."""
        system = [m for m in (prompt or []) if isinstance(m, dict) and m.get("role") == "system"]
        text, info = self.env.reset(seed=self.seed)
        self.turns, self.episode_return, self.info = 0, 0.0, info
        self.max_turns = int(info.get("max_turns", self.max_turns))
        return system + [{"role": "user", "content": text}], info

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One env step: the next observation as one user message holding the full new prompt (none at the end:
        the generator appends nothing after the last turn)."""
        text, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        self.episode_return += float(reward)
        self.info = info
        done = bool(terminated or truncated)
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "user", "content": text}],
                                     reward=reward, done=done, metadata=info, postprocessed_action=None)

    @property
    def memory(self) -> str:
        """The memory the next observation shows (the env's state, for inspection)."""
        return getattr(self.env.unwrapped, "_memory", "")

    def get_metrics(self) -> dict[str, Any]:
        """The episode's numbers once it ended (its summary's, ``return`` and ``steps``); ``steps`` alone before."""
        summary = self.info.get("summary") or {}
        found = {k: summary[k] for k in SUMMARY_METRICS if isinstance(summary.get(k), (int, float))}
        return {**found, "return": self.episode_return, "steps": self.turns} if summary else {"steps": self.turns}

    def close(self) -> None:
        self.env.close()


def register_envs() -> list[str]:
    """Register every memenv env in ``skyrl_gym``'s registry as ``memenv-ENV_ID`` (idempotent: SkyRL refuses a
    name twice); returns SkyRL's ids."""
    ids = []
    for env_id in ENVIRONMENTS:
        ids.append(skyrl_id(env_id))
        if ids[-1] not in registry:
            register(id=ids[-1], entry_point=f"{__name__}:MemenvTextEnv", kwargs={"memenv_id": env_id})
    return ids


def dataset_rows(env_id: str, seeds: Iterable[int], env_kwargs: dict[str, Any] | None = None) -> list[dict]:
    """One SkyRL dataset row per seed for ``env_id`` (write them to Parquet or JSON Lines for skyrl-train):
    ``prompt`` the episode's first observation (what SkyRL's length filter should measure; ``init`` rebuilds
    it), ``env_class`` the SkyRL id, ``extra_info.seed`` the seed. ``env_kwargs`` must also be the trainer's
    ``environment.skyrl_gym.<env_class>.env_kwargs``, which is what the env is made with."""
    env = gym.make(env_id, **dict(env_kwargs or {}))
    try:
        rows = []
        for seed in seeds:
            text, _ = env.reset(seed=seed)
            rows.append({"data_source": HUB_NAMESPACE, "prompt": [{"role": "user", "content": text}],
                         "env_class": skyrl_id(env_id), "reward_spec": {"method": "env"},
                         "extra_info": {"seed": int(seed)}})
        return rows
    finally:
        env.close()


register_envs()

__all__ = ["ENV_CONFIG_KEYS", "MemenvTextEnv", "SUMMARY_METRICS", "dataset_rows", "register_envs"]
