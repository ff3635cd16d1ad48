"""The environments a session plays: :class:`MemenvEnvironment` (an OpenEnv ``Environment`` over one memenv env)
and :class:`MemenvToolsEnvironment` (an env in memory-tools mode as an OpenEnv ``MCPEnvironment``, its calls MCP
tools)."""

from __future__ import annotations

import functools
import json
from typing import Any

import gymnasium as gym
from openenv.core.env_server import Action, Environment, MCPEnvironment, Observation
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ToolError, ToolErrorType
from openenv.core.env_server.types import EnvironmentMetadata

import memenv  # noqa: F401 - registers the environments
from memenv.envs.base import check_reset_args
from memenv.openenv.messages import RequestError, json_kind
from memenv.openenv.types import MemenvAction, MemenvObservation, MemenvState, jsonable


class MemenvEnvironment(Environment):
    """An OpenEnv ``Environment`` over one memenv env (``gym.make(env_id, **env_kwargs)``), one per session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.env = gym.make(env_id, **self.env_kwargs)
        self._steps = 0
        self._done = True
        self._return = 0.0
        self._client_episode_id: str | None = None
        self._was_reset = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, options: dict | None = None,
              **kwargs: Any) -> MemenvObservation:
        """``env.reset(seed=seed, options=options)``; ``episode_id`` (OpenEnv's, the client's label) is the
        state's ``episode_id`` (and ``client_episode_id``); the env's own id stays in the info, the snapshots and
        the state's ``env_episode_id``. Every argument is
        checked before the env is touched (:class:`RequestError` naming it), so a refused reset changes nothing."""
        if kwargs:
            raise RequestError(f"unknown argument(s) {sorted(kwargs)}: reset takes seed, episode_id, options")
        try:
            seed = check_reset_args(seed, options)  # the env's own check, run here before the env sees anything
        except (TypeError, ValueError) as exc:
            raise RequestError(str(exc)) from None
        if episode_id is not None and not isinstance(episode_id, str):
            raise RequestError(f"episode_id must be a string or null, got {type(episode_id).__name__}")
        text, info = self.env.reset(seed=seed, options=options)
        self._steps, self._done, self._return = 0, False, 0.0
        self._client_episode_id = episode_id
        self._was_reset = True
        return self._observation(text, info, reward=None, terminated=False, truncated=False)

    def step(self, action: MemenvAction, timeout_s: float | None = None, **kwargs: Any) -> MemenvObservation:
        """``env.step(action.text)``: a malformed action text is an invalid step, never an error. ``timeout_s``
        (OpenEnv's) is accepted and not enforced: a memenv step takes milliseconds and cannot hang. A step
        before any reset, or after the episode ended, is a :class:`RequestError` (in-process: ``RuntimeError``)."""
        if not self._was_reset:
            raise RequestError("step before reset: send a reset first", "EXECUTION_ERROR")
        if self._done:
            raise RequestError("step() called on a finished episode: send a reset first", "EXECUTION_ERROR")
        text, reward, terminated, truncated, info = self.env.step(action.text)
        self._steps += 1
        self._return += float(reward)
        self._done = bool(terminated or truncated)
        return self._observation(text, info, float(reward), bool(terminated), bool(truncated))

    @staticmethod
    def _observation(text: str, info: dict, reward: float | None, terminated: bool,
                     truncated: bool) -> MemenvObservation:
        safe = jsonable(info)
        return MemenvObservation(text=text, info=safe, metadata=safe, reward=reward, done=terminated or truncated,
                                 terminated=terminated, truncated=truncated)

    @property
    def state(self) -> MemenvState:
        base = self.env.unwrapped
        env_episode_id = getattr(base, "_episode_id", "") or None
        return MemenvState(episode_id=self._client_episode_id or env_episode_id, env_episode_id=env_episode_id,
                           step_count=self._steps,
                           env_id=self.env_id, env_kwargs=jsonable(self.env_kwargs), done=self._done,
                           memory=getattr(base, "_memory", ""), episode_return=self._return,
                           client_episode_id=self._client_episode_id,
                           max_observation_chars=self.env.observation_space.max_length,
                           max_action_chars=self.env.action_space.max_length)

    def get_metadata(self) -> EnvironmentMetadata:
        doc = (type(self.env.unwrapped).__doc__ or "").strip().split("\n\n")[0]
        return EnvironmentMetadata(name=self.env_id, description=" ".join(doc.split()) or self.env_id,
                                   version=memenv.__version__, author="memenv")

    def close(self) -> None:
        self.env.close()


def tool_names(env: gym.Env) -> tuple[str, ...]:
    """The memory-tools calls ``env`` offers over an episode (its text protocol's tags), or ``()`` for an env in
    the rewrite protocol: MemQA's store tools, ``search`` and ``answer``; the dialogue envs' store tools,
    ``next``, ``answer`` and ``strategy`` (refused, as in-process, outside a strategy phase)."""
    from memenv.envs.memqa import QA_TOOLS, MemQAEnv
    from memenv.memory_tools import TOOL_NAMES

    base = env.unwrapped
    if getattr(base, "memory_mode", None) != "tools":
        return ()
    if isinstance(base, MemQAEnv):
        return QA_TOOLS
    return tuple(name for name in TOOL_NAMES if name != "search")


def _tool_functions(play: Any) -> dict[str, Any]:
    """The memory tools as typed Python functions (FastMCP derives each one's JSON schema and description from
    its signature and docstring); each plays the call's canonical action text (``format_tool_call``) as one env
    step through ``play(text)`` and returns that step as a dict."""
    from memenv.memory_tools import format_tool_call

    def mem_add(text: str) -> dict:
        """Add an entry to the memory store; the result names its id.

        Args:
            text: the entry's text
        """
        return play(format_tool_call("mem_add", text))

    def mem_update(id: int, text: str) -> dict:  # noqa: A002 - the tool's argument is called id, as in <mem_update id=N>
        """Replace the text of memory entry ``id``.

        Args:
            id: the entry's id (from mem_add's result or the memory block)
            text: the entry's new text
        """
        return play(format_tool_call("mem_update", text, id))

    def mem_delete(id: int) -> dict:  # noqa: A002
        """Delete memory entry ``id``.

        Args:
            id: the entry's id
        """
        return play(format_tool_call("mem_delete", "", id))

    def mem_search(query: str) -> dict:
        """Search the memory entries (BM25); the result lists the best ones as "[id] text".

        Args:
            query: the search terms
        """
        return play(format_tool_call("mem_search", query))

    def search(query: str) -> dict:
        """Search the document collection; the result shows the documents found.

        Args:
            query: the search terms
        """
        return play(format_tool_call("search", query))

    def next() -> dict:  # noqa: A001 - the tool is <next/> in the text protocol
        """Done with this session: show the next one."""
        return play(format_tool_call("next"))

    def answer(text: str) -> dict:
        """Answer the question(s) shown (several answers separated by "; "); ends the episode.

        Args:
            text: the answer text
        """
        return play(format_tool_call("answer", text))

    def strategy(text: str) -> dict:
        """Rewrite the memory-strategy text (offered in a strategy phase only).

        Args:
            text: the new strategy text
        """
        return play(format_tool_call("strategy", text))

    return {f.__name__: f for f in (mem_add, mem_update, mem_delete, mem_search, search, next, answer, strategy)}


def _one_line_tool_error(tool: str, message: str) -> str:
    """A tool call's refusal (FastMCP's pydantic report, several lines) as one line naming the argument."""
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    if len(lines) >= 3 and "validation error" in lines[0]:
        import re

        reason = re.sub(r"\s*\[type=.*$", "", lines[2])
        return f"{tool}: argument {lines[1]!r}: {reason}"
    joined = " ".join(lines)
    return joined if joined.startswith(f"{tool}: ") else f"{tool}: {joined}"


def tool_argument_error(function: Any, tool: str, arguments: Any) -> str | None:
    """One line refusing a tool call whose arguments are not of their JSON types exactly (``id`` an integer,
    never a boolean, a float or a numeric string; every text a string), or None. FastMCP's validation coerces
    (``true`` became entry 1), where the action text in-process has no such reading. Unknown tools and missing
    or unknown arguments are left to FastMCP, whose messages name them."""
    if function is None or not isinstance(arguments, dict):
        return None
    import inspect

    for name, parameter in inspect.signature(function).parameters.items():
        if name not in arguments:
            continue
        value, wanted = arguments[name], parameter.annotation
        if wanted in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{tool}: argument {name!r}: must be a JSON integer, got {json_kind(value)} {json.dumps(value)[:40]}"
        if wanted in ("str", str) and not isinstance(value, str):
            return f"{tool}: argument {name!r}: Input should be a valid string, got {json_kind(value)}"
    return None


def _play_held(holder: dict[str, Any], text: str) -> dict[str, Any]:
    """Play ``text`` on the environment in ``holder`` (:class:`MemenvToolsEnvironment` empties it on close)."""
    env = holder.get("env")
    if env is None:
        raise RequestError("the session's env is closed", "EXECUTION_ERROR")
    return env._play(text)


class MemenvToolsEnvironment(MCPEnvironment):
    """A memory-tools env (``memory_mode="tools"``) as an OpenEnv MCP environment: its calls (``mem_add``,
    ``mem_update``, ``mem_delete``, ``mem_search``, ``search`` or ``next``, ``answer``, ``strategy``:
    :func:`tool_names`) are MCP tools with JSON schemas, listed by ``ListToolsAction`` (``tools/list``) and
    called by ``CallToolAction`` (``tools/call``). A call is one env step, the same as its action text
    in-process (``mem_add(text="x")`` is ``env.step("<mem_add>x</mem_add>")``): the observation's ``result``
    is ``{"text", "reward", "terminated", "truncated", "info"}`` of that step, its ``reward`` and ``done`` the
    step's. Text actions (``MemenvAction``) still work, and ``reset`` / ``state`` are the env's, as in
    :class:`MemenvEnvironment` (which this wraps as ``core``)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
        from fastmcp import FastMCP

        self.core = MemenvEnvironment(env_id, env_kwargs)
        self.env_id, self.env_kwargs, self.env = self.core.env_id, self.core.env_kwargs, self.core.env
        self.tools = tool_names(self.env)
        if not self.tools:
            self.core.close()
            raise ValueError(f"{env_id} with {self.env_kwargs or 'its defaults'} is not in memory-tools mode: "
                             "it has no tools (memory_mode='tools')")
        server = FastMCP(f"memenv {env_id}")
        # The tool functions reach this environment through a holder that close() empties, never directly:
        # FastMCP caches every tool function it is given (functools.lru_cache of 5000, keyed on the function),
        # so a function closing over self (or self._play) kept each closed session's env alive for good.
        self._holder: dict[str, MemenvToolsEnvironment] = {"env": self}
        functions = _tool_functions(functools.partial(_play_held, self._holder))
        self._functions = {name: functions[name] for name in self.tools}
        for name in self.tools:
            server.tool(functions[name])
        self._last_step: dict[str, Any] | None = None
        super().__init__(server)

    def _play(self, text: str) -> dict[str, Any]:
        observation = self.core.step(MemenvAction(text=text))
        self._last_step = {"text": observation.text, "reward": observation.reward,
                           "terminated": observation.terminated, "truncated": observation.truncated,
                           "info": observation.info}
        return self._last_step

    def reset(self, seed: int | None = None, episode_id: str | None = None, options: dict | None = None,
              **kwargs: Any) -> MemenvObservation:
        return self.core.reset(seed=seed, episode_id=episode_id, options=options, **kwargs)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """A ``CallToolAction`` plays its tool (one env step); a refused call (an unknown tool, a bad argument,
        a finished episode) changes nothing and comes back in the observation's ``error``, one line naming the
        argument or the reason. Anything else is :class:`MemenvEnvironment`'s."""
        if not isinstance(action, CallToolAction):
            return super().step(action, timeout_s=timeout_s, **kwargs)
        refused = tool_argument_error(self._functions.get(action.tool_name), action.tool_name, action.arguments)
        if refused is not None:
            return CallToolObservation(tool_name=action.tool_name, result=None, reward=None, done=self.core._done,
                                       error=ToolError(error_type=ToolErrorType.INVALID_ARGS, message=refused))
        self._last_step = None
        observation = super().step(action, timeout_s=timeout_s, **kwargs)
        step, self._last_step = self._last_step, None
        if observation.error is not None or step is None:
            error = observation.error or ToolError(error_type=ToolErrorType.EXECUTION_ERROR,
                                                   message="the tool returned no step")
            return CallToolObservation(tool_name=action.tool_name, result=None, reward=None, done=self.core._done,
                                       error=ToolError(error_type=error.error_type,
                                                       message=_one_line_tool_error(action.tool_name, error.message)))
        return CallToolObservation(tool_name=action.tool_name, result=step, reward=step["reward"],
                                   done=bool(step["terminated"] or step["truncated"]))

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if not isinstance(action, MemenvAction):
            raise RequestError(f"unknown action {type(action).__name__}: send a tool call or {{'text': ...}}")
        return self.core.step(action)

    @property
    def state(self) -> MemenvState:
        return self.core.state

    def get_metadata(self) -> EnvironmentMetadata:
        return self.core.get_metadata()

    def close(self) -> None:
        self._holder.clear()  # the cached tool functions no longer reach this environment (see __init__)
        super().close()
        self.core.close()
