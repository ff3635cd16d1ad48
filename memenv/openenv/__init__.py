"""memenv envs over OpenEnv: a server built on ``openenv``'s (0.10) own classes, and a Gymnasium-like client.

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ (``pip install 'memenv[openenv]'``: the package ``openenv``)
serves an environment as a FastAPI app: each WebSocket connection to ``/ws`` is one session with its own
environment instance, driven by ``reset`` / ``step`` / ``state`` messages; ``/health``, ``/schema`` and
``/metadata`` describe it. This module plugs a memenv env into that machinery:

- :class:`MemenvEnvironment` is an ``openenv.core.env_server.Environment`` wrapping ``gym.make(env_id,
  **env_kwargs)``, one per session (``SUPPORTS_CONCURRENT_SESSIONS``: sessions share nothing mutable; the
  read-only corpus indexes are cached per process). ``reset(seed=..., options=...)`` and ``step(action)`` return
  a :class:`MemenvObservation`: ``text`` (the observation), ``reward``, ``done`` (terminated or truncated),
  ``terminated``, ``truncated`` and ``info``, the step's info dict made JSON-safe (:func:`jsonable`):
  ``info["invocation"]`` on every step, ``info["summary"]`` at the end, the reset info after a reset. The same
  dict is the observation's ``metadata`` in-process; on the wire (:func:`wire_observation`) it travels once, as
  ``info``.
- :class:`MemenvToolsEnvironment` (an env in memory-tools mode) is an OpenEnv ``MCPEnvironment``: the memory
  tools are MCP tools with JSON schemas (``tools/list``, ``tools/call``), each call one env step, the same as its
  action text in-process.
- :func:`create_app` builds the app with ``openenv.core.env_server.create_fastapi_app``; :func:`serve` runs it with
  uvicorn (what ``memenv serve ENV_ID`` does); :class:`BackgroundServer` runs it in a thread (tests, notebooks).
- :func:`connect` gives back a :class:`ServedEnv`: ``reset(seed=...) -> (obs, info)`` and ``step(action) -> (obs,
  reward, terminated, truncated, info)``, as the in-process env, over :class:`MemenvClient` (an
  ``openenv.core.EnvClient``; any OpenEnv client works, e.g. ``GenericEnvClient`` with actions
  ``{"text": "<search>...</search>"}``, or ``MCPToolClient`` for the tools of a memory-tools server).

Action text is never an error: a malformed action is an invalid step, as in-process (``info["invocation"]
["error"]``). What does fail is what fails in-process (stepping a finished episode, a bad seed) and a message
that is not OpenEnv's (a binary frame, a JSON array, a missing field): the server answers with an OpenEnv error
message of one line naming the field (:class:`RequestError`), nothing of the env changes, the session stays open,
and the client raises ``RuntimeError`` naming it.

Sessions (:class:`SessionHub`, the ``/ws`` and ``POST /mcp`` endpoints): one counts toward ``max_sessions`` from
connect until it ends; it ends when the client closes it or drops, or when it idles past ``session_timeout_s``,
and the server closes the socket with a close frame whose reason says why (``CLOSE_IDLE`` 4000,
``CLOSE_SERVER_FULL`` 1013 for a client over the limit). The client then raises :class:`SessionEndedError`
naming the URL and the reason, on that call and every later one, as it does when the server is gone.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, MCPEnvironment, Observation, State
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction, ToolError,
                                               ToolErrorType)
from openenv.core.env_server import create_fastapi_app as openenv_create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field, ValidationError
from starlette.requests import Request
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

import memenv  # noqa: F401 - registers the environments
from memenv.envs.base import check_reset_args, text_space

__all__ = ["BackgroundServer", "MemenvAction", "MemenvClient", "MemenvEnvironment", "MemenvObservation",
           "MemenvState", "MemenvToolsEnvironment", "RequestError", "app_from_environment", "ServedEnv", "SessionEndedError", "SessionHub",
           "connect", "create_app", "jsonable", "run_app", "serve", "tool_names", "wire_observation"]

#: Concurrent sessions a server accepts unless told otherwise.
DEFAULT_MAX_SESSIONS = 64


def jsonable(value: Any) -> Any:
    """``value`` as JSON-native data: numpy scalars and arrays to Python numbers and lists, tuples and sets to
    lists, mapping keys to strings, anything else to its ``repr``. memenv's info dicts are already of these types
    (the info contract), so for them this is the identity up to tuples becoming lists."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # JSON has no NaN/inf: keep them readable
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return repr(value)


class MemenvAction(Action):
    """One action: ``text`` is the action text of the env's protocol (``"<memory>...</memory><search>...
    </search>"``, ``"<mem_add>...</mem_add>"``). Anything else (a number, a list) reaches the env as it is and is
    an invalid step there, as in-process."""

    text: Any = Field(..., description="the action text, e.g. '<memory>notes</memory><search>query</search>'")


