"""A served model as a memenv policy: any OpenAI-compatible *completions* server (vLLM, SGLang, llama.cpp, ollama).

    memenv bench --strategies relevance openai:Qwen2.5-7B-Instruct@http://localhost:8000 -n 50

The strategy ``openai:MODEL@URL`` sends each observation as a raw completion prompt (``{observation}\\n``, the
plain template of :class:`agents.llm.policy.LLMPolicy`, so a local and a served run see the same text), stops at
``</search>`` / ``</answer>`` and gives the completion back to the env as the action. In memory mode the prompt is
the observation of that turn (task + rewritten memory + newest result), never a growing chat. OpenAI-style
servers drop the stop string from the text, so the closing tag of the last opened tool tag is put back.

Episodes run concurrently (a thread pool, one env per worker); requests are retried with exponential backoff on
connection errors, timeouts, 429 and 5xx; token counts come from the server's ``usage`` fields. Only the standard
library is used (``urllib``). ``OPENAI_API_KEY`` is sent as a bearer token when set.

Time limits: each attempt of a completion request has ``timeout`` seconds (default 120) of wall-clock time for
connecting and reading the whole reply, with ``retries`` (default 4) further attempts; the start-up check
(``GET /v1/models``) gives up after ``check_timeout`` seconds (default 15) in all. Every failure is a
:class:`ServerError` (a :class:`memenv.search.http.ServiceError`) whose one-line message names the URL and what
came back.
"""

from __future__ import annotations

import math
import os
import re
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from memenv.search.http import BadReplyError, HTTPStatusError, ServiceError, UnreachableError, excerpt, request_json

PREFIX = "openai:"
DEFAULT_STOP = ("</search>", "</answer>")
#: Seconds the start-up check (``GET /v1/models``) may take in all before a served model counts as not answering.
CHECK_TIMEOUT = 15.0
_OPEN_TAG = re.compile(r"<(search|answer)>")


class ServerError(ServiceError, RuntimeError):
    """The server could not be reached, kept failing, or answered something that is not a completion; the
    one-line message names the URL and what came back."""


@dataclass(frozen=True)
class ServedSpec:
    """``openai:MODEL@URL`` (URL with or without ``/v1``; ``http://`` assumed when no scheme is given)."""

    model: str
    url: str

    @classmethod
    def parse(cls, name: str) -> "ServedSpec":
        if not name.startswith(PREFIX):
            raise ValueError(f"not a served-model strategy: {name!r} (expected {PREFIX}MODEL@URL)")
        model, sep, url = name[len(PREFIX):].rpartition("@")
        if not sep or not model or not url:
            raise ValueError(f"bad served-model strategy {name!r}: expected {PREFIX}MODEL@URL, "
                             f"e.g. {PREFIX}Qwen2.5-7B-Instruct@http://localhost:8000")
        if "://" not in url:
            url = "http://" + url
        return cls(model, url.rstrip("/"))

    @property
    def api_base(self) -> str:
        return self.url if self.url.endswith("/v1") else self.url + "/v1"


def is_served(name: str) -> bool:
    return name.startswith(PREFIX)


@dataclass
class Completion:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None


