"""Network failures after start-up: every request has a wall-clock deadline, and every failure is one line naming
the URL and what came back. The servers here are stand-ins on 127.0.0.1 that misbehave on purpose: they trickle
replies, stay silent, answer 500 forever, or send bodies that are not what the API promises."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest

from agents.llm.adapters.served import CompletionsClient, ServedPolicy, ServedSpec, ServerError
from memenv.scoring.judges import JudgeError, OpenAIJudge, parse_score
from memenv.search.http import (BadReplyError, HTTPStatusError, ServiceError, UnreachableError, excerpt,
                                request_json)
from memenv.search.remote import RemoteRetriever, RetrieverError

Route = Callable[[BaseHTTPRequestHandler, "StandIn"], None]


class StandIn:
    """A stand-in HTTP server on 127.0.0.1 (port 0): ``routes`` maps a path to what the server does there.

    ``hits`` counts the requests per path; ``stop`` ends every trickling reply when the server closes."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes, self.hits, self.stop = routes, {}, threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.body = json.loads(self.rfile.read(length)) if length else None
                owner.hits[self.path] = owner.hits.get(self.path, 0) + 1
                route = owner.routes.get(self.path)
                if route is None:
                    return send(self, 404, b"no such path")
                try:
                    route(self, owner)
                except OSError:  # the client gave up and closed the connection
                    pass

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "StandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "application/json") -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def answer(status: int, body: bytes | dict | list, content_type: str = "application/json") -> Route:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return lambda handler, server: send(handler, status, data, content_type)


# The trickling replies complete after COMPLETE_AFTER seconds: a deadline that did not fire would then show as a
# reply that succeeded (or failed otherwise), not as a hung test; no test needs an upper bound on its own time.
COMPLETE_AFTER = 10.0
REPLY = b'{"ok": true}'


def trickle_body(interval: float) -> Route:
    """Headers at once (a 10 kB body announced), then one byte of it every ``interval`` seconds, and after
    COMPLETE_AFTER seconds the rest at once (spaces, then a JSON object)."""
    def route(handler, server):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "10000")
        handler.end_headers()
        handler.wfile.flush()
        sent = 0
        while sent < COMPLETE_AFTER / interval and not server.stop.wait(interval):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            sent += 1
        handler.wfile.write(b" " * (10000 - len(REPLY) - sent) + REPLY)
    return route


def trickle_headers(handler, server):
    """The status line at once, then a header one byte every 0.05 s, ending after COMPLETE_AFTER seconds."""
    handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    handler.wfile.flush()
    sent = 0
    while sent < COMPLETE_AFTER / 0.05 and not server.stop.wait(0.05):
        handler.wfile.write(b"a")
        handler.wfile.flush()
        sent += 1
    handler.wfile.write(b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(REPLY) + REPLY)


def silent(handler, server):
    """Accepts the request and never answers."""
    server.stop.wait(30)


def one_line(err: BaseException) -> str:
    message = str(err)
    assert "\n" not in message and message.strip() == message
    return message


def elapsed(fn: Callable[[], object], error: type[BaseException]) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(error) as info:
        fn()
    return info.value, time.monotonic() - start


# ------------------------------------------------------------------------------------------- deadlines
def test_reply_trickled_one_byte_at_a_time_times_out_at_the_deadline():
    # a byte every 3 s against a 30 s limit, scaled down by 10: each read gets a byte well within the limit
    with StandIn({"/slow": trickle_body(0.3)}) as server:
        err, took = elapsed(lambda: request_json(server.url + "/slow", timeout=1.0, retries=0), UnreachableError)
    assert took >= 1.0  # a deadline never fires early
    assert f"{server.url}/slow unreachable after 1 attempts: no complete reply within 1 s" == one_line(err)


def test_deadline_is_for_the_whole_reply_not_per_read():
    # a byte every 0.1 s: no single read waits long, yet the reply never completes
    with StandIn({"/slow": trickle_body(0.1), "/headers": trickle_headers}) as server:
        for path in ("/slow", "/headers"):
            err, took = elapsed(lambda: request_json(server.url + path, timeout=0.8, retries=0), UnreachableError)
            assert took >= 0.8, path
            assert "no complete reply within 0.8 s" in one_line(err) and server.url + path in str(err)


