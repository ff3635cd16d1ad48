"""The server: :func:`create_app` (openenv's FastAPI app with memenv's sessions and HTTP endpoints), :func:`serve`
and :func:`run_app` (uvicorn, what ``memenv serve`` runs), :func:`app_from_environment` (the manifest's app) and
:class:`BackgroundServer` (a server in a thread: tests, notebooks)."""

from __future__ import annotations

import functools
import json
import logging
import math
import socket
import threading
import time
from typing import Any

import gymnasium as gym
from openenv.core.env_server import create_fastapi_app as openenv_create_app
from starlette.requests import Request

from memenv.openenv.environments import MemenvEnvironment, MemenvToolsEnvironment, tool_names
from memenv.openenv.messages import (RequestError, env_unavailable_as_503, first_error, json_kind, request_json_body,
                                     wire_observation)
from memenv.openenv.sessions import SESSION_LOG, SessionHub
from memenv.openenv.types import DEFAULT_MAX_SESSIONS, MemenvAction, MemenvObservation, MemenvState

#: The largest HTTP request body the server reads (``POST /reset``, ``POST /mcp``; a tool call's text fits many
#: times over): a longer one is answered 413 after at most this many bytes were read, whatever its
#: Content-Length says (WebSocket frames have their own cap, uvicorn's ``ws_max_size``).
MAX_HTTP_BODY_BYTES = 1 << 20

#: Seconds a ``/health`` answer is reused: each one makes an env and resets it (cheap, but not free).
HEALTH_TTL_S = 5.0


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
    _guard_http(app, factory)
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
        data = request_json_body(body) if body.strip() else {}
        if not isinstance(data, dict):
            raise RequestError(f"the request body must be a JSON object (seed, options, episode_id), "
                               f"got {json_kind(data)}")

        def fresh_reset() -> dict:
            with env_unavailable_as_503():
                env = factory()
            try:
                with env_unavailable_as_503():
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

def _answer_http_errors_in_one_line(app: Any) -> None:
    """The HTTP endpoints' refusals as ``{"detail": "<one line naming the field>"}``: a :class:`RequestError` of
    the env (a bad seed) is 400 rather than 500, a body FastAPI cannot validate is 422 with one line rather
    than pydantic's list of dicts."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    async def refused(request: Any, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    async def invalid(request: Any, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": first_error(exc.errors())}, status_code=422)

    app.add_exception_handler(RequestError, refused)
    app.add_exception_handler(RequestValidationError, invalid)

class _BodyLimit:
    """ASGI middleware: an HTTP request body longer than ``max_bytes`` is answered 413 (one-line JSON), whether
    or not a Content-Length announced it; a shorter one is passed on whole. Past the limit the rest of the body
    is read and dropped chunk by chunk (so that the client, still sending, gets the answer rather than a reset
    connection), so a request holds at most ``max_bytes`` of body in memory (the endpoints read bodies whole)."""

    def __init__(self, app: Any, max_bytes: int = MAX_HTTP_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, int(max_bytes)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        over = declared is not None and (not declared.strip().isdigit() or int(declared) > self.max_bytes)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            over = over or size > self.max_bytes
            if over:
                chunks.clear()  # dropped: only the answer is left to give
            else:
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if over:
            await self._refuse(send, declared)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, declared: bytes | None) -> None:
        said = f" (Content-Length {declared.decode('latin-1')[:20]})" if declared is not None else ""
        body = json.dumps({"detail": f"the request body is over the server's limit of {self.max_bytes} bytes"
                                     f"{said}"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _guard_http(app: Any, factory: Any, max_body_bytes: int = MAX_HTTP_BODY_BYTES) -> None:
    """What keeps the HTTP side bounded and truthful: request bodies capped (:class:`_BodyLimit`), any failure
    that escapes an endpoint answered as one-line JSON (500, the traceback in the server's log only), and
    ``GET /health`` answering 200 only while a fresh env can be made and reset (else 503 naming why; the
    answer is reused for :data:`HEALTH_TTL_S` seconds)."""
    import asyncio

    from fastapi.responses import JSONResponse

    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)

    async def failed(request: Any, exc: Exception) -> JSONResponse:
        SESSION_LOG.error("memenv serve: %s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": f"{request.url.path} failed on the server: {type(exc).__name__}: {exc}"
                             .splitlines()[0]}, status_code=500)

    app.add_exception_handler(Exception, failed)
    last: dict[str, Any] = {"at": -math.inf, "problem": None}

    def probe() -> str | None:
        try:
            with env_unavailable_as_503():
                env = factory()
                try:
                    env.reset(seed=0)
                finally:
                    env.close()
        except Exception as exc:  # noqa: BLE001 - whatever stops a reset makes the server unhealthy
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None

    async def health():  # no annotation: FastAPI would read it as a response model
        now = time.monotonic()
        if now - last["at"] > HEALTH_TTL_S:
            last["problem"] = await asyncio.get_running_loop().run_in_executor(None, probe)
            last["at"] = time.monotonic()
        if last["problem"] is None:
            return JSONResponse({"status": "healthy"})
        return JSONResponse({"status": "unhealthy", "detail": last["problem"]}, status_code=503)

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]
    app.add_api_route("/health", health, methods=["GET"], tags=["Health"], response_model=None,
                      summary="200 while a fresh env can be made and reset, else 503 naming why")


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
    SESSION_LOG.setLevel(level.upper())
    if not SESSION_LOG.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:    %(message)s"))
        SESSION_LOG.addHandler(handler)
        SESSION_LOG.propagate = False


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
