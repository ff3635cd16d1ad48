"""memenv's episodes as a verifiers taskset: one task per (env id, env kwargs, seed), its reward the env's own.

A task's data names the episode (:class:`MemenvData`: ``env_id``, ``env_kwargs``, ``seed``, and the protocol
system prompt the served policy of memenv sends); the harness (:mod:`memenv_memqa.harness`) plays it and leaves
the record in ``trace.info["memenv"]``; the task's one reward is the episode's return, the sum of the env's step
rewards in order (for MemQA the answer step's reward is the episode's F1, so the return is F1 less the invalid
actions' penalties). Nothing is recomputed here: the reward is what ``env.step`` returned.

The taskset config is checked when it is made, by making the env once, before any task runs: an unknown id, a
kwarg the env refuses, a bad value or a bad seed fails with ``gym.make``'s (or ``reset``'s) one-line message,
word for word. A refused kwarg
is ``gym.make``'s own ``TypeError``; the others (gymnasium's registry errors, the env's ``ValueError``) come as
:class:`MemenvConfigError`, a ``TypeError`` whose ``__cause__`` is ``gym.make``'s exception: pydantic would wrap a
``ValueError`` into a multi-line ``ValidationError``, and verifiers' CLI prints a ``TypeError`` raised while it
reads the config as its message alone (``vf-eval`` exits 1 with that one line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import verifiers.v1 as vf
from pydantic import Field, model_validator

import memenv  # noqa: F401 - registers memenv's envs with Gymnasium
from memenv.envs.base import check_reset_args
from agents.llm.models.prompts import PROTOCOL_SYSTEM_PROMPT

#: Key of ``trace.info`` holding the episode record the harness writes.
INFO_KEY = "memenv"


class MemenvData(vf.TaskData):
    """One episode: ``gym.make(env_id, **env_kwargs).reset(seed=seed)``. ``prompt`` is the env id (verifiers
    refuses a task without a prompt); the prompts the model sees are the env's observations."""

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int


def make_env(env_id: str, env_kwargs: dict[str, Any]) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)``: its errors are memenv's, word for word."""
    return gym.make(env_id, **dict(env_kwargs))


class MemenvConfigError(TypeError):
    """``gym.make`` refused the taskset's env id or kwargs; the message is its own (``__cause__``: its exception)."""


def check_env(env_id: str, env_kwargs: dict[str, Any], seed: int) -> None:
    """Check the seed as ``reset`` does and make the env once: memenv's error, as :class:`MemenvConfigError` unless
    a ``TypeError``."""
    try:
        check_reset_args(seed, None)
        env = make_env(env_id, env_kwargs)
    except TypeError:
        raise
    except Exception as exc:
        raise MemenvConfigError(str(exc)) from exc
    env.close()


def episode_record(trace: vf.Trace) -> dict[str, Any] | None:
    """The harness's record of the episode on ``trace`` (None when no memenv harness played it)."""
    record = trace.info.get(INFO_KEY)
    return record if isinstance(record, dict) else None


class MemenvTask(vf.Task[MemenvData]):
    """Scores an episode the memenv harness played: the reward is its return, the metrics its summary's."""

    @property
    def key(self) -> str:
        kwargs = json.dumps(self.data.env_kwargs, sort_keys=True, default=str)
        return f"{self.data.env_id}|{kwargs}|seed={self.data.seed}"

    @vf.reward
    async def episode_return(self, trace: vf.Trace) -> float:
        """The sum of the env's step rewards, in step order (0.0 when no step ran)."""
        record = episode_record(trace)
        if record is None:
            raise vf.TaskError("no memenv episode on this trace: play it with the memenv_memqa harness")
        total = 0.0
        for reward in record["rewards"]:
            total += reward
        return total

    @vf.metric
    async def episode(self, trace: vf.Trace) -> dict[str, float]:
        """The summary's numbers (``f1``, ``turns``, ``invalid_actions``, ...) and the steps played."""
        record = episode_record(trace) or {}
        summary = record.get("summary") or {}
        numbers = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return {**numbers, "steps": float(len(record.get("rewards", []))),
                "finished": float(record.get("finished", False))}


class MemenvTasksetConfig(vf.TasksetConfig):
    """``--env.taskset.env-id``, ``--env.taskset.env-kwargs '{"objectives": 2}'``, ``--env.taskset.seed`` (the first
    task's; task i plays seed + i), ``--env.taskset.num-tasks``, ``--env.taskset.protocol-prompt`` (the system
    prompt memenv's served policy sends; ``--env.taskset.no-protocol-prompt`` drops it)."""

    env_id: str = "MemQA-v0"
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    num_tasks: int = Field(100, ge=1)
    protocol_prompt: bool = True

    @model_validator(mode="after")
    def _the_env_accepts_it(self) -> MemenvTasksetConfig:
        check_env(self.env_id, self.env_kwargs, self.seed)
        return self


class MemenvTaskset(vf.Taskset[MemenvTask, MemenvTasksetConfig]):
    """Episodes ``seed, seed + 1, ...`` of one memenv env (``num_tasks`` of them)."""

    def load(self) -> Iterator[MemenvTask]:
        config = self.config
        system = PROTOCOL_SYSTEM_PROMPT if config.protocol_prompt else None
        for i in range(config.num_tasks):
            seed = config.seed + i
            data = MemenvData(prompt=config.env_id, system_prompt=system, name=f"{config.env_id} seed {seed}",
                              env_id=config.env_id, env_kwargs=dict(config.env_kwargs), seed=seed)
            yield MemenvTask(data, config.task)