def test_total_timeout_bounds_the_retries():
    with StandIn({"/silent": silent}) as server:
        err, took = elapsed(lambda: request_json(server.url + "/silent", timeout=1.0, retries=5, backoff=0.1,
                                                 total_timeout=1.5), UnreachableError)
        hits = server.hits["/silent"]
    assert took >= 1.4 and hits == 2  # 1 s, a 0.1 s pause, then the 0.4 s left
    assert "total time limit 1.5 s reached" in one_line(err) and err.attempts == 2


def test_without_total_timeout_each_attempt_has_its_own_deadline():
    with StandIn({"/silent": silent}) as server:
        err, took = elapsed(lambda: request_json(server.url + "/silent", timeout=0.4, retries=2, backoff=0.05),
                            UnreachableError)
        assert server.hits["/silent"] == 3
    assert took >= 1.2 and err.attempts == 3  # 3 x 0.4 s + 0.05 + 0.1 s of pauses


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_time_limits_are_validated(bad):
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
        request_json("http://127.0.0.1:1/x", timeout=bad)
    with pytest.raises(ValueError, match="total_timeout must be a finite number of seconds > 0"):
        request_json("http://127.0.0.1:1/x", total_timeout=bad)


# ------------------------------------------------------------------------------------------- HTTP statuses
def test_http_500_forever_is_retried_then_names_url_status_and_body():
    with StandIn({"/x": answer(500, b"<h1>Internal\n error</h1> database is locked")}) as server:
        err, _ = elapsed(lambda: request_json(server.url + "/x", {"a": 1}, retries=2, backoff=0.01), HTTPStatusError)
        assert server.hits["/x"] == 3
    assert err.status == 500 and err.attempts == 3
    assert one_line(err) == (f"{server.url}/x answered HTTP 500 Internal Server Error (3 attempts): "
                             "<h1>Internal error</h1> database is locked")


def test_a_status_that_is_not_transient_is_final_at_once():
    with StandIn({"/x": answer(401, {"error": "bad key"})}) as server:
        err, _ = elapsed(lambda: request_json(server.url + "/x", {}, retries=3, backoff=0.01), HTTPStatusError)
        assert server.hits["/x"] == 1
    assert one_line(err) == f'{server.url}/x answered HTTP 401 Unauthorized: {{"error": "bad key"}}'


def test_transient_status_then_success_is_retried():
    replies = [answer(429, b"slow down"), answer(503, b""), answer(200, {"ok": True})]
    with StandIn({"/x": lambda handler, server: replies.pop(0)(handler, server)}) as server:
        assert request_json(server.url + "/x", {}, retries=3, backoff=0.01) == {"ok": True}
        assert server.hits["/x"] == 3


def test_bodies_that_are_not_utf8_json_name_the_url_and_show_an_excerpt():
    html = b"<!DOCTYPE html>\n<html><body>" + b"Welcome to nginx! " * 40 + b"</body></html>"
    with StandIn({"/html": answer(200, html, "text/html"), "/bytes": answer(200, b'{"r": "\xff\xfe"}'),
                  "/empty": answer(200, b"")}) as server:
        err = elapsed(lambda: request_json(server.url + "/html"), BadReplyError)[0]
        message = one_line(err)
        assert message.startswith(f"{server.url}/html answered HTTP 200 with a body that is not JSON")
        assert "<!DOCTYPE html> <html><body>Welcome to nginx!" in message and len(message) < 400
        err = elapsed(lambda: request_json(server.url + "/bytes"), BadReplyError)[0]
        assert f"{server.url}/bytes answered HTTP 200 with bytes that are not UTF-8 (at byte 7)" in one_line(err)
        assert r'\xff\xfe' in str(err)
        assert "(empty body)" in one_line(elapsed(lambda: request_json(server.url + "/empty"), BadReplyError)[0])


def test_excerpt_is_one_short_line():
    assert excerpt(b"a\n\n b\t c") == "a b c"
    assert excerpt("x" * 500, 50) == "x" * 47 + "..."
    assert excerpt({"choices": []}) == '{"choices": []}'


# ------------------------------------------------------------------------------------------- served models
def _client(server: StandIn, **kwargs) -> CompletionsClient:
    return CompletionsClient(ServedSpec.parse(f"openai:m@{server.url}"), backoff=0.01, **kwargs)


def test_served_start_up_check_of_a_silent_server_is_bounded():
    with StandIn({"/v1/models": silent}) as server:
        err, took = elapsed(lambda: _client(server, check_timeout=1.0).check(), ServerError)
    assert took >= 1.0
    assert one_line(err).startswith(f"OpenAI-compatible server at {server.url} is not answering "
                                    f"({server.url}/v1/models: no complete reply within 1 s")


