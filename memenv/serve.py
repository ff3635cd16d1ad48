"""``memenv serve ENV_ID``: serve an env over OpenEnv (:mod:`memenv.openenv`, ``pip install 'memenv[openenv]'``).

This module only registers the command, so that ``memenv --help`` works without openenv; the server is imported
when the command runs.
"""

from __future__ import annotations

import argparse
import sys

SERVE_HELP = """Serve a memenv env as an OpenEnv server (openenv 0.10's FastAPI app). Each WebSocket session (/ws)
gets its own env; reset takes seed= and options=, every step's observation carries the step's info
(invocation, and the summary at the end) in its `info` field. In memory-tools mode (--kw memory_mode=tools)
the tools are MCP tools too (POST /mcp, or mcp messages on /ws). A session ends when the client closes it, drops,
or idles past --session-timeout: the server closes the socket with a close frame whose reason says why. A bad
message is answered with one error line naming the field, and the session plays on. Clients:

  from memenv.openenv import connect
  env = connect("http://127.0.0.1:8000")        # Gymnasium-like: reset(seed=...), step(action)

or any OpenEnv client (GenericEnvClient, actions {"text": "<memory>...</memory><search>...</search>"};
MCPToolClient for the tools of a memory-tools env)."""


def register_cli(sub: argparse._SubParsersAction) -> None:
    from memenv.cli_common import HelpFormatter, positive_float, positive_int

    serve = sub.add_parser("serve", help="serve an env over OpenEnv (pip install 'memenv[openenv]')",
                           description=SERVE_HELP, formatter_class=HelpFormatter)
    serve.add_argument("env", help="environment id, e.g. MemQA-v0")
    serve.add_argument("--kw", nargs="*", action="extend", metavar="KEY=VALUE",
                       help="env kwargs, e.g. memory_mode=tools objectives=1 (default: the env's own)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind")
    serve.add_argument("--port", type=_port, default=8000, help="port to bind (0: a free one, printed)")
    serve.add_argument("--max-sessions", type=positive_int, default=64,
                       help="sessions open at once; one counts from connect until it is closed or reaped, and a "
                            "client over the limit is refused (close code 1013, 'server full: ...')")
    serve.add_argument("--session-timeout", type=positive_float, default=None, metavar="SECONDS",
                       help="end sessions that send nothing this long (close code 4000, 'session idle for N s'); "
                            "default: never")
    serve.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level, and the session log's (sessions the server ended, clients gone "
                            "mid-request: one line each at info)")
    serve.set_defaults(func=_serve)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}")
    return value


def _serve(args: argparse.Namespace) -> int:
    from memenv.cli_common import CommandError, parse_kwargs, user_input

    kwargs = parse_kwargs(args.kw)
    from memenv import openenv  # ModuleNotFoundError 'openenv' -> "pip install -e '.[openenv]'" (memenv.cli)

    def ready(url: str) -> None:
        print(f"memenv serve: {args.env} at {url} (OpenEnv WebSocket sessions at {url.replace('http', 'ws', 1)}/ws)",
              flush=True)

    with user_input(args.env):  # an unknown id or a bad kwarg: one line, exit 2
        app = openenv.create_app(args.env, kwargs, max_sessions=args.max_sessions,
                                 session_timeout_s=args.session_timeout)
    try:
        openenv.run_app(app, host=args.host, port=args.port, log_level=args.log_level, ready=ready)
    except OSError as exc:  # the address is taken or cannot be bound
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: memenv serve ENV_ID")
