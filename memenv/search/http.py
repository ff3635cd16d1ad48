"""JSON over HTTP with retries: the one client loop behind the retrieval server (:mod:`memenv.search.remote`), the BEAM
judge (:mod:`memenv.scoring.beam`) and served models (:mod:`agents.served`). Standard library only.

A request is retried, after ``backoff * 2**(attempt-1)`` seconds, when no answer came (refused connection,
timeout) or the server answered a transient status (:data:`RETRY_STATUS`, any 5xx). Callers turn the two
exceptions below into errors that name their own service.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Callable

#: Statuses worth another try: request timeout, conflict, rate limit, and every server error (5xx).
RETRY_STATUS = frozenset({408, 409, 429})


class HTTPStatusError(Exception):
    """The server answered with an error status that retrying will not change (or kept answering one)."""

    def __init__(self, url: str, status: int, reason: str, detail: str) -> None:
        super().__init__(f"{url} answered HTTP {status} {reason}: {detail}".rstrip(": "))
        self.url, self.status, self.reason, self.detail = url, status, reason, detail


class UnreachableError(Exception):
    """No answer after every attempt (``attempts``; ``reason`` of the last failure)."""

    def __init__(self, url: str, attempts: int, reason: str) -> None:
        super().__init__(f"{url} unreachable after {attempts} attempts: {reason}")
        self.url, self.attempts, self.reason = url, attempts, reason


def _transient(status: int) -> bool:
    return status >= 500 or status in RETRY_STATUS


def request_json(url: str, body: Any = None, *, headers: dict[str, str] | None = None, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.5, on_attempt: Callable[[], None] | None = None) -> Any:
    """``POST`` ``body`` as JSON (``GET`` when ``body`` is None) and return the decoded JSON reply.

    Raises :class:`HTTPStatusError` at once for a status that is not transient, :class:`UnreachableError` when
    every attempt failed (no answer, or a transient status), ``json.JSONDecodeError`` for a reply that is not JSON.
    ``on_attempt`` is called before each attempt (request counters)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    last_reason = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        if on_attempt is not None:
            on_attempt()
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace")[:300]
            if not _transient(err.code):
                raise HTTPStatusError(url, err.code, str(err.reason), detail) from None
            last_reason = f"HTTP {err.code}: {detail or err.reason}"
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            last_reason = str(getattr(err, "reason", err))
    raise UnreachableError(url, retries + 1, last_reason)