def test_served_start_up_check_default_bound_and_bench_cli(monkeypatch, capsys, tmp_path):
    """``memenv bench`` against a served model whose /v1/models never answers: one line, exit 1 (a service
    failure), in the check's time (shortened here from its 15 s default)."""
    import agents.llm.adapters.served
    from memenv.cli import main

    served = agents.llm.adapters.served
    assert CompletionsClient(ServedSpec.parse("openai:m@localhost:1")).check_timeout == served.CHECK_TIMEOUT == 15
    monkeypatch.setattr(agents.llm.adapters.served, "CHECK_TIMEOUT", 1.0)
    monkeypatch.chdir(tmp_path)
    with StandIn({"/v1/models": silent}) as server:
        start = time.monotonic()
        code = main(["bench", "--strategies", f"openai:m@{server.url}", "-n", "1", "--quiet"])
        took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 1 and took >= 1.0  # the shortened check, not the 15 s default (its message says 1 s)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{server.url}/v1/models: no complete reply within 1 s" in err


def test_served_start_up_check_of_a_web_page_says_it_is_not_the_api():
    with StandIn({"/v1/models": answer(200, b"<html>router login</html>", "text/html")}) as server:
        err = elapsed(lambda: _client(server).check(), ServerError)[0]
    assert f"{server.url}/v1/models answered HTTP 200 with a body that is not JSON" in one_line(err)
    assert "<html>router login</html>" in str(err) and "OpenAI-compatible API?" in str(err)


