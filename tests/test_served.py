"""``openai:MODEL@URL``: a served model through the text protocol, against a local OpenAI-style server that
answers with a scripted strategy's actions (so the served run must score exactly as that strategy)."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.scripted.bench import register_cli, run_bench
from agents.scripted.strategies.qa_strategies import make_strategy
from agents.llm.generation.policy import PROTOCOL_SYSTEM_PROMPT
from agents.llm.adapters.served import CompletionsClient, ServedPolicy, ServedSpec, ServerError, restore_stop

ENV = "MemQA-v0:objectives=1,hops=2"
MAX_REQUESTS = 400  # the scripted server refuses anything beyond this (a runaway client fails the test)


class ScriptedServer:
    """An OpenAI-compatible completions and chat server on 127.0.0.1 (port 0) whose model is the ``relevance``
    strategy (on a chat request it reads the user message; the system messages it got are kept in ``systems``).

    Like real servers it drops the stop string from the text. ``fail_first`` requests get HTTP 503; with
    ``chat=False`` a chat request gets vLLM's HTTP 400 for a model without a chat template."""

    def __init__(self, fail_first: int = 0, stop_reason: bool = False, delay: float = 0.0, chat: bool = True) -> None:
        self.policy = make_strategy("relevance")
        self.fail_first, self.stop_reason, self.delay, self.chat = fail_first, stop_reason, delay, chat
        self.requests, self.failed, self.in_flight, self.max_in_flight = 0, 0, 0, 0
        self.paths: list[str] = []
        self.systems: set[str] = set()
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "scripted"}]} if self.path == "/v1/models" else {"error": "no"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.requests += 1
                    n = owner.requests
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    owner.paths.append(self.path)
                    chat = self.path == "/v1/chat/completions"
                    if self.path not in ("/v1/completions", "/v1/chat/completions") or n > MAX_REQUESTS:
                        return self._send(400, {"error": f"refused request {n} to {self.path}"})
                    if chat and not owner.chat:
                        return self._send(400, {"object": "error", "message": "As of transformers v4.44, default "
                                                "chat template is no longer allowed, so you must provide a chat "
                                                "template if the tokenizer does not define one."})
                    if n <= owner.fail_first:
                        owner.failed += 1
                        return self._send(503, {"error": "warming up"})
                    time.sleep(owner.delay)
                    if chat:
                        owner.systems.update(m["content"] for m in body["messages"] if m["role"] == "system")
                        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
                    else:
                        prompt = body["prompt"]
                    action = owner.policy.act(prompt)
                    cut = min((action.find(s) for s in body["stop"] if s in action), default=len(action))
                    matched = next((s for s in body["stop"] if action.find(s) == cut), None)
                    text = action[:cut]
                    choice = {"index": 0, "finish_reason": "stop" if matched else "length",
                              **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
                    if owner.stop_reason:
                        choice["stop_reason"] = matched
                    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
                    self._send(200, {"id": f"c{n}", "object": "text_completion", "model": body["model"],
                                     "choices": [choice], "usage": usage})
                finally:
                    with owner.lock:
                        owner.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_served_model_scores_exactly_as_the_strategy_it_serves():
    with ScriptedServer(delay=0.01) as server:
        name = f"openai:scripted@{server.url}"
        summary, episodes = run_bench(["relevance", name], [ENV], episodes=8, seed=3, progress=False)
    assert server.requests <= MAX_REQUESTS
    local, served = (episodes[episodes.strategy == s].reset_index(drop=True) for s in ("relevance", name))
    assert list(served.seed) == list(local.seed) == list(range(3, 11))
    assert list(served.f1) == list(local.f1) and list(served.invocations) == list(local.invocations)
    assert served.f1.mean() > 0.3  # the served actions were understood by the env (the closing tags were restored)
    assert server.requests == served.invocations.sum()
    # Token counts are the server's usage fields: its prompt tokens are the words of each observation.
    assert list(served.server_prompt_tokens) == list(served.total_context_tokens)
    assert (served.server_completion_tokens > 0).all()
    row = summary[summary.strategy == name].iloc[0]
    assert row.server_prompt_tokens == pytest.approx(served.server_prompt_tokens.mean())
    assert summary[summary.strategy == "relevance"].server_prompt_tokens.isna().all()
    assert server.max_in_flight > 1  # episodes ran concurrently
    # the default endpoint for a server that has chat: the chat endpoint with the protocol system prompt
    assert set(server.paths) == {"/v1/chat/completions"} and server.systems == {PROTOCOL_SYSTEM_PROMPT}


def test_retries_with_backoff_then_succeeds():
    with ScriptedServer(fail_first=2, stop_reason=True) as server:
        client = CompletionsClient(ServedSpec.parse(f"openai:m@{server.url}/v1"), retries=3, backoff=0.01)
        prompt = "<task>\nQuestion 1: Where is Wigei?\n</task>\n<memory>\n\n</memory>\n"
        result = client.complete(prompt)
    assert server.failed == 2 and server.requests == 3
    # the stop string the server dropped is back (from its stop_reason), so the action is the strategy's own
    assert result.text == make_strategy("relevance").act(prompt) and result.text.endswith("</answer>")
    assert result.prompt_tokens == len(prompt.split()) and result.finish_reason == "stop"


def test_retries_are_bounded():
    with ScriptedServer(fail_first=10) as server:
        client = CompletionsClient(ServedSpec.parse(f"openai:m@{server.url}"), retries=2, backoff=0.0)
        with pytest.raises(ServerError, match=r"HTTP 503.*3 attempts"):
            client.complete("hello")
    assert server.requests == 3


def test_server_down_fails_before_any_work_naming_the_url(monkeypatch):
    import agents.scripted.bench as bench

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cells = []
    monkeypatch.setattr(bench.run, "_run_cell", lambda *args, **kwargs: cells.append(args))
    with pytest.raises(ServerError, match=f"server at {url} is not answering"):
        run_bench([f"openai:m@{url}"], [ENV], episodes=2, progress=False)
    assert cells == []  # no cell started


def test_restore_stop():
    stop = ("</search>", "</answer>")
    assert restore_stop("<memory>a</memory><search>x", "stop", None, stop) == "<memory>a</memory><search>x</search>"
    assert restore_stop("<memory>a</memory><answer>x", "stop", "</answer>", stop) == "<memory>a</memory><answer>x</answer>"
    assert restore_stop("<memory>a</memory><search>x", "length", None, stop) == "<memory>a</memory><search>x"
    assert restore_stop("<search>x</search>", "stop", None, stop) == "<search>x</search>"


def test_strategy_names_on_the_command_line():
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    args = parser.parse_args(["bench", "--strategies", "relevance", "openai:Qwen2.5-7B@localhost:8000"])
    assert args.strategies == ["relevance", "openai:Qwen2.5-7B@localhost:8000"]
    assert ServedSpec.parse(args.strategies[1]).api_base == "http://localhost:8000/v1"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--strategies", "bogus"])
    with pytest.raises(ValueError, match="expected openai:MODEL@URL"):
        ServedSpec.parse("openai:no-url")
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        ServedPolicy("openai:m@localhost:1", concurrency=0)


def test_bench_cli_with_a_server_that_is_down_is_one_line_and_exit_1(capsys, tmp_path, monkeypatch):
    """A served model that cannot be reached is a service failure (exit 1, issue 35's rule), not a user's
    mistake; the line names the URL. (A URL that answers with something else than the API is exit 2.)"""
    from memenv.cli import main

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--strategies", f"openai:m@http://127.0.0.1:{port}", "-n", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"server at http://127.0.0.1:{port} is not answering" in err
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------- endpoints
def test_a_server_without_chat_falls_back_once_to_the_plain_completions_prompt():
    with ScriptedServer(chat=False, delay=0.005) as server:
        name = f"openai:scripted@{server.url}"
        _, episodes = run_bench(["relevance", name], [ENV], episodes=4, seed=3, progress=False)
    local, served = (episodes[episodes.strategy == s].reset_index(drop=True) for s in ("relevance", name))
    assert list(served.f1) == list(local.f1) and served.f1.mean() > 0.3
    # every concurrent first request may try chat once; after that only completions
    chats = server.paths.count("/v1/chat/completions")
    assert 1 <= chats <= 4 and server.paths[-1] == "/v1/completions"
    assert server.paths.count("/v1/completions") == served.invocations.sum()
    assert ServedPolicy(name).endpoint == "completions"  # settled for this server: no more chat attempts


def test_chat_errors_that_are_not_a_missing_template_are_raised():
    with ScriptedServer(fail_first=50) as server:
        policy = ServedPolicy(f"openai:m@{server.url}", retries=0, backoff=0.0)
        with pytest.raises(ServerError, match=r"chat/completions answered HTTP 503"):
            policy.act("<task>\nQuestion 1: Where is Wigei?\n</task>")
        assert policy.endpoint == "auto"


def test_endpoint_completions_sends_the_plain_template_text():
    with ScriptedServer() as server:
        policy = ServedPolicy(f"openai:m@{server.url}?endpoint=completions&max_tokens=64")
        policy.reset()
        obs = "<task>\nQuestion 1: Where is Wigei?\n</task>\n<memory>\n\n</memory>\n"
        assert policy.act(obs) == make_strategy("relevance").act(obs + "\n")
    assert server.paths == ["/v1/completions"] and policy.client.max_tokens == 64


def _prompt_recorder():
    """A stand-in completions server that records each request body and answers a fixed action."""
    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            data = json.dumps({"choices": [{"text": "<memory>m</memory><search>Wigei", "finish_reason": "stop",
                                            "stop_reason": "</search>", "token_ids": [5, 6, 7]}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 3}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}", bodies


@pytest.mark.parametrize("tokenizer_kind", ["plain", pytest.param("chat", marks=pytest.mark.real_model)])
def test_completions_with_a_tokenizer_sends_the_ids_llmpolicy_builds(tokenizer_kind, tmp_path, request):
    from agents.llm.generation.policy import PromptFormat

    if tokenizer_kind == "chat":  # a real chat template (ChatML): needs the real model's tokenizer
        folder = str(request.getfixturevalue("smollm2_path"))
    else:
        from llm_common import memqa_tokenizer

        folder = str(tmp_path / "tok")
        memqa_tokenizer().save_pretrained(folder)
    httpd, url, bodies = _prompt_recorder()
    try:
        policy = ServedPolicy(f"openai:m@{url}?tokenizer={folder}", token_ids=True)
        obs = "<task>\nQuestion 1: Where is Wigei?\n</task>\n<memory>\n\n</memory>\n"
        assert policy.act(obs) == "<memory>m</memory><search>Wigei</search>"
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert policy.endpoint == "completions" and policy.last.token_ids == [5, 6, 7]
    expected = PromptFormat(policy.tokenizer, "auto", "protocol").encode_prompt(obs)
    assert bodies[0]["prompt"] == expected and bodies[0]["return_token_ids"] is True
    if tokenizer_kind == "chat":
        text = policy.tokenizer.decode(expected)
        assert text.startswith("<|im_start|>system\n" + PROTOCOL_SYSTEM_PROMPT) and text.endswith("<|im_start|>assistant\n")


def test_bad_served_options_are_named():
    with pytest.raises(ValueError, match="endpoint must be one of auto, chat, completions, got 'grpc'"):
        ServedSpec.parse("openai:m@localhost:1?endpoint=grpc")
    with pytest.raises(ValueError, match="bad option 'temp=0'.*KEY one of endpoint, tokenizer, system, max_tokens"):
        ServedSpec.parse("openai:m@localhost:1?temp=0")
    with pytest.raises(ValueError, match="max_tokens must be a whole number >= 1, got '0'"):
        ServedSpec.parse("openai:m@localhost:1?max_tokens=0")
    with pytest.raises(ValueError, match="tokenizer=/no/such is not a folder"):
        ServedPolicy("openai:m@localhost:1?tokenizer=/no/such")
    spec = ServedSpec.parse("openai:m@localhost:1/v1?system=none&endpoint=chat")
    assert spec.api_base == "http://localhost:1/v1" and spec.text == "openai:m@http://localhost:1/v1?endpoint=chat&system=none"
    assert ServedSpec.parse(spec.text) == spec
    assert ServedPolicy(spec).messages("hi") == [{"role": "user", "content": "hi"}]
    assert ServedPolicy("openai:m@localhost:1").messages("hi")[0] == {"role": "system", "content": PROTOCOL_SYSTEM_PROMPT}