def _seconds(name: str, value: Any, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _token_count(usage: dict, key: str, url: str, reply: Any) -> int | None:
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServerError(f"{url}: usage.{key} is {value!r}, expected a count >= 0: {excerpt(reply)}")
    return value


class CompletionsClient:
    """``POST {api_base}/completions`` with retries (exponential backoff: ``backoff * 2**attempt`` seconds).

    ``timeout``: wall-clock seconds for one attempt (connect and read the whole reply); ``total_timeout``: for a
    request with all its attempts and pauses (default: ``(retries + 1) * timeout`` plus the pauses);
    ``check_timeout``: for the start-up check :meth:`check`, all attempts together (default
    :data:`CHECK_TIMEOUT`, 15 s)."""

    def __init__(self, spec: ServedSpec, *, max_tokens: int = 512, temperature: float = 0.0,
                 stop: Sequence[str] = DEFAULT_STOP, timeout: float = 120.0, retries: int = 4, backoff: float = 0.5,
                 total_timeout: float | None = None, check_timeout: float | None = None,
                 api_key: str | None = None) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0 or not max_tokens >= 1:
            raise ValueError(f"need retries >= 0 and max_tokens >= 1; got {retries!r}, {max_tokens!r}")
        if not (isinstance(backoff, (int, float)) and math.isfinite(backoff) and backoff >= 0):
            raise ValueError(f"backoff must be a finite number of seconds >= 0, got {backoff!r}")
        self.spec = spec
        self.max_tokens, self.temperature, self.stop = int(max_tokens), float(temperature), tuple(stop)
        self.timeout, self.retries, self.backoff = _seconds("timeout", timeout), int(retries), float(backoff)
        self.total_timeout = _seconds("total_timeout", total_timeout, allow_none=True)
        self.check_timeout = _seconds("check_timeout", CHECK_TIMEOUT if check_timeout is None else check_timeout)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")

    def _call(self, path: str, body: dict | None, **limits: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return request_json(self.spec.api_base + path, body, headers=headers, backoff=self.backoff, **limits)

    def _request(self, path: str, body: dict | None) -> Any:
        try:
            return self._call(path, body, timeout=self.timeout, retries=self.retries, total_timeout=self.total_timeout)
        except (HTTPStatusError, BadReplyError) as err:  # names the URL, the status and an excerpt of the body
            raise ServerError(str(err)) from err
        except UnreachableError as err:
            raise self._unreachable(err) from err

    def _unreachable(self, err: UnreachableError) -> ServerError:
        return ServerError(f"OpenAI-compatible server at {self.spec.url} is not answering ({err.url}: {err.reason}; "
                           f"{err.attempts} attempts): start it (e.g. `vllm serve {self.spec.model}`) or fix the URL")

    def check(self) -> None:
        """One cheap request (``GET /v1/models``, retried once, ``check_timeout`` seconds in all) so a server that
        is down or silent fails before any work. Any HTTP status means a server is up; a body that is not JSON
        means the URL is not an OpenAI-compatible API."""
        try:
            self._call("/models", None, timeout=self.check_timeout, retries=min(self.retries, 1),
                       total_timeout=self.check_timeout)
        except HTTPStatusError:
            return
        except BadReplyError as err:
            raise ServerError(f"{err} (is this an OpenAI-compatible API?)") from err
        except UnreachableError as err:
            raise self._unreachable(err) from err

    def complete(self, prompt: str) -> Completion:
        """One completion; a reply that is not an OpenAI completions object is a :class:`ServerError`."""
        body = {"model": self.spec.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stop": list(self.stop)}
        reply = self._request("/completions", body)
        url = self.spec.api_base + "/completions"
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices:
            raise ServerError(f"{url} returned no choices (expected a completions object with a non-empty "
                              f"'choices' list): {excerpt(reply)}")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise ServerError(f"{url}: choices[0] is {type(choice).__name__}, expected an object: {excerpt(reply)}")
        text = choice.get("text")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise ServerError(f"{url}: choices[0].text is {type(text).__name__} {excerpt(text, 40)}, expected a "
                              f"string: {excerpt(reply)}")
        finish = choice.get("finish_reason")
        finish = finish if isinstance(finish, str) else None
        text = restore_stop(text, finish, choice.get("stop_reason"), self.stop)
        usage = reply.get("usage")
        if usage is None:
            usage = {}
        if not isinstance(usage, dict):
            raise ServerError(f"{url}: usage is {type(usage).__name__}, expected an object: {excerpt(reply)}")
        return Completion(text, _token_count(usage, "prompt_tokens", url, reply),
                          _token_count(usage, "completion_tokens", url, reply), finish)


def restore_stop(text: str, finish_reason: str | None, stop_reason: Any, stop: Sequence[str]) -> str:
    """Put back the stop string an OpenAI-style server removed: ``stop_reason`` when the server says which one
    (vLLM, SGLang), else the closing tag of the last opened ``<search>``/``<answer>``."""
    if finish_reason != "stop" or any(text.endswith(s) for s in stop):
        return text
    if isinstance(stop_reason, str) and stop_reason in stop:
        return text + stop_reason
    opened = list(_OPEN_TAG.finditer(text))
    if opened:
        closing = f"</{opened[-1].group(1)}>"
        if closing in stop and not text[opened[-1].end():].count(closing):
            return text + closing
    return text


class ServedPolicy:
    """The ``openai:MODEL@URL`` strategy: a policy for ``memenv bench`` (and any ``act(observation)`` loop).

    ``run_episodes`` runs many episodes at once (``concurrency`` worker threads, one env each) and reports, per
    episode, the server's prompt and completion token counts."""

    context = "memory"
    prompt_template = "{observation}\n"

    def __init__(self, spec: ServedSpec | str, *, concurrency: int = 8, **client_kwargs: Any) -> None:
        self.spec = spec if isinstance(spec, ServedSpec) else ServedSpec.parse(spec)
        self.name = PREFIX + f"{self.spec.model}@{self.spec.url}"
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = int(concurrency)
        self.client = CompletionsClient(self.spec, **client_kwargs)
        self._usage = threading.local()

    def reset(self, env: Any = None) -> None:
        self._usage.tokens = [0, 0, 0]  # prompt, completion, requests without usage

    def act(self, observation: str) -> str:
        result = self.client.complete(self.prompt_template.format(observation=observation))
        tokens = getattr(self._usage, "tokens", None)
        if tokens is not None:
            if result.prompt_tokens is None or result.completion_tokens is None:
                tokens[2] += 1
            else:
                tokens[0] += int(result.prompt_tokens)
                tokens[1] += int(result.completion_tokens)
        return result.text

    def usage(self) -> dict[str, float]:
        """Server token counts of this thread's current episode (NaN when the server sent no ``usage``)."""
        prompt, completion, missing = getattr(self._usage, "tokens", (0, 0, 0))
        nan = float("nan")
        return {"server_prompt_tokens": nan if missing else prompt, "server_completion_tokens": nan if missing else completion}

    def run_episodes(self, make_env: Callable[[], Any], seeds: Sequence[int],
                     run_episode: Callable[[Any, Any, int], tuple[dict[str, Any], int]],
                     on_done: Callable[[], None] | None = None) -> list[tuple[dict[str, Any], int, dict[str, float]]]:
        """``run_episode(env, self, seed)`` for every seed on a thread pool; results in seed order as
        ``(summary, steps, usage)``. The first exception out of ``run_episode`` ends the run: episodes not yet
        started are dropped, those running finish, and it is raised (a caller that wants to go on past a failed
        episode catches inside ``run_episode``)."""
        envs: list[Any] = []
        lock = threading.Lock()
        local = threading.local()

        def one(seed: int):
            env = getattr(local, "env", None)
            if env is None:
                env = local.env = make_env()
                with lock:
                    envs.append(env)
            summary, steps = run_episode(env, self, seed)
            if on_done is not None:
                on_done()
            return summary, steps, self.usage()

        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(seeds))))
        try:
            futures = [pool.submit(one, seed) for seed in seeds]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:  # stop at the first error: episodes not yet started are dropped
                pool.shutdown(wait=True, cancel_futures=True)
                raise failed.exception()
            return [future.result() for future in futures]
        except BaseException:  # Ctrl-C too: only the episodes already running finish
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
            for env in envs:
                env.close()
