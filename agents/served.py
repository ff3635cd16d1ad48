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
"""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from memenv.search.http import HTTPStatusError, UnreachableError, request_json

PREFIX = "openai:"
DEFAULT_STOP = ("</search>", "</answer>")
_OPEN_TAG = re.compile(r"<(search|answer)>")


class ServerError(RuntimeError):
    """The server could not be reached or kept failing; the message names the URL."""


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


class CompletionsClient:
    """``POST {api_base}/completions`` with retries (exponential backoff: ``backoff * 2**attempt`` seconds)."""

    def __init__(self, spec: ServedSpec, *, max_tokens: int = 512, temperature: float = 0.0,
                 stop: Sequence[str] = DEFAULT_STOP, timeout: float = 120.0, retries: int = 4, backoff: float = 0.5,
                 api_key: str | None = None) -> None:
        if retries < 0 or backoff < 0 or timeout <= 0 or max_tokens < 1:
            raise ValueError(f"need retries >= 0, backoff >= 0, timeout > 0, max_tokens >= 1; got {retries}, "
                             f"{backoff}, {timeout}, {max_tokens}")
        self.spec = spec
        self.max_tokens, self.temperature, self.stop = int(max_tokens), float(temperature), tuple(stop)
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")

    def _request(self, path: str, body: dict | None, retries: int | None = None) -> dict:
        url = self.spec.api_base + path
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        retries = self.retries if retries is None else retries
        try:
            return request_json(url, body, headers=headers, timeout=self.timeout, retries=retries,
                                backoff=self.backoff)
        except HTTPStatusError as err:
            raise ServerError(f"{url} answered HTTP {err.status}: {err.detail}") from err
        except UnreachableError as err:
            raise ServerError(f"OpenAI-compatible server at {self.spec.url} is not answering ({err.reason}; "
                              f"{err.attempts} attempts): start it (e.g. `vllm serve {self.spec.model}`) or fix "
                              "the URL") from err

    def check(self) -> None:
        """One cheap request (``GET /v1/models``, retried once) so a server that is down fails before any work."""
        try:
            self._request("/models", None, retries=min(self.retries, 1))
        except ServerError as err:
            if "answered HTTP" not in str(err):  # any HTTP answer means the server is up
                raise

    def complete(self, prompt: str) -> Completion:
        body = {"model": self.spec.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stop": list(self.stop)}
        reply = self._request("/completions", body)
        try:
            choice = reply["choices"][0]
            text = choice.get("text") or ""
        except (KeyError, IndexError, TypeError) as err:
            raise ServerError(f"{self.spec.api_base}/completions returned no choices: {str(reply)[:300]}") from err
        finish = choice.get("finish_reason")
        text = restore_stop(text, finish, choice.get("stop_reason"), self.stop)
        usage = reply.get("usage") or {}
        return Completion(text, usage.get("prompt_tokens"), usage.get("completion_tokens"), finish)


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
        ``(summary, steps, usage)``."""
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

        try:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(seeds)))) as pool:
                return list(pool.map(one, seeds))
        finally:
            for env in envs:
                env.close()
