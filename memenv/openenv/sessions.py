"""The sessions of a server (:class:`SessionHub`, the ``/ws`` and ``POST /mcp`` endpoints): each with its own env
on its own thread, counted toward ``max_sessions`` from connect until it ends, reaped when idle, and ended with a
close frame whose reason says why."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction, ToolErrorType
from starlette.requests import Request
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from memenv.openenv.environments import MemenvEnvironment, MemenvToolsEnvironment
from memenv.openenv.messages import (RequestError, error_reply, json_kind, parse_action, parse_message,
                                     request_json_body, rpc_error, rpc_result, wire_observation)


#: Close codes a session ends with; the close frame's reason says why in one line (:class:`SessionEndedError`).
CLOSE_BY_CLIENT = 1000  # the client sent {"type": "close"}
CLOSE_POLICY = 1008  # a socket that cannot attach to the session it names
CLOSE_SERVER_ERROR = 1011  # the session's env could not be made (its data damaged or gone, or a bug: logged)
CLOSE_SERVER_FULL = 1013  # "try again later": --max-sessions sessions are open
CLOSE_IDLE = 4000  # no message for --session-timeout seconds

SESSION_LOG = logging.getLogger("memenv.serve")


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

    async def _open(self, websocket: Any) -> tuple[_Session | None, str]:
        """A new session with its env, counted from now, and ``""``; or None and why its env could not be made in
        one line (the session ended, the client told, the log keeping the traceback)."""
        import asyncio

        from tasks.types import DataFormatError

        session = _Session(websocket)
        self.sessions[session.id] = session  # no await since the caller's capacity check: no overshoot
        self._start_reaper()
        try:
            session.env = await asyncio.get_running_loop().run_in_executor(session.executor, self.factory)
        except Exception as exc:  # noqa: BLE001 - the env was made once at start-up: its data changed, or a bug
            cause = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if isinstance(exc, (DataFormatError, OSError)):  # a data file damaged or gone since the start
                SESSION_LOG.error("memenv serve: session %s: the env cannot be made: %s", session.id[:8], cause)
            else:
                SESSION_LOG.exception("memenv serve: session %s: the env could not be made", session.id[:8])
            why = f"the server cannot make the env: {cause}"
            if websocket is not None:  # what OpenEnv clients read, in full, before the close frame
                await self._send(websocket, error_reply(why, "EXECUTION_ERROR"))
            await self.end(session, CLOSE_SERVER_ERROR, _close_reason(why))
            return None, why
        session.last_active = time.monotonic()  # idle from now: a slow build is no reason to reap it at once
        return session, ""

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
            await self._send(websocket, error_reply(reason, "CAPACITY_REACHED"))  # what OpenEnv clients read
            await _close(websocket, CLOSE_SERVER_FULL, reason)
            return
        session, _ = await self._open(websocket)
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
            await self._send(websocket, error_reply(why, "SESSION_ERROR"))
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
                SESSION_LOG.info("memenv serve: session %s: the client left before its reply was sent", session.id[:8])
                return

    async def _answer(self, session: _Session, message: dict) -> Any:
        """The reply to one frame: an observation, a state, an MCP reply or an error (one line naming the
        field); None: close."""
        import asyncio

        from openenv.core.env_server.types import WSObservationResponse, WSStateResponse

        try:
            kind, data = parse_message(message)
        except RequestError as exc:
            return error_reply(str(exc), exc.code)
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
                observation = await run(env.step, parse_action(data, self.tools))
            return WSObservationResponse(data=wire_observation(observation))
        except RequestError as exc:  # the request is wrong; nothing of the env changed
            return error_reply(f"{kind}: {exc}", exc.code)
        except Exception as exc:  # a bug of the env or of memenv: the session goes on, the log keeps the traceback
            SESSION_LOG.exception("memenv serve: session %s: %s failed", session.id[:8], kind)
            return error_reply(f"{kind} failed on the server: {type(exc).__name__}: {exc}", "EXECUTION_ERROR")

    async def serve_rpc(self, request: Request) -> Any:
        """``POST /mcp``: one JSON-RPC request, answered with status 200 and a JSON-RPC reply (an error reply
        for a JSON value that is not a JSON-RPC request: one line naming the field). A body that is not JSON at
        all (not UTF-8, not valid JSON) is status 400 with a JSON-RPC parse error (-32700, one line), as MCP's
        HTTP transport answers a body that is no JSON-RPC message."""
        from starlette.responses import JSONResponse

        try:
            data = request_json_body(await request.body())
        except RequestError as exc:
            return JSONResponse(rpc_error(None, -32700, str(exc)), status_code=400)
        return await self._rpc(data, None)

    async def _rpc(self, data: Any, session: _Session | None) -> dict:
        """The JSON-RPC reply to ``data`` (``session``: the WebSocket's own, for ``mcp`` messages)."""
        import asyncio

        from openenv.core.env_server.serialization import serialize_observation

        if not isinstance(data, dict):
            return rpc_error(None, -32600, f"a JSON-RPC request must be a JSON object, got {json_kind(data)}")
        rid = data.get("id")
        rid = rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
        method, params = data.get("method"), data.get("params", {})
        if data.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return rpc_error(rid, -32600, "a JSON-RPC request needs \"jsonrpc\": \"2.0\" and a string \"method\"")
        if not isinstance(params, dict):
            return rpc_error(rid, -32602, f"'params' must be a JSON object, got {json_kind(params)}")
        if "session_id" in params and not isinstance(params["session_id"], str):  # a list would be unhashable
            return rpc_error(rid, -32602, f"'session_id' must be a string, got {json_kind(params['session_id'])}")
        if method == "openenv/session/create":
            if session is not None:
                return rpc_result(rid, {"session_id": session.id})
            reason = self._full_reason()
            if reason is not None:
                return rpc_error(rid, -32000, reason)
            opened, why = await self._open(None)
            if opened is None:
                return rpc_error(rid, -32000, why)
            return rpc_result(rid, {"session_id": opened.id})
        if method == "openenv/session/close":
            target = self.sessions.get(params.get("session_id"))  # type: ignore[arg-type]
            if target is None:
                return rpc_error(rid, -32602, f"unknown session_id {params.get('session_id')!r}")
            if target is session:
                return rpc_error(rid, -32600, "this socket's own session ends with a {\"type\": \"close\"} message")
            await self.end(target, CLOSE_BY_CLIENT, "session closed")
            return rpc_result(rid, {"session_id": target.id, "closed": True})
        if method not in ("tools/list", "tools/call"):
            return rpc_error(rid, -32601, f"unknown method {method!r}: expected tools/list, tools/call, "
                                           "openenv/session/create or openenv/session/close")
        if not self.tools:
            return rpc_error(rid, -32601, "this env has no MCP tools (its actions are text: step with "
                                           "{\"text\": ...}); serve it with --kw memory_mode=tools for tools")
        if session is None and "session_id" in params:
            session = self.sessions.get(params["session_id"])
            if session is None or session.env is None:
                return rpc_error(rid, -32602, f"unknown session_id {params['session_id']!r}")
        if method == "tools/list":
            if session is None:  # the tools are the same for every session: list them off a fresh env
                env = await asyncio.get_running_loop().run_in_executor(None, self.factory)
                try:
                    listed = await asyncio.get_running_loop().run_in_executor(None, env.step, ListToolsAction())
                finally:
                    env.close()
            else:
                listed = await self._in_session(session, lambda: session.env.step(ListToolsAction()))
            return rpc_result(rid, {"tools": [tool.model_dump() for tool in listed.tools]})
        if session is None:
            return rpc_error(rid, -32602, "tools/call needs a session: 'session_id' from openenv/session/create "
                                           "(or send it as an mcp message on a /ws session)")
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return rpc_error(rid, -32602, "tools/call: 'name' must be a string and 'arguments' a JSON object")
        call = CallToolAction(tool_name=name, arguments=arguments)
        observation = await self._in_session(session, lambda: session.env.step(call))
        if observation.error is not None:
            return rpc_error(rid, -32602 if observation.error.error_type != ToolErrorType.EXECUTION_ERROR else -32000,
                              observation.error.message)
        step = observation.result
        content = [{"type": "text", "text": step["text"]}]
        return rpc_result(rid, {"content": content, "isError": False, "data": serialize_observation(observation)
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
            SESSION_LOG.info("memenv serve: session %s ended (%d): %s", session.id[:8], code, reason)
        if session.websocket is not None:
            await _close(session.websocket, code, reason)
        if session.env is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(session.executor, session.env.close)
            except Exception:  # noqa: BLE001 - a failing close must not keep the slot; the log says so
                SESSION_LOG.exception("memenv serve: session %s: closing its env failed", session.id[:8])
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
            session = None  # the loop variable would keep the last one reaped (its socket) until the next sweep

def _close_reason(text: str, limit: int = 123) -> str:
    """``text`` cut to what a WebSocket close frame carries (123 bytes of UTF-8), ``...`` marking a cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit - 3].decode("utf-8", errors="ignore") + "..."


async def _close(websocket: Any, code: int, reason: str) -> None:
    """Close the socket with a close frame (code and reason) unless the client already closed it."""
    if websocket.client_state != WebSocketState.CONNECTED or websocket.application_state != WebSocketState.CONNECTED:
        return
    try:
        await websocket.close(code, reason)
    except (WebSocketDisconnect, OSError, RuntimeError):  # the client left meanwhile
        pass