class MemenvObservation(Observation):
    """What a reset or step returns (``reward`` and ``done`` are OpenEnv's; ``done = terminated or truncated``)."""

    text: str = Field(default="", description="the whole text the policy sees at this invocation")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's info (invocation, summary), JSON-safe")
    terminated: bool = Field(default=False, description="the episode ended (an answer, the end of the task)")
    truncated: bool = Field(default=False, description="the episode was cut (the turn limit)")


class MemenvState(State):
    """``episode_id`` (the client's ``episode_id`` of the last reset when it gave one, as OpenEnv's state
    contract asks, else the env's own), ``env_episode_id`` (the env's own, as in the snapshots), ``step_count``
    (steps of this episode), ``env_id``, ``env_kwargs``, ``done``, ``memory`` (the memory text the next
    observation shows), ``episode_return``."""

    env_episode_id: str | None = None
    env_id: str = ""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    done: bool = True
    memory: str = ""
    episode_return: float = 0.0
    client_episode_id: str | None = None
    max_observation_chars: int = 1_000_000
    max_action_chars: int = 100_000


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
        functions = _tool_functions(self._play)
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
        super().close()
        self.core.close()


def create_app(env_id: str, env_kwargs: dict[str, Any] | None = None, *,
               max_sessions: int = DEFAULT_MAX_SESSIONS, session_timeout_s: float | None = None):
    """The OpenEnv FastAPI app serving ``env_id`` (openenv's ``create_fastapi_app``, simulation mode; each session gets
    its own env: :class:`MemenvEnvironment`, or :class:`MemenvToolsEnvironment` for an env in memory-tools mode,
    whose tools are MCP tools). The env is made once here, so an unknown id or a bad kwarg raises now, naming
    it, rather than at the first client. ``max_sessions`` and ``session_timeout_s`` (end sessions idle that
    long; default: never) are :class:`SessionHub`'s, which serves ``/ws`` and ``POST /mcp``."""
    from openenv.core.env_server import ConcurrencyConfig

    if not isinstance(max_sessions, int) or isinstance(max_sessions, bool) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    env_kwargs = dict(env_kwargs or {})
    probe = gym.make(env_id, **env_kwargs)
    tools = tool_names(probe)
    probe.close()
    if session_timeout_s is not None and (isinstance(session_timeout_s, bool)
                                          or not isinstance(session_timeout_s, (int, float))
                                          or not (math.isfinite(session_timeout_s) and session_timeout_s > 0)):
        raise ValueError(f"session_timeout_s must be a number > 0 or None, got {session_timeout_s!r}")
    # The limit and the timeout are SessionHub's; openenv's own session registry serves no session here.
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None)
    # A partial of the class: openenv reads SUPPORTS_CONCURRENT_SESSIONS off the class (no probe env).
    factory = functools.partial(MemenvToolsEnvironment if tools else MemenvEnvironment, env_id, env_kwargs)
    # create_fastapi_app, not create_app: the latter swaps in a Gradio app with sessions of its own when
    # ENABLE_WEB_INTERFACE is set, which SessionHub would not bound. The mode is fixed (not OPENENV_MODE's).
    app = openenv_create_app(factory, MemenvAction, MemenvObservation, env_name=env_id, concurrency_config=config,
                             state_cls=MemenvState, mode="simulation")
    SessionHub(factory, max_sessions, session_timeout_s, tools=tools).install(app)
    if tools:  # FastMCP logs every refused tool call (a bad argument) as a warning; the caller is told already
        logging.getLogger("fastmcp").setLevel(logging.ERROR)
    _replace_http_reset(app, factory)
    _answer_http_errors_in_one_line(app)
    return app


def app_from_environment() -> Any:
    """The app of the env named by the environment variables ``MEMENV_ENV`` (default ``MemQA-v0``) and
    ``MEMENV_KW`` (``KEY=VALUE`` words, as ``memenv serve --kw``), with ``MEMENV_MAX_SESSIONS`` and
    ``MEMENV_SESSION_TIMEOUT``: what the manifest's ``app`` names, for ``uvicorn --factory
    memenv.openenv:app_from_environment`` (the Dockerfile runs ``memenv serve`` with the same variables)."""
    import os

    from memenv.cli_common import parse_kwargs

    timeout = os.environ.get("MEMENV_SESSION_TIMEOUT")
    return create_app(os.environ.get("MEMENV_ENV", "MemQA-v0"), parse_kwargs(os.environ.get("MEMENV_KW", "").split()),
                      max_sessions=int(os.environ.get("MEMENV_MAX_SESSIONS", DEFAULT_MAX_SESSIONS)),
                      session_timeout_s=float(timeout) if timeout else None)


