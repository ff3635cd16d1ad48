"""memenv in verifiers (``verifiers>=0.4``, its ``v1`` API): the environment package the Environments Hub loads
as ``memenv_memqa`` (``vf-eval memenv_memqa ...``, or ``verifiers.v1.load_environment(config)`` with
``config.taskset.id = "memenv_memqa"``).

It exports the three plugins verifiers looks up by id: :class:`MemenvTaskset` (one task per seed of a memenv env,
the env's return as the reward), :class:`MemenvHarness` (the loop that sends each turn's prompt rebuilt from the
memory, every invocation its own branch of the trace) and :class:`MemenvEnv` (the single-agent env, its runtime
the local ``subprocess`` one, since the harness runs no program: nothing needs a sandbox).
"""

from __future__ import annotations

import verifiers.v1 as vf
from verifiers.v1.runtimes import SubprocessConfig

from memenv_memqa.harness import MemenvHarness, MemenvHarnessConfig
from memenv_memqa.taskset import (INFO_KEY, MemenvConfigError, MemenvData, MemenvTask, MemenvTaskset,
                                  MemenvTasksetConfig)


class MemenvEnvConfig(vf.EnvConfig):
    """The one ``agent`` seat (``--env.agent.*``), on the local runtime unless told otherwise."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())


class MemenvEnv(vf.Env[MemenvEnvConfig]):
    """One agent plays one memenv episode."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


__all__ = ["INFO_KEY", "MemenvConfigError", "MemenvData", "MemenvEnv", "MemenvEnvConfig", "MemenvHarness",
           "MemenvHarnessConfig", "MemenvTask", "MemenvTaskset", "MemenvTasksetConfig"]
