"""A served model as a memenv policy: any OpenAI-compatible server (vLLM, SGLang, llama.cpp, ollama).

    memenv bench --strategies relevance openai:Qwen2.5-7B-Instruct@http://localhost:8000 -n 50
    memenv bench --strategies "openai:smollm2@http://127.0.0.1:8765?endpoint=completions&tokenizer=DIR"

Endpoints (the ``endpoint`` option of the strategy, ``openai:MODEL@URL?endpoint=E``):

- ``chat`` (``/v1/chat/completions``): the observation is the user message after a system message that teaches
  the protocol (:data:`agents.llm.models.prompts.PROTOCOL_SYSTEM_PROMPT`; ``system=none`` drops it); the server applies
  the model's chat template. What an instruct model needs.
- ``completions`` (``/v1/completions``): with ``tokenizer=DIR`` (the model's local folder) the prompt is the
  token ids :class:`agents.llm.generation.policy.LLMPolicy` builds for the same observation (its chat template and the
  same system prompt, or the plain template for a tokenizer without one), sent as a list of ids, so a local
  and a served run see identical prompts; without a tokenizer it is the raw text ``{observation}\\n`` (the plain
  template, for base models).
- ``auto`` (default): ``completions`` with ids when ``tokenizer`` is given; else ``chat``, falling back once (per
  server and model) to the plain ``completions`` prompt when the server says the model has no chat template
  or has no chat route (HTTP 400 naming a chat template, 404, 405, 501).

Other options: ``max_tokens=N`` (per action, default 512), ``system=none``. Each action stops at ``</search>`` /
``</answer>``; OpenAI-style servers drop the stop string from the text, so the closing tag of the last opened
tool tag is put back. In memory mode the prompt is the observation of that turn (task + rewritten memory +
newest result), never a growing chat.

Episodes run concurrently (a thread pool, one env per worker); requests are retried with exponential backoff on
connection errors, timeouts, 429 and 5xx; token counts come from the server's ``usage`` fields (with ``chat`` the
prompt count includes the system message and the template's turn markers). Only the standard library is used
(``urllib``; ``tokenizer=`` loads the tokenizer with transformers). ``OPENAI_API_KEY`` is sent as a bearer token
when set.

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

from agents.llm.models.prompts import PROTOCOL_SYSTEM_PROMPT
from memenv.search.http import BadReplyError, HTTPStatusError, ServiceError, UnreachableError, excerpt, request_json

PREFIX = "openai:"
DEFAULT_STOP = ("</search>", "</answer>")
#: Seconds the start-up check (``GET /v1/models``) may take in all before a served model counts as not answering.
CHECK_TIMEOUT = 15.0
_OPEN_TAG = re.compile(r"<(search|answer)>")


class ServerError(ServiceError, RuntimeError):
    """The server could not be reached, kept failing, or answered something that is not a completion; the
    one-line message names the URL and what came back."""


class ServerUnreachableError(ServerError):
    """No reply from the server at all (refused, silent, unknown host) after every attempt: a service failure
    (``memenv bench`` exits 1), where a reply that is not the API (a web page) says the URL is wrong (exit 2)."""


ENDPOINTS = ("auto", "chat", "completions")
SYSTEM_PROMPTS = ("protocol", "none")
_OPTIONS = ("endpoint", "tokenizer", "system", "max_tokens")


@dataclass(frozen=True)
class ServedSpec:
    """``openai:MODEL@URL[?key=value&...]`` (URL with or without ``/v1``; ``http://`` assumed when no scheme is
    given). Options (see the module doc): ``endpoint`` (auto | chat | completions), ``tokenizer`` (a local
    folder), ``system`` (protocol | none), ``max_tokens``."""

    model: str
    url: str
    endpoint: str = "auto"
    tokenizer: str | None = None
    system: str = "protocol"
    max_tokens: int | None = None

    @classmethod
    def parse(cls, name: str) -> "ServedSpec":
        if not name.startswith(PREFIX):
            raise ValueError(f"not a served-model strategy: {name!r} (expected {PREFIX}MODEL@URL)")
        head, _, query = name[len(PREFIX):].partition("?")
        model, sep, url = head.rpartition("@")
        if not sep or not model or not url:
            raise ValueError(f"bad served-model strategy {name!r}: expected {PREFIX}MODEL@URL, "
                             f"e.g. {PREFIX}Qwen2.5-7B-Instruct@http://localhost:8000")
        if "://" not in url:
            url = "http://" + url
        options: dict[str, Any] = {}
        for item in filter(None, query.split("&")):
            key, eq, value = item.partition("=")
            if key not in _OPTIONS or not eq or not value:
                raise ValueError(f"bad option {item!r} in served-model strategy {name!r}: expected KEY=VALUE with "
                                 f"KEY one of {', '.join(_OPTIONS)}")
            options[key] = value
        if options.get("endpoint", "auto") not in ENDPOINTS:
            raise ValueError(f"served-model strategy {name!r}: endpoint must be one of {', '.join(ENDPOINTS)}, "
                             f"got {options['endpoint']!r}")
        if options.get("system", "protocol") not in SYSTEM_PROMPTS:
            raise ValueError(f"served-model strategy {name!r}: system must be one of {', '.join(SYSTEM_PROMPTS)}, "
                             f"got {options['system']!r}")
        if "max_tokens" in options:
            value = options["max_tokens"]
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"served-model strategy {name!r}: max_tokens must be a whole number >= 1, "
                                 f"got {value!r}")
            options["max_tokens"] = int(value)
        return cls(model, url.rstrip("/"), **options)

    @property
    def api_base(self) -> str:
        return self.url if self.url.endswith("/v1") else self.url + "/v1"

    @property
    def text(self) -> str:
        """The strategy name this spec parses from (options in a fixed order)."""
        options = [f"{k}={getattr(self, k)}" for k in _OPTIONS
                   if getattr(self, k) != getattr(ServedSpec, k, None)]
        return PREFIX + f"{self.model}@{self.url}" + ("?" + "&".join(options) if options else "")


def is_served(name: str) -> bool:
    return name.startswith(PREFIX)


@dataclass
class Completion:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    token_ids: list[int] | None = None  # the completion's ids, when asked for and sent (vLLM return_token_ids)


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

    def post(self, path: str, body: dict) -> Any:
        """``POST {api_base}{path}`` with the client's retries and limits; the decoded JSON reply (a
        :class:`ServerError` for anything else)."""
        return self._request(path, body)

    def _request(self, path: str, body: dict | None) -> Any:
        try:
            return self._call(path, body, timeout=self.timeout, retries=self.retries, total_timeout=self.total_timeout)
        except (HTTPStatusError, BadReplyError) as err:  # names the URL, the status and an excerpt of the body
            raise ServerError(str(err)) from err
        except UnreachableError as err:
            raise self.unreachable(err) from err

    def unreachable(self, err: UnreachableError) -> ServerUnreachableError:
        return ServerUnreachableError(f"OpenAI-compatible server at {self.spec.url} is not answering ({err.url}: {err.reason}; "
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
            raise self.unreachable(err) from err

    def complete(self, prompt: str | Sequence[int], *, token_ids: bool = False) -> Completion:
        """One completion of ``prompt`` (text, or a list of token ids); a reply that is not an OpenAI completions
        object is a :class:`ServerError`. ``token_ids``: also ask for the ids of the prompt and of the completion
        (vLLM's ``return_token_ids``; ``Completion.token_ids`` stays None when the server sends none)."""
        body = {"model": self.spec.model, "prompt": prompt if isinstance(prompt, str) else [int(i) for i in prompt],
                "max_tokens": self.max_tokens, "temperature": self.temperature, "stop": list(self.stop)}
        if token_ids:
            body["return_token_ids"] = True
        return self._completion("/completions", body, "completions", "text")

    def chat(self, messages: Sequence[dict[str, str]]) -> Completion:
        """One chat completion (``POST /chat/completions``) of ``messages``; the text is the reply's
        ``message.content``."""
        body = {"model": self.spec.model, "messages": list(messages), "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stop": list(self.stop)}
        return self._completion("/chat/completions", body, "chat completions", "message.content")

    def _completion(self, path: str, body: dict, kind: str, field: str) -> Completion:
        reply = self._request(path, body)
        url = self.spec.api_base + path
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices:
            raise ServerError(f"{url} returned no choices (expected a {kind} object with a non-empty "
                              f"'choices' list): {excerpt(reply)}")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise ServerError(f"{url}: choices[0] is {type(choice).__name__}, expected an object: {excerpt(reply)}")
        if field == "text":
            text = choice.get("text")
        else:
            message = choice.get("message")
            if not isinstance(message, dict):
                raise ServerError(f"{url}: choices[0].message is {type(message).__name__}, expected an object: "
                                  f"{excerpt(reply)}")
            text = message.get("content")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise ServerError(f"{url}: choices[0].{field} is {type(text).__name__} {excerpt(text, 40)}, expected a "
                              f"string: {excerpt(reply)}")
        finish = choice.get("finish_reason")
        finish = finish if isinstance(finish, str) else None
        text = restore_stop(text, finish, choice.get("stop_reason"), self.stop)
        usage = reply.get("usage")
        if usage is None:
            usage = {}
        if not isinstance(usage, dict):
            raise ServerError(f"{url}: usage is {type(usage).__name__}, expected an object: {excerpt(reply)}")
        ids = choice.get("token_ids")
        ids = [int(i) for i in ids] if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
        return Completion(text, _token_count(usage, "prompt_tokens", url, reply),
                          _token_count(usage, "completion_tokens", url, reply), finish, ids)


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


#: (api base, model) -> the endpoint ``auto`` settled on for that server (``"chat"`` or ``"completions"``).
_RESOLVED: dict[tuple[str, str], str] = {}
_RESOLVED_LOCK = threading.Lock()


def _no_chat(err: ServerError) -> bool:
    """Whether a failed chat request means the server has no chat for this model (rather than a real failure)."""
    cause = err.__cause__
    if not isinstance(cause, HTTPStatusError):
        return False
    return cause.status in (404, 405, 501) or (cause.status in (400, 422) and "chat template" in cause.detail.lower())


class ServedPolicy:
    """The ``openai:MODEL@URL`` strategy: a policy for ``memenv bench`` (and any ``act(observation)`` loop).

    ``endpoint``, ``tokenizer``, ``system_prompt`` override the spec's options (``system_prompt``: the text of
    the chat system message; default :data:`agents.llm.models.prompts.PROTOCOL_SYSTEM_PROMPT`, none with
    ``system=none``). ``run_episodes`` runs many episodes at once (``concurrency`` worker threads, one env each) and
    reports, per episode, the server's prompt and completion token counts."""

    context = "memory"
    prompt_template = "{observation}\n"

    def __init__(self, spec: ServedSpec | str, *, concurrency: int = 8, endpoint: str | None = None,
                 tokenizer: Any = None, system_prompt: str | None | object = ..., token_ids: bool = False,
                 **client_kwargs: Any) -> None:
        self.spec = spec if isinstance(spec, ServedSpec) else ServedSpec.parse(spec)
        self.name = self.spec.text
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = int(concurrency)
        endpoint = endpoint or self.spec.endpoint
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        if system_prompt is ...:
            system_prompt = None if self.spec.system == "none" else PROTOCOL_SYSTEM_PROMPT
        self.system_prompt = system_prompt
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer(self.spec.tokenizer)
        self.format = None
        if self.tokenizer is not None:
            from agents.llm.generation.policy import PromptFormat

            self.format = PromptFormat(self.tokenizer, "auto", system_prompt)
        if endpoint == "auto":
            endpoint = "completions" if self.format is not None else _RESOLVED.get((self.spec.api_base, self.spec.model), "auto")
        self.endpoint = endpoint
        self.token_ids = bool(token_ids)
        if self.spec.max_tokens is not None:
            client_kwargs.setdefault("max_tokens", self.spec.max_tokens)
        self.client = CompletionsClient(self.spec, **client_kwargs)
        self._usage = threading.local()
        self._local = threading.local()

    def _load_tokenizer(self, folder: str | None):
        if folder is None:
            return None
        from pathlib import Path

        if not Path(folder).is_dir():
            raise ValueError(f"served-model strategy {self.spec.text!r}: tokenizer={folder} is not a folder "
                             f"(the model's local folder, e.g. from `memenv models prepare NAME`)")
        from agents.llm.models.local import load_tokenizer

        return load_tokenizer(folder)

    def messages(self, observation: str) -> list[dict[str, str]]:
        """The chat messages of one observation (the system message, then the observation as the user's)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": observation}]

    def prompt(self, observation: str) -> str | list[int]:
        """The completions prompt of one observation: :class:`agents.llm.generation.policy.PromptFormat`'s ids with a
        tokenizer (those of :class:`agents.llm.generation.policy.LLMPolicy`), else the plain template's text."""
        if self.format is not None:
            return self.format.encode_prompt(observation)
        return self.prompt_template.format(observation=observation)

    def _ask(self, observation: str) -> Completion:
        if self.endpoint == "completions":
            return self.client.complete(self.prompt(observation), token_ids=self.token_ids)
        if self.endpoint == "chat":
            return self.client.chat(self.messages(observation))
        try:  # auto without a tokenizer: chat, unless this server has none for the model
            result = self.client.chat(self.messages(observation))
        except ServerError as err:
            if not _no_chat(err):
                raise
            with _RESOLVED_LOCK:
                _RESOLVED[(self.spec.api_base, self.spec.model)] = self.endpoint = "completions"
            return self.client.complete(self.prompt(observation), token_ids=self.token_ids)
        with _RESOLVED_LOCK:
            _RESOLVED.setdefault((self.spec.api_base, self.spec.model), "chat")
        self.endpoint = "chat"
        return result

    def reset(self, env: Any = None) -> None:
        self._usage.tokens = [0, 0, 0]  # prompt, completion, requests without usage

    def act(self, observation: str) -> str:
        result = self._ask(observation)
        self._local.last = result
        tokens = getattr(self._usage, "tokens", None)
        if tokens is not None:
            if result.prompt_tokens is None or result.completion_tokens is None:
                tokens[2] += 1
            else:
                tokens[0] += int(result.prompt_tokens)
                tokens[1] += int(result.completion_tokens)
        return result.text

    @property
    def last(self) -> Completion | None:
        """This thread's latest completion (text, token counts, finish reason, ids when asked for)."""
        return getattr(self._local, "last", None)

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
