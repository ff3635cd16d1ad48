"""JSON over HTTP with deadlines and retries: the one client loop behind the retrieval server
(:mod:`memenv.search.remote`), the LLM judge (:mod:`memenv.scoring.judges`) and served models
(:mod:`agents.llm.adapters.served`). Standard library only.

Time limits. ``timeout`` is the wall-clock budget of one attempt: connecting, sending the request, and reading
the status line, the headers and the whole body must all finish within it (a server that trickles its reply one
byte at a time is cut off at the deadline, not after ``timeout`` seconds of silence). ``total_timeout`` bounds
the whole call, every attempt and every backoff pause included; without it the bound is
``(retries + 1) * timeout`` plus the pauses. Name resolution (DNS) is the one step no deadline covers.

Retries. An attempt is retried, after ``backoff * 2**(attempt-1)`` seconds, when no reply came (refused
connection, deadline passed, connection cut) or the server answered a transient status (:data:`RETRY_STATUS`,
any 5xx). Anything else is final.

Errors. Every failure is a :class:`ServiceError` whose message is one line naming the URL and what came back
(the status and a short excerpt of the body): :class:`HTTPStatusError`, :class:`UnreachableError`,
:class:`BadReplyError`. The clients above subclass :class:`ServiceError` for their own errors, so a caller that
runs many requests (the bench) catches that one type.
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import math
import ssl
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable

__all__ = ["BadReplyError", "HTTPStatusError", "RETRY_STATUS", "ServiceError", "UnreachableError", "excerpt",
           "request_json"]

#: Statuses worth another try: request timeout, conflict, rate limit, and every server error (5xx).
RETRY_STATUS = frozenset({408, 409, 429})

#: Largest reply body read (bytes); a longer one is a :class:`BadReplyError`.
MAX_REPLY_BYTES = 256 * 2**20

_CHUNK = 64 * 1024


class ServiceError(Exception):
    """A remote service (retrieval server, served model, judge) failed or answered something unusable.

    The message is one line that names the URL. Subclasses: :class:`HTTPStatusError`, :class:`UnreachableError`,
    :class:`BadReplyError` here, and the clients' own errors (``RetrieverError``, ``ServerError``,
    ``JudgeError``)."""


class HTTPStatusError(ServiceError):
    """The server answered an error status that retrying will not change, or kept answering a transient one
    (``attempts`` answers)."""

    def __init__(self, url: str, status: int, reason: str, detail: str, attempts: int = 1) -> None:
        times = f" ({attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{url} answered HTTP {status} {reason}{times}: {detail or '(empty body)'}")
        self.url, self.status, self.reason, self.detail, self.attempts = url, status, reason, detail, attempts


class UnreachableError(ServiceError):
    """No reply after every attempt (``attempts``; ``reason`` of the last failure)."""

    def __init__(self, url: str, attempts: int, reason: str) -> None:
        super().__init__(f"{url} unreachable after {attempts} attempts: {reason}")
        self.url, self.attempts, self.reason = url, attempts, reason


class BadReplyError(ServiceError):
    """The server answered ``status`` with a body that is not UTF-8 JSON (``problem``; ``detail`` an excerpt)."""

    def __init__(self, url: str, status: int, problem: str, detail: str) -> None:
        super().__init__(f"{url} answered HTTP {status} with {problem}: {detail or '(empty body)'}")
        self.url, self.status, self.problem, self.detail = url, status, problem, detail


def excerpt(data: bytes | str | Any, limit: int = 200) -> str:
    """A short one-line view of a reply (bytes decoded leniently, whitespace runs collapsed, cut at ``limit``)."""
    if isinstance(data, (bytes, bytearray)):
        text = bytes(data[: limit * 4]).decode("utf-8", "backslashreplace")
    elif isinstance(data, str):
        text = data[: limit * 4]
    else:
        text = json.dumps(data, ensure_ascii=False, default=repr)[: limit * 4]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _transient(status: int) -> bool:
    return status >= 500 or status in RETRY_STATUS


# ------------------------------------------------------------------------------------------- the deadline
class _DeadlineReader(io.RawIOBase):
    """A socket's raw reader that gives each ``recv`` only the time left before ``deadline`` (monotonic)."""

    def __init__(self, sock: Any, deadline: float, budget: float) -> None:
        super().__init__()
        self._sock, self._raw = sock, sock.makefile("rb", buffering=0)
        self._deadline, self._budget = deadline, budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete reply within {self._budget:.3g} s")
        self._sock.settimeout(left)
        try:
            return self._raw.readinto(buffer)
        except TimeoutError:
            raise TimeoutError(f"no complete reply within {self._budget:.3g} s") from None

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineSocket:
    """What :class:`http.client.HTTPResponse` reads from: only ``makefile``, which hands out a deadline reader."""

    def __init__(self, sock: Any, deadline: float, budget: float) -> None:
        self._sock, self._deadline, self._budget = sock, deadline, budget

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline, self._budget))


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock: Any, debuglevel: int = 0, method: str | None = None, url: str | None = None, *,
                 deadline: float, budget: float) -> None:
        super().__init__(_DeadlineSocket(sock, deadline, budget), debuglevel, method, url)