def test_bench_cli_with_a_web_page_for_a_served_model_is_a_wrong_url_exit_2(capsys, tmp_path, monkeypatch):
    """Something answers at the URL, but not the API: the user's URL is wrong (exit 2), where a server that
    does not answer at all is a service failure (exit 1, above)."""
    from memenv.cli import main

    monkeypatch.chdir(tmp_path)
    with StandIn({"/v1/models": answer(200, b"<html>router login</html>", "text/html")}) as server:
        code = main(["bench", "--strategies", f"openai:m@{server.url}", "-n", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{server.url}/v1/models answered HTTP 200" in err and "OpenAI-compatible API?" in err


@pytest.mark.parametrize("status", [401, 404, 503])
def test_served_start_up_check_accepts_any_status(status):
    # A server that answered with any status is up: the check passes. It must have asked (a check that sent
    # nothing would pass as well), and it passes on the same reply where a completion request fails.
    with StandIn({"/v1/models": answer(status, b"not here"), "/v1/completions": answer(status, b"not here")}) as server:
        assert _client(server, retries=1).check() is None
        assert server.hits.get("/v1/models", 0) >= 1
        with pytest.raises(ServerError, match=f"answered HTTP {status}"):
            _client(server, retries=1).complete("hi")


def test_served_http_500_forever():
    with StandIn({"/v1/completions": answer(500, {"error": "CUDA out of memory"})}) as server:
        err = elapsed(lambda: _client(server, retries=2).complete("hi"), ServerError)[0]
        assert server.hits["/v1/completions"] == 3
    assert one_line(err) == (f'{server.url}/v1/completions answered HTTP 500 Internal Server Error (3 attempts): '
                             '{"error": "CUDA out of memory"}')


def test_served_trickled_completion_times_out():
    with StandIn({"/v1/completions": trickle_body(0.1)}) as server:
        err, took = elapsed(lambda: _client(server, timeout=0.5, retries=1).complete("hi"), ServerError)
    assert took >= 1.0  # two attempts of 0.5 s
    assert f"({server.url}/v1/completions: no complete reply within 0.5 s; 2 attempts)" in one_line(err)


@pytest.mark.parametrize("reply, expected", [
    ({"choices": []}, "returned no choices (expected a completions object with a non-empty 'choices' list): "
                      '{"choices": []}'),
    ({"object": "error", "message": "model not found"}, "returned no choices"),
    ([1, 2], "returned no choices"),
    ({"choices": [{"text": 5, "finish_reason": "stop"}]}, "choices[0].text is int 5, expected a string"),
    ({"choices": ["hello"]}, "choices[0] is str, expected an object"),
    ({"choices": [{"text": "a"}], "usage": "lots"}, "usage is str, expected an object"),
    ({"choices": [{"text": "a"}], "usage": {"prompt_tokens": "7"}}, "usage.prompt_tokens is '7', expected a count"),
])
def test_served_reply_shapes_that_are_not_completions(reply, expected):
    with StandIn({"/v1/completions": answer(200, reply)}) as server:
        err = elapsed(lambda: _client(server).complete("hi"), ServerError)[0]
    message = one_line(err)
    assert message.startswith(f"{server.url}/v1/completions") and expected in message


def test_served_html_reply():
    with StandIn({"/v1/completions": answer(200, b"<html><title>502 Bad Gateway</title></html>", "text/html")}) as s:
        err = elapsed(lambda: _client(s).complete("hi"), ServerError)[0]
    assert one_line(err).startswith(f"{s.url}/v1/completions answered HTTP 200 with a body that is not JSON")
    assert "<title>502 Bad Gateway</title>" in str(err)


def test_served_null_text_and_usage_are_allowed():
    with StandIn({"/v1/completions": answer(200, {"choices": [{"text": None}], "usage": None})}) as server:
        result = _client(server).complete("hi")
    assert result.text == "" and result.prompt_tokens is None and result.finish_reason is None


def test_run_episodes_stops_at_the_first_failure():
    """A failed episode ends the run (episodes not yet started are dropped) instead of every remaining one
    running first."""
    policy = ServedPolicy("openai:m@127.0.0.1:1", concurrency=2)
    ran = []

    class Env:
        def close(self):
            pass

    def run_episode(env, agent, seed):
        ran.append(seed)
        time.sleep(0.02)
        if seed == 1:
            raise ServerError("http://127.0.0.1:1/v1/completions answered HTTP 500")
        return {"f1": 1.0}, 1

    with pytest.raises(ServerError, match="HTTP 500"):
        policy.run_episodes(Env, list(range(40)), run_episode)
    assert 1 in ran and len(ran) < 10


# ------------------------------------------------------------------------------------------- retrieval server
def test_retrieval_reply_of_bytes_that_are_not_utf8():
    with StandIn({"/retrieve": answer(200, b"\x89PNG\r\n\x1a\n\x00\x00")}) as server:
        err = elapsed(lambda: RemoteRetriever(server.url + "/retrieve").retrieve(["paris"], 2), RetrieverError)[0]
    assert one_line(err).startswith(f"retrieval server {server.url}/retrieve answered HTTP 200 with bytes that are "
                                    "not UTF-8 (at byte 0): ")


@pytest.mark.parametrize("reply, expected", [
    ({"result": [None]}, "result 0 is NoneType, expected a list of documents: {\"result\": [null]}"),
    ({"result": [[None]]}, "a result entry is NoneType, expected a document object: null"),
    ({"result": [[{"document": {"title": "t"}}]]}, "a document has neither 'contents' nor 'text' (keys: [\"title\"])"),
    ({"result": []}, "expected {'result': [...]} with 1 lists, got {\"result\": []}"),
    ({"detail": "Not Found"}, "expected {'result': [...]} with 1 lists, got {\"detail\": \"Not Found\"}"),
])
def test_retrieval_replies_that_are_not_the_api(reply, expected):
    with StandIn({"/retrieve": answer(200, reply)}) as server:
        err = elapsed(lambda: RemoteRetriever(server.url + "/retrieve").retrieve(["paris"], 2), RetrieverError)[0]
    assert one_line(err) == f"retrieval server {server.url}/retrieve: {expected}"


def test_retrieval_http_500_forever_and_trickle():
    with StandIn({"/retrieve": answer(500, b"Traceback: faiss index not loaded"), "/slow": trickle_body(0.3)}) as s:
        err = elapsed(lambda: RemoteRetriever(s.url + "/retrieve", retries=1, backoff=0.01).retrieve(["q"], 1),
                      RetrieverError)[0]
        assert one_line(err) == (f"retrieval server {s.url}/retrieve answered HTTP 500 Internal Server Error "
                                 "(2 attempts): Traceback: faiss index not loaded")
        err, took = elapsed(lambda: RemoteRetriever(s.url + "/slow", retries=0, timeout=1.0).retrieve(["q"], 1),
                            RetrieverError)
    assert took >= 1.0
    assert one_line(err) == (f"retrieval server {s.url}/slow is unreachable after 1 attempts (timeout 1.0s): "
                             "no complete reply within 1 s")


# ------------------------------------------------------------------------------------------- the judge
def _judge_route(replies: list):
    def route(handler, server):
        content = replies.pop(0)
        send(handler, 200, json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode())
    return route


@pytest.mark.parametrize("reply, score", [("1", 1.0), ("0", 0.0), ("0.5", 0.5), (" 1.\n", 1.0), ("Score: 1", 1.0),
                                          ("score: 0.5.", 0.5), ("1.0", 1.0), ("0.50", 0.5), (".5", 0.5)])
def test_judge_valid_replies(reply, score):
    assert parse_score(reply) == score


@pytest.mark.parametrize("reply", ["0.75", "-1", "2", "10", "1.5", "1/1", "yes", "1 because it matches", "", "0.5 or 1"])
def test_judge_reply_off_the_scale_is_an_error_naming_judge_and_reply(reply):
    assert parse_score(reply) is None
    with StandIn({"/v1/chat/completions": _judge_route([reply])}) as server:
        judge = OpenAIJudge("tiny-judge", server.url + "/v1", retries=0)
        err = elapsed(lambda: judge.grade("q", "item", "answer"), JudgeError)[0]
    assert one_line(err) == (f"judge tiny-judge@{server.url}/v1 replied {reply!r}: expected exactly one of the "
                             "scores 0, 0.5, 1")


def test_judge_grades_through_the_server():
    with StandIn({"/v1/chat/completions": _judge_route(["Score: 1", "0.5.", "0"])}) as server:
        judge = OpenAIJudge("tiny-judge", server.url + "/v1", retries=0)
        assert judge.rubric_score("q", ["a", "b", "c"], "answer") == (0.5, [1.0, 0.5, 0.0])


@pytest.mark.parametrize("route, expected", [
    (answer(200, b"<html>502</html>", "text/html"), "/v1/chat/completions answered HTTP 200 with a body that is not JSON"),
    (answer(200, {"choices": []}), "/v1/chat/completions sent no choices[0].message.content string"),
    (_judge_route([None]), "/v1/chat/completions sent no choices[0].message.content string"),
    (answer(500, b"overloaded"), "/v1/chat/completions answered HTTP 500 Internal Server Error (2 attempts): overloaded"),
    (trickle_body(0.1), "/v1/chat/completions unreachable after 2 tries: no complete reply within 0.3 s"),
])
def test_judge_failures_name_the_judge(route, expected):
    with StandIn({"/v1/chat/completions": route}) as server:
        judge = OpenAIJudge("tiny-judge", server.url + "/v1", retries=1, backoff=0.01, timeout=0.3)
        err = elapsed(lambda: judge.grade("q", "item", "answer"), JudgeError)[0]
    assert one_line(err).startswith(f"judge tiny-judge@{server.url}/v1: {server.url}{expected}")


def test_every_client_error_is_a_service_error():
    for cls in (RetrieverError, ServerError, JudgeError, HTTPStatusError, UnreachableError, BadReplyError):
        assert issubclass(cls, ServiceError)
    assert issubclass(RetrieverError, ConnectionError)  # as before: an OSError
    assert issubclass(ServerError, RuntimeError) and issubclass(JudgeError, RuntimeError)


def test_env_step_over_a_broken_retrieval_server_raises_the_typed_error(tmp_path):
    """What the bench counts as a failed episode: the env's step raises :class:`RetrieverError` (a
    :class:`ServiceError`) naming the server."""
    import gymnasium as gym

    import memenv  # noqa: F401 - registers the environments

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q0", "question": "Capital of France?", "answers": ["Paris"]}) + "\n")
    with StandIn({"/retrieve": answer(200, {"result": [None]})}) as server:
        env = gym.make("MemQA-v0", search_backend=server.url + "/retrieve", questions_path=questions, objectives=1)
        env.reset(seed=0)
        with pytest.raises(ServiceError, match=rf"^retrieval server {server.url}/retrieve: result 0 is NoneType"):
            env.step("<memory>m</memory><search>capital of france</search>")
        env.close()


def test_memenv_play_over_a_retrieval_server_that_breaks_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    """Past start-up, a service failure in any command (here ``memenv play``'s search) ends in one line naming
    the URL (exit 1: the server's fault, not the user's typing), not a traceback."""
    from memenv.cli import main

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q0", "question": "Capital of France?", "answers": ["Paris"]}) + "\n")
    typed = iter(["search capital of france"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
    with StandIn({"/retrieve": answer(200, {"result": [None]})}) as server:
        status = main(["play", "MemQA-v0", "--kw", f"search_backend={server.url}/retrieve",
                       "--kw", f"questions_path={questions}", "--kw", "objectives=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert len(err) == 1 and err[0].startswith(f"memenv play: error: retrieval server {server.url}/retrieve: "
                                               "result 0 is NoneType"), err