def _replace_http_reset(app: Any, factory: Any) -> None:
    """``POST /reset`` (stateless: a fresh env per request, OpenEnv's simulation mode) with the body read
    as the WebSocket ``reset``'s data: the same checks (:meth:`MemenvEnvironment.reset`), where OpenEnv's
    route coerced through pydantic first (``"7"`` and ``true`` became seeds). ``POST /step`` is refused (409, one
    line): OpenEnv's stepped a fresh env, which no memenv env allows before a reset (it answered 500)."""
    import asyncio

    async def reset(request: Request) -> dict:
        body = await request.body()
        try:
            data = json.loads(body) if body.strip() else {}
        except json.JSONDecodeError as exc:
            raise RequestError(f"the request body is not valid JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(data, dict):
            raise RequestError(f"the request body must be a JSON object (seed, options, episode_id), "
                               f"got {_json_kind(data)}")

        def fresh_reset() -> dict:
            env = factory()
            try:
                return wire_observation(env.reset(**data))
            finally:
                env.close()

        return await asyncio.get_running_loop().run_in_executor(None, fresh_reset)

    async def step(request: Request) -> None:
        raise RequestError("POST /step has no episode to step: the HTTP endpoints are stateless (a fresh env per "
                           "request); play episodes over the WebSocket sessions at /ws", status=409)

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ("/reset", "/step")]
    app.add_api_route("/reset", reset, methods=["POST"], tags=["Environment Control"],
                      summary="Reset a fresh env (stateless; play episodes over the /ws sessions)")
    app.add_api_route("/step", step, methods=["POST"], tags=["Environment Control"], status_code=409,
                      summary="Refused: a fresh env has no episode to step (play over the /ws sessions)")


def wire_observation(observation: Observation) -> dict[str, Any]:
    """The ``data`` of OpenEnv's observation message: ``{"observation": {fields}, "reward", "done"}``. The fields
    leave out ``metadata``: openenv 0.10's ``serialize_observation`` sends it twice (inside the observation and
    beside it), and a :class:`MemenvObservation`'s metadata is its ``info``, which travels once, as ``info``."""
    fields = observation.model_dump(exclude={"reward", "done", "metadata"})
    return {"observation": fields, "reward": observation.reward, "done": observation.done}


def _answer_http_errors_in_one_line(app: Any) -> None:
    """The HTTP endpoints' refusals as ``{"detail": "<one line naming the field>"}``: a :class:`RequestError` of
    the env (a bad seed) is 400 rather than 500, a body FastAPI cannot validate is 422 with one line rather
    than pydantic's list of dicts."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    async def refused(request: Any, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    async def invalid(request: Any, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _first_error(exc.errors())}, status_code=422)

    app.add_exception_handler(RequestError, refused)
    app.add_exception_handler(RequestValidationError, invalid)


#: Close codes a session ends with; the close frame's reason says why in one line (:class:`SessionEndedError`).
CLOSE_BY_CLIENT = 1000  # the client sent {"type": "close"}
CLOSE_POLICY = 1008  # a socket that cannot attach to the session it names
CLOSE_SERVER_ERROR = 1011  # the session's env could not be made (a bug: the server logs it)
CLOSE_SERVER_FULL = 1013  # "try again later": --max-sessions sessions are open
CLOSE_IDLE = 4000  # no message for --session-timeout seconds

_log = logging.getLogger("memenv.serve")


class _Session:
    """One session: its env, the one thread the env runs on, and what the reaper needs. ``websocket`` is the
    socket playing it: the one that opened it, or one attached to a session opened over ``POST /mcp``
    (``openenv/session/create``, OpenEnv's MCP client), which has none between its requests."""

    def __init__(self, websocket: Any) -> None:
        self.id = uuid.uuid4().hex
        self.websocket = websocket
        self.env: MemenvEnvironment | MemenvToolsEnvironment | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"memenv-session-{self.id[:8]}")
        self.last_active = time.monotonic()
        self.busy = False  # a request is being answered: never reaped then
        self.ended = False