def _with_deadline(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
    class Connection(base):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, deadline: float, budget: float, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.response_class = functools.partial(_DeadlineResponse, deadline=deadline, budget=budget)

    Connection.__name__ = "Deadline" + base.__name__
    return Connection


_HTTPConnection = _with_deadline(http.client.HTTPConnection)
_HTTPSConnection = _with_deadline(http.client.HTTPSConnection)


class _HTTPHandler(urllib.request.HTTPHandler):
    deadline, budget = math.inf, math.inf

    def http_open(self, req):
        return self.do_open(_HTTPConnection, req, deadline=self.deadline, budget=self.budget)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    deadline, budget = math.inf, math.inf

    def https_open(self, req):
        return self.do_open(_HTTPSConnection, req, context=self._context, deadline=self.deadline, budget=self.budget)


_openers = threading.local()


def _opener(deadline: float, budget: float) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies, redirects, error statuses as HTTPError) whose connections read under a deadline;
    one per thread, its handlers given the deadline of the request about to be sent."""
    handlers = getattr(_openers, "handlers", None)
    if handlers is None:
        handlers = _openers.handlers = (_HTTPHandler(), _HTTPSHandler())
        _openers.opener = urllib.request.build_opener(*handlers)
    for handler in handlers:
        handler.deadline, handler.budget = deadline, budget
    return _openers.opener


def _read_body(response: Any, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        chunk = response.read(_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            raise OverflowError(f"a reply body longer than {limit} bytes")
        parts.append(chunk)


def _reason(err: BaseException, budget: float) -> str:
    inner = getattr(err, "reason", err)
    if isinstance(inner, BaseException) and not isinstance(inner, str):
        err = inner
    text = str(err) or type(err).__name__
    if isinstance(err, TimeoutError) and "within" not in text:
        return f"no reply within {budget:.3g} s ({text})"
    return text if isinstance(err, (OSError, urllib.error.URLError)) else f"{type(err).__name__}: {text}"


def _check_time(name: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def request_json(url: str, body: Any = None, *, headers: dict[str, str] | None = None, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.5, total_timeout: float | None = None,
                 on_attempt: Callable[[], None] | None = None, max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """``POST`` ``body`` as JSON (``GET`` when ``body`` is None) and return the decoded JSON reply.

    Each attempt must finish within ``timeout`` seconds (connect, send, status, headers and the whole body);
    the call within ``total_timeout`` seconds when given (attempts and backoff pauses together). Raises
    :class:`HTTPStatusError` at once for a status that is not transient (and after the last attempt for one
    that is), :class:`UnreachableError` when no attempt got a reply, :class:`BadReplyError` for a reply that is
    not UTF-8 JSON. ``on_attempt`` is called before each attempt (request counters)."""
    _check_time("timeout", timeout)
    _check_time("total_timeout", total_timeout, allow_none=True)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if not (isinstance(backoff, (int, float)) and math.isfinite(backoff) and backoff >= 0):
        raise ValueError(f"backoff must be a finite number of seconds >= 0, got {backoff!r}")
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    end = None if total_timeout is None else time.monotonic() + total_timeout
    last: ServiceError | None = None
    attempts = 0
    for attempt in range(retries + 1):
        if attempt:
            pause = backoff * 2 ** (attempt - 1)
            if end is not None and time.monotonic() + pause >= end:
                break  # no time left for another attempt
            time.sleep(pause)
        start = time.monotonic()
        budget = timeout if end is None else min(timeout, end - start)
        if budget <= 0:
            break
        if on_attempt is not None:
            on_attempt()
        attempts += 1
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
        try:
            with _opener(start + budget, budget).open(request, timeout=budget) as response:
                status = response.status
                raw = _read_body(response, max_bytes)
        except urllib.error.HTTPError as err:
            try:
                detail = excerpt(err.read(4096))
            except (OSError, http.client.HTTPException, ValueError):
                detail = "(body unreadable)"
            finally:
                err.close()
            last = HTTPStatusError(url, err.code, str(err.reason), detail, attempts)
            if not _transient(err.code):
                raise last from None
            continue
        except OverflowError as err:
            raise BadReplyError(url, 200, str(err), "") from None
        except (OSError, http.client.HTTPException) as err:  # refused, reset, deadline, not HTTP at all
            last = UnreachableError(url, attempts, _reason(err, budget))
            if isinstance(getattr(err, "reason", err), ssl.SSLCertVerificationError):
                raise last from None  # another attempt meets the same certificate
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadReplyError(url, status, f"bytes that are not UTF-8 (at byte {err.start})", excerpt(raw)) from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise BadReplyError(url, status, f"a body that is not JSON ({err.msg} at char {err.pos})",
                                excerpt(text)) from None
    if isinstance(last, HTTPStatusError):
        raise HTTPStatusError(url, last.status, last.reason, last.detail, attempts)
    reason = last.reason if isinstance(last, UnreachableError) else "no time left for an attempt"
    if end is not None and attempts < retries + 1:
        reason += f" (total time limit {total_timeout:.3g} s reached)"
    raise UnreachableError(url, attempts, reason)
