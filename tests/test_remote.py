"""memenv.search.remote: the Search-R1/MEM1 retrieval-server client against a small server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.vector import SyncVectorEnv

import memenv  # noqa: F401 - registers the environments
from memenv.search.remote import PrefetchSearches, RemoteRetriever, RetrieverError

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "2", "contents": '"Rome"\nRome is the capital of Italy.'},
]


class RetrievalServer:
    """Search-R1's /retrieve API over CORPUS (score: query words in the document); scripted failures."""

    def __init__(self, fail_first: int = 0, delay: float = 0.0) -> None:
        self.requests: list[dict] = []
        self.fail_first, self.delay = fail_first, delay
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                time.sleep(outer.delay)
                if len(outer.requests) <= outer.fail_first:
                    self.send_error(503, "warming up")
                    return
                result = []
                for query in body["queries"]:
                    words = set(query.lower().split())
                    scored = sorted(((sum(w in d["contents"].lower() for w in words), d) for d in CORPUS),
                                    key=lambda x: -x[0])[: body["topk"]]
                    result.append([{"document": d, "score": s} for s, d in scored] if body["return_scores"]
                                  else [d for _, d in scored])
                data = json.dumps({"result": result}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_retrieve_batches_queries_and_parses_documents():
    with RetrievalServer() as server:
        retriever = RemoteRetriever(server.url, max_batch=2)
        results = retriever.retrieve(["capital germany", "rome italy", "paris"], 2)
        assert [[d.id for d in docs] for docs in results] == [["1", "0"], ["2", "0"], ["0", "1"]]
        assert results[0][0].title == "Berlin" and results[0][0].text == "Berlin is the capital of Germany."
        assert [len(r["queries"]) for r in server.requests] == [2, 1]  # max_batch queries per request
        assert server.requests[0]["topk"] == 2 and server.requests[0]["return_scores"] is True


def test_retries_with_backoff_then_succeeds():
    with RetrievalServer(fail_first=2) as server:
        retriever = RemoteRetriever(server.url, retries=2, backoff=0.01)
        assert [d.id for d in retriever.search_documents("paris", 1)] == ["0"]
        assert len(server.requests) == 3


def test_server_down_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/retrieve"
    retriever = RemoteRetriever(url, retries=1, backoff=0.01, timeout=2)
    with pytest.raises(RetrieverError, match=rf"retrieval server {url} is unreachable after 2 attempts"):
        retriever.retrieve(["paris"], 3)


def test_timeout_is_an_error():
    with RetrievalServer(delay=1.0) as server:
        with pytest.raises(RetrieverError, match="unreachable after 1 attempts \\(timeout 0.2s\\)"):
            RemoteRetriever(server.url, retries=0, timeout=0.2).retrieve(["paris"], 1)


def test_memqa_over_a_server_and_one_request_per_vector_step(tmp_path: Path):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": [a]}) + "\n" for i, (q, a) in
                                 enumerate([("Capital of France?", "Paris"), ("Capital of Italy?", "Rome")])))
    with RetrievalServer() as server:
        kwargs = dict(search_backend=server.url, questions_path=questions, objectives=1, top_k=2)
        env = gym.make("MemQA-v0", **kwargs)
        env.reset(seed=0)
        obs, *_, info = env.step("<memory>m</memory><search>capital italy</search>")
        assert "Doc 1 (Title: Rome) Rome is the capital of Italy." in obs
        assert info["invocation"]["retrieved_ids"] == ["2", "0"]

        vec = PrefetchSearches(SyncVectorEnv([lambda: gym.make("MemQA-v0", **kwargs)] * 2))
        vec.reset(seed=0)
        before = len(server.requests)
        vec.step(("<memory>a</memory><search>berlin germany</search>",
                  "<memory>b</memory><search>paris france</search>"))
        assert len(server.requests) == before + 1  # both sub-envs' searches in one request
        assert server.requests[-1]["queries"] == ["berlin germany", "paris france"]
