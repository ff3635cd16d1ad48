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

One concern per module, every public name re-exported here: ``types`` (the action, observation and state models,
:func:`jsonable`), ``environments`` (the two environments, :func:`tool_names`), ``messages`` (parsing what comes
in, :class:`RequestError`, the replies' shapes), ``sessions`` (:class:`SessionHub`, the close codes), ``app``
(:func:`create_app`, serving, :class:`BackgroundServer`), ``client`` (:class:`MemenvClient`, :class:`ServedEnv`,
:func:`connect`).
"""

from memenv.openenv.app import (HEALTH_TTL_S, MAX_HTTP_BODY_BYTES, BackgroundServer, app_from_environment, create_app,
                                run_app, serve)
from memenv.openenv.client import MemenvClient, ServedEnv, SessionEndedError, connect
from memenv.openenv.environments import MemenvEnvironment, MemenvToolsEnvironment, tool_argument_error, tool_names
from memenv.openenv.messages import RequestError, env_unavailable_as_503, request_json_body, wire_observation
from memenv.openenv.sessions import (CLOSE_BY_CLIENT, CLOSE_IDLE, CLOSE_POLICY, CLOSE_SERVER_ERROR, CLOSE_SERVER_FULL,
                                     SessionHub)
from memenv.openenv.types import (DEFAULT_MAX_SESSIONS, MemenvAction, MemenvObservation, MemenvState,
                                  jsonable)

__all__ = ["BackgroundServer", "CLOSE_BY_CLIENT", "CLOSE_IDLE", "CLOSE_POLICY", "CLOSE_SERVER_ERROR",
           "CLOSE_SERVER_FULL", "DEFAULT_MAX_SESSIONS", "HEALTH_TTL_S", "MAX_HTTP_BODY_BYTES", "MemenvAction",
           "MemenvClient", "MemenvEnvironment", "MemenvObservation", "MemenvState", "MemenvToolsEnvironment",
           "RequestError", "ServedEnv", "SessionEndedError", "SessionHub", "app_from_environment", "connect",
           "create_app", "env_unavailable_as_503", "jsonable", "request_json_body", "run_app", "serve",
           "tool_argument_error", "tool_names", "wire_observation"]
