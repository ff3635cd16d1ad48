"""A stand-in for an OpenAI-compatible server on 127.0.0.1 (NOT a model): it answers ``/v1/models``,
``/v1/completions`` and ``/v1/chat/completions`` with whatever a test's ``reply(prompt) -> str`` returns, and
keeps every request body it got. Used by the judge and served-strategy tests."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator


class StandIn:
    def __init__(self, reply: Callable[[str], str]) -> None:
        self.reply = reply
        self.requests: list[dict] = []
        self.url = ""

    def prompts(self) -> list[str]:
        return [r.get("prompt") or r["messages"][-1]["content"] for r in self.requests]


@contextmanager
def standin_server(reply: Callable[[str], str]) -> Iterator[StandIn]:
    """Serve ``reply`` on a free 127.0.0.1 port; yields the :class:`StandIn` (``url`` is the ``/v1`` base)."""
    state = StandIn(reply)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._send({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state.requests.append(body)
            prompt = body.get("prompt") if "prompt" in body else body["messages"][-1]["content"]
            text = state.reply(prompt)
            tokens = (len(prompt.split()), len(text.split()))
            usage = {"prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": sum(tokens)}
            # the fields of OpenAI's schema that strict clients (verifiers) validate, whatever they hold
            head = {"id": "cmpl-standin", "created": 0, "model": body.get("model", "stand-in")}
            if self.path.endswith("/chat/completions"):
                self._send({**head, "object": "chat.completion", "usage": usage,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                         "finish_reason": "stop"}]})
            else:
                self._send({**head, "object": "text_completion", "usage": usage,
                            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
