"""The memenv harness: a loop in which every model call's prompt is the memory state the env rebuilt that turn.

verifiers' stock harnesses keep one conversation and append to it; a memenv invocation's prompt is instead the
env's observation (the task, the memory the model last wrote, the newest information), rebuilt every turn, and
nothing earlier. :class:`MemenvHarness` runs that loop in-process (verifiers allows it, as long as every model
call goes through the rollout's endpoint): reset the env with the task's seed, then per turn post
``[system, user: observation]`` to ``{endpoint}/chat/completions``, step the env with the reply, until the episode
ends. Each request shares no history with the one before, so verifiers' message graph puts every invocation on a
branch of its own (``trace.branches``), one training sample each, ``[system, observation, reply]``.

The record goes to ``trace.info["memenv"]``: the step rewards, every step's ``info["invocation"]`` (the
snapshot of that call's prompt, memory and tool result, as in-process), and the summary (its ``snapshots``
left out, being the same snapshots again). A malformed reply is the env's invalid step, in-band, as in-process.
A turn verifiers refuses (``--env.agent.max-turns``, a stop hook) ends the loop with the episode unfinished
(``finished`` false); any other failed model call ends it as a harness error naming the HTTP status.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.clients import ModelContext
from verifiers.v1.runtimes import ProgramResult, Runtime

from memenv_memqa.taskset import INFO_KEY, make_env


class MemenvHarnessConfig(vf.HarnessConfig):
    """``--env.agent.harness.max-tokens``: the completion budget of one call (unset: the server's)."""

    max_tokens: int | None = None


def _plain(value: Any) -> Any:
    """``value`` as JSON data (numpy numbers and arrays, tuples), so that ``traces.jsonl`` keeps it whole."""
    def default(obj: Any) -> Any:
        if hasattr(obj, "tolist"):
            return obj.tolist()
        if hasattr(obj, "item"):
            return obj.item()
        return str(obj)
    return json.loads(json.dumps(value, default=default))


def _field(data: vf.TaskData, name: str) -> Any:
    """A task field, on the typed data or on the wire form (an env server's ``WireTaskData``)."""
    if name in type(data).model_fields:
        return getattr(data, name)
    return (data.model_extra or {})[name]


class MemenvHarness(vf.Harness[MemenvHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    def messages(self, system: str | None, observation: str) -> list[dict[str, str]]:
        """One invocation's request: the system prompt (if any) and the observation, nothing earlier."""
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": observation}]

    async def _reply(self, http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str | ProgramResult:
        response = await http.post(url, json=body)
        if response.status_code != 200:
            return ProgramResult(1, "", f"model call failed: HTTP {response.status_code} from {url}: "
                                        f"{response.text[:500]}")
        message = response.json()["choices"][0]["message"]
        return message.get("content") or ""

    async def launch(self, ctx: ModelContext, trace: vf.Trace, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData) -> ProgramResult:
        system, _ = self.resolve_prompt(data)
        env_id, env_kwargs, seed = (_field(data, k) for k in ("env_id", "env_kwargs", "seed"))
        env = make_env(env_id, env_kwargs)
        record: dict[str, Any] = {"env_id": env_id, "env_kwargs": _plain(env_kwargs), "seed": seed, "rewards": [],
                                  "invocations": [], "summary": None, "finished": False}
        trace.info[INFO_KEY] = record
        extra = {} if self.config.max_tokens is None else {"max_tokens": self.config.max_tokens}
        url = f"{endpoint.rstrip('/')}/chat/completions"
        try:
            observation, _ = env.reset(seed=seed)
            async with httpx.AsyncClient(timeout=None, headers={"Authorization": f"Bearer {secret}"}) as http:
                while True:
                    body = {"model": ctx.model, "messages": self.messages(system, observation), **extra}
                    reply = await self._reply(http, url, body)
                    if isinstance(reply, ProgramResult):
                        # A turn verifiers refused (a limit, a stop hook) is a stop, not a failure.
                        return ProgramResult(0, "", "") if trace.stop_condition is not None else reply
                    observation, reward, terminated, truncated, info = await asyncio.to_thread(env.step, reply)
                    record["rewards"].append(float(reward))
                    record["invocations"].append(_plain(info["invocation"]))
                    if terminated or truncated:
                        summary = {k: v for k, v in info.get("summary", {}).items() if k != "snapshots"}
                        record["summary"], record["finished"] = _plain(summary), True
                        return ProgramResult(0, "", "")
        finally:
            env.close()