class SessionHub:
    """The ``/ws`` endpoint: OpenEnv's WebSocket protocol (``reset`` / ``step`` / ``state`` / ``mcp`` / ``close``
    messages, ``observation`` / ``state`` / ``mcp`` / ``error`` replies), each session with its own env on its
    own thread; and ``POST /mcp``, OpenEnv's JSON-RPC for MCP tools (``tools/list``, ``tools/call``) and its
    session methods (``openenv/session/create``, ``openenv/session/close``).

    It replaces openenv's own ``/ws`` and ``/mcp`` handlers, whose idle reaper (openenv-core 0.3's) freed an
    idle session's slot but left its socket and env in play (the client played on, unaware, and such sessions
    were no longer counted, so ``--max-sessions`` bounded nothing). Here a session holds its slot from the
    moment it is opened until it ends, and it ends one way, :meth:`end`: the slot is freed, the env closed, and
    the socket closed with a close frame whose reason says why (the client asked, idle too long, the server is
    full). Sessions opened over ``POST /mcp`` count the same way and are reaped the same way.
    """

    def __init__(self, factory: Any, max_sessions: int, idle_timeout_s: float | None,
                 tools: tuple[str, ...] = ()) -> None:
        self.factory = factory
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.tools = tools
        self.sessions: dict[str, _Session] = {}
        self._reaper: Any = None

    def install(self, app: Any) -> None:
        """Put this hub at ``app``'s ``/ws`` and ``POST /mcp`` in place of openenv's handlers (openenv's
        WebSocket ``/mcp`` goes: its sessions would be a second way in, outside this hub's limit and timeout)."""
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ("/ws", "/mcp")]
        app.add_api_websocket_route("/ws", self.serve)
        app.add_api_route("/mcp", self.serve_rpc, methods=["POST"], tags=["MCP"],
                          summary="MCP JSON-RPC: tools/list, tools/call, openenv/session/create and close")
        app.router.on_shutdown.append(self._stop_reaper)
        app.state.sessions = self

    @property
    def open_sessions(self) -> int:
        return len(self.sessions)

    def _full_reason(self) -> str | None:
        if len(self.sessions) < self.max_sessions:
            return None
        return f"server full: {len(self.sessions)} of {self.max_sessions} sessions open, try again later"

    async def _open(self, websocket: Any) -> _Session | None:
        """A new session with its env, counted from now; None if its env could not be made (ended, logged)."""
        import asyncio

        session = _Session(websocket)
        self.sessions[session.id] = session  # no await since the caller's capacity check: no overshoot
        self._start_reaper()
        try:
            session.env = await asyncio.get_running_loop().run_in_executor(session.executor, self.factory)
        except Exception:  # the env was made once at start-up, so this is a bug: keep its traceback
            _log.exception("memenv serve: session %s: the env could not be made", session.id[:8])
            await self.end(session, CLOSE_SERVER_ERROR, "the server could not make the env (see its log)")
            return None
        return session

    async def serve(self, websocket: WebSocket) -> None:
        try:
            await websocket.accept()
        except (WebSocketDisconnect, OSError, RuntimeError):  # the client left during the handshake
            return
        attach = websocket.query_params.get("session_id")
        if attach is not None:  # OpenEnv's MCP client: play a session opened over POST /mcp
            await self._serve_attached(websocket, attach)
            return
        reason = self._full_reason()
        if reason is not None:
            await self._send(websocket, _error(reason, "CAPACITY_REACHED"))  # what OpenEnv clients read
            await _close(websocket, CLOSE_SERVER_FULL, reason)
            return
        session = await self._open(websocket)
        if session is None:
            return
        try:
            await self._play(session, websocket)
        finally:
            await self.end(session, CLOSE_BY_CLIENT, "session closed")

    async def _serve_attached(self, websocket: Any, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is None or session.env is None or session.websocket is not None:
            why = (f"unknown session_id {session_id!r} (open one with POST /mcp openenv/session/create)"
                   if session is None or session.env is None else f"session {session_id!r} already has a socket")
            await self._send(websocket, _error(why, "SESSION_ERROR"))
            await _close(websocket, CLOSE_POLICY, why)
            return
        session.websocket = websocket
        try:
            await self._play(session, websocket)
        finally:  # the socket goes; the session stays open until openenv/session/close (or the idle reaper)
            if session.websocket is websocket:
                session.websocket = None
            await _close(websocket, CLOSE_BY_CLIENT, "socket detached; the session stays open")

    async def _play(self, session: _Session, websocket: Any) -> None:
        while not session.ended:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect" or session.ended:
                return
            session.busy, session.last_active = True, time.monotonic()
            try:
                reply = await self._answer(session, message)
            finally:
                session.busy, session.last_active = False, time.monotonic()
            if reply is None or session.ended:  # the client said close
                return
            if not await self._send(websocket, reply):
                _log.info("memenv serve: session %s: the client left before its reply was sent", session.id[:8])
                return

    async def _answer(self, session: _Session, message: dict) -> Any:
        """The reply to one frame: an observation, a state, an MCP reply or an error (one line naming the
        field); None: close."""
        import asyncio

        from openenv.core.env_server.types import WSObservationResponse, WSStateResponse

        try:
            kind, data = _parse_message(message)
        except RequestError as exc:
            return _error(str(exc), exc.code)
        if kind == "close":
            return None
        if kind == "mcp":
            from openenv.core.env_server.mcp_types import WSMCPResponse

            return WSMCPResponse(data=await self._rpc(data, session))
        env = session.env
        run = functools.partial(asyncio.get_running_loop().run_in_executor, session.executor)
        try:
            if kind == "state":
                return WSStateResponse(data=(await run(lambda: env.state)).model_dump())
            if kind == "reset":
                observation = await run(lambda: env.reset(**data))
            else:
                observation = await run(env.step, _action(data, self.tools))
            return WSObservationResponse(data=wire_observation(observation))
        except RequestError as exc:  # the request is wrong; nothing of the env changed
            return _error(f"{kind}: {exc}", exc.code)
        except Exception as exc:  # a bug of the env or of memenv: the session goes on, the log keeps the traceback
            _log.exception("memenv serve: session %s: %s failed", session.id[:8], kind)
            return _error(f"{kind} failed on the server: {type(exc).__name__}: {exc}", "EXECUTION_ERROR")

    async def serve_rpc(self, request: Request) -> dict:
        """``POST /mcp``: one JSON-RPC request, answered with status 200 and a JSON-RPC reply (an error reply
        for a request that is not JSON-RPC: one line naming the field)."""
        body = await request.body()
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            return _rpc_error(None, -32700, f"the request body is not JSON ({exc.msg} at character {exc.pos})")
        return await self._rpc(data, None)

    async def _rpc(self, data: Any, session: _Session | None) -> dict:
        """The JSON-RPC reply to ``data`` (``session``: the WebSocket's own, for ``mcp`` messages)."""
        import asyncio

        from openenv.core.env_server.serialization import serialize_observation

        if not isinstance(data, dict):
            return _rpc_error(None, -32600, f"a JSON-RPC request must be a JSON object, got {_json_kind(data)}")
        rid = data.get("id")
        rid = rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
        method, params = data.get("method"), data.get("params", {})
        if data.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return _rpc_error(rid, -32600, "a JSON-RPC request needs \"jsonrpc\": \"2.0\" and a string \"method\"")
        if not isinstance(params, dict):
            return _rpc_error(rid, -32602, f"'params' must be a JSON object, got {_json_kind(params)}")
        if method == "openenv/session/create":
            if session is not None:
                return _rpc_ok(rid, {"session_id": session.id})
            reason = self._full_reason()
            if reason is not None:
                return _rpc_error(rid, -32000, reason)
            opened = await self._open(None)
            if opened is None:
                return _rpc_error(rid, -32000, "the server could not make the env (see its log)")
            return _rpc_ok(rid, {"session_id": opened.id})
        if method == "openenv/session/close":
            target = self.sessions.get(params.get("session_id"))  # type: ignore[arg-type]
            if target is None:
                return _rpc_error(rid, -32602, f"unknown session_id {params.get('session_id')!r}")
            if target is session:
                return _rpc_error(rid, -32600, "this socket's own session ends with a {\"type\": \"close\"} message")
            await self.end(target, CLOSE_BY_CLIENT, "session closed")
            return _rpc_ok(rid, {"session_id": target.id, "closed": True})
        if method not in ("tools/list", "tools/call"):
            return _rpc_error(rid, -32601, f"unknown method {method!r}: expected tools/list, tools/call, "
                                           "openenv/session/create or openenv/session/close")
        if not self.tools:
            return _rpc_error(rid, -32601, "this env has no MCP tools (its actions are text: step with "
                                           "{\"text\": ...}); serve it with --kw memory_mode=tools for tools")
        if session is None and "session_id" in params:
            session = self.sessions.get(params["session_id"])
            if session is None or session.env is None:
                return _rpc_error(rid, -32602, f"unknown session_id {params['session_id']!r}")
        if method == "tools/list":
            if session is None:  # the tools are the same for every session: list them off a fresh env
                env = await asyncio.get_running_loop().run_in_executor(None, self.factory)
                try:
                    listed = await asyncio.get_running_loop().run_in_executor(None, env.step, ListToolsAction())
                finally:
                    env.close()
            else:
                listed = await self._in_session(session, lambda: session.env.step(ListToolsAction()))
            return _rpc_ok(rid, {"tools": [tool.model_dump() for tool in listed.tools]})
        if session is None:
            return _rpc_error(rid, -32602, "tools/call needs a session: 'session_id' from openenv/session/create "
                                           "(or send it as an mcp message on a /ws session)")
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return _rpc_error(rid, -32602, "tools/call: 'name' must be a string and 'arguments' a JSON object")
        call = CallToolAction(tool_name=name, arguments=arguments)
        observation = await self._in_session(session, lambda: session.env.step(call))
        if observation.error is not None:
            return _rpc_error(rid, -32602 if observation.error.error_type != ToolErrorType.EXECUTION_ERROR else -32000,
                              observation.error.message)
        step = observation.result
        content = [{"type": "text", "text": step["text"]}]
        return _rpc_ok(rid, {"content": content, "isError": False, "data": serialize_observation(observation)
                             ["observation"]["result"]})

    async def _in_session(self, session: _Session, call: Any) -> Any:
        """``call()`` on ``session``'s env thread, counted as activity (never reaped meanwhile)."""
        import asyncio

        session.busy, session.last_active = True, time.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(session.executor, call)
        finally:
            session.busy, session.last_active = False, time.monotonic()

    @staticmethod
    async def _send(websocket: Any, reply: Any) -> bool:
        """Send one reply; False when the client is gone (a normal event: no traceback)."""
        try:
            await websocket.send_text(reply.model_dump_json())
            return True
        except (WebSocketDisconnect, OSError, RuntimeError):  # RuntimeError: starlette, socket already closed
            return False

    async def end(self, session: _Session, code: int, reason: str) -> None:
        """End ``session`` (once; later calls do nothing): free its slot, close its socket (if it has one) with
        ``code`` and ``reason``, close its env on its own thread and let the thread go."""
        import asyncio

        if session.ended:
            return
        session.ended = True
        self.sessions.pop(session.id, None)
        if code != CLOSE_BY_CLIENT:
            _log.info("memenv serve: session %s ended (%d): %s", session.id[:8], code, reason)
        if session.websocket is not None:
            await _close(session.websocket, code, reason)
        if session.env is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(session.executor, session.env.close)
            except Exception:  # noqa: BLE001 - a failing close must not keep the slot; the log says so
                _log.exception("memenv serve: session %s: closing its env failed", session.id[:8])
        session.executor.shutdown(wait=False)
        session.env = None

    def _start_reaper(self) -> None:
        import asyncio

        if self.idle_timeout_s is not None and (self._reaper is None or self._reaper.done()):
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _stop_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None

    async def _reap(self) -> None:
        """End the sessions idle longer than the timeout, checking a few times per timeout."""
        import asyncio

        timeout = self.idle_timeout_s
        reason = f"session idle for {timeout:g} s (the server's --session-timeout)"
        while True:
            await asyncio.sleep(min(max(timeout / 4, 0.05), 5.0))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if not session.busy and session.env is not None and now - session.last_active > timeout:
                    await self.end(session, CLOSE_IDLE, reason)


def _rpc_ok(rid: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _rpc_error(rid: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


async def _close(websocket: Any, code: int, reason: str) -> None:
    """Close the socket with a close frame (code and reason) unless the client already closed it."""
    if websocket.client_state != WebSocketState.CONNECTED or websocket.application_state != WebSocketState.CONNECTED:
        return
    try:
        await websocket.close(code, reason)
    except (WebSocketDisconnect, OSError, RuntimeError):  # the client left meanwhile
        pass


class RequestError(ValueError):
    """A request the server refuses (a bad field, a step before a reset): one line naming the field, answered
    as an OpenEnv error message (HTTP: status 400); the session and its env are as they were."""

    def __init__(self, message: str, code: str = "VALIDATION_ERROR", status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


_MESSAGE_TYPES = ("reset", "step", "state", "mcp", "close")
_MESSAGE_SHAPE = "message must be a JSON object with a 'type' field (reset, step, state, mcp or close)"
_MCP_ACTIONS = ("call_tool", "list_tools")


def _parse_message(message: dict) -> tuple[str, dict]:
    """``(type, data)`` of one WebSocket frame, or :class:`RequestError` naming what is wrong with it."""
    text = message.get("text")
    if text is None:
        raise RequestError(f"binary frames are not accepted: {_MESSAGE_SHAPE}, sent as a text frame")
    try:
        request = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"message is not JSON ({exc.msg} at character {exc.pos}): {_MESSAGE_SHAPE}",
                           "INVALID_JSON") from None
    if not isinstance(request, dict) or "type" not in request:
        raise RequestError(f"{_MESSAGE_SHAPE}, got {_json_kind(request)}")
    kind = request["type"]
    if kind not in _MESSAGE_TYPES:
        raise RequestError(f"unknown message type {kind!r}: expected one of {', '.join(_MESSAGE_TYPES)}",
                           "UNKNOWN_TYPE")
    unknown = sorted(set(request) - {"type", "data"})
    if unknown:
        raise RequestError(f"{kind}: unknown field(s) {unknown}: a message has 'type' and 'data'")
    data = request.get("data", {})
    if kind == "mcp":
        return kind, data  # a JSON-RPC request: SessionHub._rpc answers anything else with a JSON-RPC error
    if not isinstance(data, dict):
        raise RequestError(f"{kind}: 'data' must be a JSON object, got {_json_kind(data)}")
    if kind == "step" and "text" not in data and data.get("type") not in _MCP_ACTIONS:
        raise RequestError("step: 'data' must have a 'text' field (the action text), e.g. {\"text\": \"...\"}")
    return kind, data


def _action(data: dict, tools: tuple[str, ...] = ()) -> Action:
    """The action of a ``step`` message: a :class:`MemenvAction` (``{"text": ...}``), or for an env with MCP
    tools OpenEnv's ``{"type": "call_tool", "tool_name", "arguments"}`` / ``{"type": "list_tools"}``."""
    if data.get("type") in _MCP_ACTIONS:
        if not tools:
            raise RequestError(f"this env has no MCP tools ({data['type']}): its actions are {{\"text\": ...}}; "
                               "serve it with --kw memory_mode=tools for tools")
        cls = CallToolAction if data["type"] == "call_tool" else ListToolsAction
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise RequestError(f"unknown field(s) {unknown} in 'data': a {data['type']} action has "
                               f"{', '.join(repr(f) for f in cls.model_fields if f != 'metadata')}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RequestError(_first_error(exc.errors())) from None
    unknown = sorted(set(data) - set(MemenvAction.model_fields))
    if unknown:
        raise RequestError(f"unknown field(s) {unknown} in 'data': an action has 'text' (and 'metadata')")
    try:
        return MemenvAction(**data)
    except ValidationError as exc:
        raise RequestError(_first_error(exc.errors())) from None


def _first_error(errors: Any) -> str:
    """Pydantic's (or FastAPI's) list of validation errors as one line naming the first one's field."""
    first = dict(errors[0]) if errors else {}
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', first.get('msg'))})"
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    return f"{where or 'request body'}: {first.get('msg', 'invalid')}"


def _json_kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _error(message: str, code: str) -> Any:
    from openenv.core.env_server.types import WSErrorResponse

    return WSErrorResponse(data={"message": message, "code": code})


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(env_id: str, env_kwargs: dict[str, Any] | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = DEFAULT_MAX_SESSIONS, session_timeout_s: float | None = None,
          log_level: str = "warning", ready: Any = None) -> None:
    """Serve ``env_id`` on ``host:port`` until interrupted (uvicorn). ``ready(url)`` is called once listening."""
    app = create_app(env_id, env_kwargs, max_sessions=max_sessions, session_timeout_s=session_timeout_s)
    run_app(app, host=host, port=port, log_level=log_level, ready=ready)


def run_app(app: Any, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
            ready: Any = None) -> None:
    """Run an app of :func:`create_app` with uvicorn until interrupted; ``OSError`` if the address cannot be bound."""
    import uvicorn

    sock = _bind(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, ws_max_size=128 * 2**20))
    _log_at(log_level)
    if ready is not None:
        app.router.on_startup.append(lambda: ready(_url(host, sock.getsockname()[1])))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def _log_at(level: str) -> None:
    """The session log (``memenv.serve``: sessions ended by the server, clients gone mid-request, one line each;
    tracebacks only for bugs) on stderr at uvicorn's ``--log-level``."""
    _log.setLevel(level.upper())
    if not _log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:    %(message)s"))
        _log.addHandler(handler)
        _log.propagate = False


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BackgroundServer:
    """A server for ``env_id`` in a background thread of this process: ``with BackgroundServer("MemQA-v0") as
    server: env = connect(server.url)``. ``port=0`` takes a free port (``server.port`` says which)."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, max_sessions: int = DEFAULT_MAX_SESSIONS, session_timeout_s: float | None = None,
                 log_level: str = "warning", start_timeout_s: float = 30.0) -> None:
        import uvicorn

        self.app = create_app(env_id, env_kwargs, max_sessions=max_sessions, session_timeout_s=session_timeout_s)
        self.sessions: SessionHub = self.app.state.sessions
        self._sock = _bind(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self.url = _url(host, self.port)
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level=log_level, ws_max_size=128 * 2**20))
        self._server.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"memenv-openenv-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the OpenEnv server for {env_id} did not start on {self.url}")
            time.sleep(0.01)

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MemenvClient(EnvClient[MemenvAction, MemenvObservation, MemenvState]):
    """The typed OpenEnv client of a memenv server (async; ``.sync()`` for blocking calls)."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        text = action.text if isinstance(action, MemenvAction) else action
        try:
            json.dumps(text)
        except (TypeError, ValueError):
            text = repr(text)  # not JSON: the env sees its repr (an invalid step either way)
        return {"text": text}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MemenvObservation]:
        fields = dict(payload.get("observation", {}))
        fields.pop("metadata", None)  # the same dict as info (memenv's server leaves it out; others may not)
        observation = MemenvObservation(**fields, reward=payload.get("reward"), done=bool(payload.get("done")),
                                        metadata=fields.get("info", {}))
        return StepResult(observation=observation, reward=payload.get("reward"), done=bool(payload.get("done")))

    def _parse_state(self, payload: dict[str, Any]) -> MemenvState:
        return MemenvState(**payload)


async def _close_session(client: EnvClient, timeout_s: float = 5.0) -> None:
    import asyncio

    ws = client._ws
    await ws.send(json.dumps({"type": "close"}))
    await asyncio.wait_for(ws.wait_closed(), timeout_s)
    client._ws = None


class SessionEndedError(ConnectionError):
    """The session is over: the server closed it (the close frame's reason says why: idle too long, full, shut
    down) or the connection is gone (the server stopped, the network dropped). Connect again to play on."""


_CLOSE_MEANINGS = {1001: "the server is going away", 1006: "the connection dropped without a close frame",
                   1012: "the server shut down (or is restarting)"}


def _session_ended(url: str, frame: Any) -> SessionEndedError:
    """One line for a session that ended under the client, naming the URL and the server's reason (``frame``:
    the close frame the server sent, websockets' ``Close``; None when it sent none)."""
    if frame is not None:
        why = frame.reason or _CLOSE_MEANINGS.get(frame.code, "no reason given")
        why = f"the server closed it: {why} (close code {frame.code})"
    else:
        why = "the connection was lost (the server stopped or the network dropped)"
    return SessionEndedError(f"the OpenEnv session at {url} has ended: {why}; connect again to play on")


class ServedEnv(gym.Env):
    """A memenv env served over OpenEnv, used like the in-process one (one session = one env instance).

    ``reset(seed=None, options=None) -> (obs, info)``; ``step(action) -> (obs, reward, terminated, truncated,
    info)``; ``state()`` the server's :class:`MemenvState`; ``close()`` ends the session. The info dicts are the
    in-process ones passed through JSON (tuples come back as lists).
    """

    metadata = {"render_modes": []}

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, message_timeout_s: float = 600.0) -> None:
        self.url = url
        self._ended: SessionEndedError | None = None
        self.client = MemenvClient(base_url=url, connect_timeout_s=connect_timeout_s,
                                   message_timeout_s=message_timeout_s).sync()
        try:
            self.client.connect()
        except ConnectionError as exc:  # nothing listens there (refused, unknown host, timed out)
            self.client.close()
            raise ConnectionError(f"cannot reach the OpenEnv server at {url}: {exc.__cause__ or exc}") from None
        from websockets.exceptions import ConnectionClosed

        try:
            state = self.client.state()
        except (RuntimeError, ConnectionClosed) as exc:  # the server refused the session (it is full)
            self.client.close()
            frame = getattr(exc, "rcvd", None)
            reason = (frame.reason if frame is not None and frame.reason
                      else re.sub(r" \(code: \w+\)$", "", str(exc).removeprefix("Server error: ")))
            raise RuntimeError(f"the OpenEnv server at {url} refused the session: {reason}") from None
        self.env_id, self.env_kwargs = state.env_id, state.env_kwargs
        self.observation_space = text_space(state.max_observation_chars)
        self.action_space = text_space(state.max_action_chars)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        kwargs: dict[str, Any] = {}
        seed = check_reset_args(seed, options)  # the env's own check, before anything is sent (int(1.5) was 1)
        if seed is not None:
            kwargs["seed"] = seed
        if options is not None:
            kwargs["options"] = options
        result = self._call(self.client.reset, **kwargs)
        return result.observation.text, result.observation.info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        obs = self._call(self.client.step, MemenvAction(text=action)).observation
        return obs.text, float(obs.reward or 0.0), obs.terminated, obs.truncated, obs.info

    def state(self) -> MemenvState:
        return self._call(self.client.state)

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of the client; a session that ended under it is one
        :class:`SessionEndedError` naming the URL and why, on this call and every later one."""
        from websockets.exceptions import ConnectionClosed
        from websockets.protocol import State as SocketState

        if self._ended is not None:
            raise self._ended
        # openenv 0.10's client reconnects on its own when its socket is closed: that would be a new session on
        # the server, without this one's episode (its next step refused, "step before reset"). A session that
        # ended is over: say so, as when the call itself finds the socket closed.
        ws = self.client.async_client._ws
        if ws is None or ws.state in (SocketState.CLOSING, SocketState.CLOSED):
            self._ended = _session_ended(self.url, getattr(getattr(ws, "protocol", None), "close_rcvd", None))
            raise self._ended
        try:
            return method(*args, **kwargs)
        except (ConnectionClosed, ConnectionError) as exc:
            # websockets' ConnectionClosed carries the close frame the server sent, if any
            self._ended = _session_ended(self.url, getattr(exc, "rcvd", None))
            raise self._ended from None

    def close(self) -> None:
        """End the session: ask the server to close it and wait for its close frame (closing the socket first
        would make the server's own close fail with a logged ``WebSocketDisconnect``)."""
        if getattr(self.client, "_loop", None) is not None and self.client.async_client._ws is not None:
            try:
                self.client._run(_close_session(self.client.async_client))
            except Exception:  # noqa: BLE001 - best effort: the socket is closed below either way
                pass
        self.client.close()

    def __repr__(self) -> str:
        return f"ServedEnv({self.env_id!r} at {self.url})"


def connect(url: str, **kwargs: Any) -> ServedEnv:
    """A :class:`ServedEnv` session on the memenv OpenEnv server at ``url`` (``http://host:port``)."""
    return ServedEnv(url, **kwargs)
