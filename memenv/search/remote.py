"""A client for the retrieval servers Search-R1 and MEM1 run (``search_backend="http://HOST:PORT/retrieve"``).

The API (Search-R1's ``search_r1/search/retrieval_server.py``, reused by MEM1)::

    POST /retrieve  {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "7", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}

With ``"return_scores": false`` each result is the list of documents themselves. ``contents`` is split into
title and text as :func:`tasks.corpus.load_corpus_jsonl` does (first line, quotes stripped).

What is batched: :meth:`RemoteRetriever.retrieve` sends all its queries in one request (split into requests
of ``max_batch``); a :class:`PrefetchSearches` wrapper around a ``SyncVectorEnv`` of MemQA envs sends the
searches of all sub-envs of a step as one request before stepping them (each sub-env then finds its result in
the retriever's cache). Under ``AsyncVectorEnv`` every worker process sends its own request.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from memenv.search.http import BadReplyError, HTTPStatusError, ServiceError, UnreachableError, excerpt, request_json
from memenv.protocol import parse_action
from tasks.corpus import split_contents
from tasks.types import Document

__all__ = ["PrefetchSearches", "RemoteRetriever", "RetrieverError", "is_retriever_url", "shared_retriever"]


class RetrieverError(ServiceError, ConnectionError):
    """The retrieval server could not be reached, or answered something that is not the retrieval API (one line
    naming the URL and what came back)."""


def is_retriever_url(backend: Any) -> bool:
    """Whether a ``search_backend`` value names a retrieval server (``http://`` or ``https://``)."""
    return isinstance(backend, str) and backend.startswith(("http://", "https://"))


def _document(entry: Any, url: str) -> tuple[Document, float | None]:
    """One result entry (``{"document": doc, "score": s}`` or ``doc``) as a Document and its score."""
    score = None
    if isinstance(entry, dict) and "document" in entry:
        score = entry.get("score")
        entry = entry["document"]
    if not isinstance(entry, dict):
        raise RetrieverError(f"retrieval server {url}: a result entry is {type(entry).__name__}, expected a document "
                             f"object: {excerpt(entry, 120)}")
    if "contents" in entry:
        title, text = split_contents(str(entry["contents"]))
    elif "text" in entry:
        title, text = str(entry.get("title", "")), str(entry["text"])
    else:
        raise RetrieverError(f"retrieval server {url}: a document has neither 'contents' nor 'text' (keys: "
                             f"{excerpt(sorted(map(str, entry)), 120)})")
    doc_id = entry.get("id")
    if doc_id is None:  # servers over corpora without ids: name the document by its contents
        doc_id = "sha1:" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
    return Document(str(doc_id), title, text), score


class RemoteRetriever:
    """Top-k documents from a Search-R1/MEM1 retrieval server, with timeouts, retries and a result cache.

    Args:
        url: the endpoint, e.g. ``http://127.0.0.1:8000/retrieve``.
        timeout: wall-clock seconds for one attempt of a request: connect, send, and read the whole reply
            (a server that trickles its reply is cut off here).
        retries: further attempts after a failed one (connection refused, timeout, HTTP 5xx), waiting
            ``backoff * 2**attempt`` seconds before each.
        total_timeout: wall-clock seconds for a request with all its attempts and pauses (default: no bound
            beyond ``(retries + 1) * timeout`` plus the pauses).
        max_batch: queries per request.
        cache_size: (query, k) results kept, so prefetched and repeated searches cost no request.
    """

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
                 max_batch: int = 256, cache_size: int = 4096, total_timeout: float | None = None) -> None:
        if not is_retriever_url(url):
            raise ValueError(f"retriever url must start with http:// or https://, got {url!r}")
        finite = all(math.isfinite(v) for v in (timeout, backoff, total_timeout or 1.0))
        if not finite or timeout <= 0 or retries < 0 or backoff < 0 or max_batch < 1 or cache_size < 0 or (
                total_timeout is not None and total_timeout <= 0):
            raise ValueError("finite timeout > 0, retries >= 0, backoff >= 0, max_batch >= 1, cache_size >= 0 and "
                             f"total_timeout > 0 required; got {timeout}, {retries}, {backoff}, {max_batch}, "
                             f"{cache_size}, {total_timeout}")
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.total_timeout = total_timeout
        self.max_batch, self.cache_size = max_batch, cache_size
        self._cache: OrderedDict[tuple[str, int], list[Document]] = OrderedDict()
        self.requests_sent = 0

    def _post(self, queries: list[str], k: int) -> list[Any]:
        try:
            payload = request_json(self.url, {"queries": queries, "topk": k, "return_scores": True},
                                   timeout=self.timeout, retries=self.retries, backoff=self.backoff,
                                   total_timeout=self.total_timeout, on_attempt=self._count_request)
        except (HTTPStatusError, BadReplyError) as e:  # names the URL, the status and an excerpt of the body
            raise RetrieverError(f"retrieval server {e}") from e
        except UnreachableError as e:
            raise RetrieverError(f"retrieval server {self.url} is unreachable after {e.attempts} attempts "
                                 f"(timeout {self.timeout}s): {e.reason}") from e
        result = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrieverError(f"retrieval server {self.url}: expected {{'result': [...]}} with {len(queries)} "
                                 f"lists, got {excerpt(payload)}")
        for i, hits in enumerate(result):
            if not isinstance(hits, list):
                raise RetrieverError(f"retrieval server {self.url}: result {i} is {type(hits).__name__}, expected "
                                     f"a list of documents: {excerpt(payload)}")
        return result

    def _count_request(self) -> None:
        self.requests_sent += 1

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[Document]]:
        """The top ``k`` documents of each query, best first, in one request per ``max_batch`` queries."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        out: list[list[Document]] = []
        for start in range(0, len(queries), self.max_batch):
            batch = list(queries[start: start + self.max_batch])
            for hits in self._post(batch, int(k)):
                out.append([_document(entry, self.url)[0] for entry in hits][:k])
        return out

    def prefetch(self, queries: Sequence[str], k: int) -> None:
        """Fetch the uncached queries in one batched request and cache their results."""
        missing = list(dict.fromkeys(q for q in queries if (q, k) not in self._cache))
        if missing:
            for query, docs in zip(missing, self.retrieve(missing, k)):
                self._remember((query, k), docs)

    def search_documents(self, query: str, k: int) -> list[Document]:
        """The top ``k`` documents for one query (from the cache when prefetched)."""
        self.prefetch([query], k)
        docs = self._cache.get((query, k))
        if docs is None:  # cache_size 0
            docs = self.retrieve([query], k)[0]
        else:
            self._cache.move_to_end((query, k))
        return docs

    def _remember(self, key: tuple[str, int], docs: list[Document]) -> None:
        if self.cache_size == 0:
            return
        self._cache[key] = docs
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


@functools.lru_cache(maxsize=16)
def shared_retriever(url: str) -> RemoteRetriever:
    """One client per URL per process, shared by every env (so a vector env's prefetch fills their cache)."""
    return RemoteRetriever(url)


class PrefetchSearches(gym.vector.VectorWrapper):
    """Batch the sub-envs' searches of each step into one request per retrieval server (``SyncVectorEnv``).

    Before stepping, parses each sub-env's action; the searches of sub-envs whose ``index`` is a
    :class:`RemoteRetriever` are sent together, so the sub-envs then read their results from the cache.
    Other vector envs (``AsyncVectorEnv``: the sub-envs live in other processes) are stepped unchanged.
    """

    def step(self, actions):
        groups: dict[int, tuple[RemoteRetriever, int, list[str]]] = {}
        for env, action in zip(getattr(self.env, "envs", ()), actions):
            base = env.unwrapped
            retriever = getattr(base, "index", None)
            if not isinstance(retriever, RemoteRetriever) or not isinstance(action, str):
                continue
            parsed = parse_action(action, require_memory=base.mode.uses_memory)
            if parsed.valid and parsed.tool == "search":
                groups.setdefault(id(retriever), (retriever, base.top_k, []))[2].append(parsed.argument)
        for retriever, k, queries in groups.values():
            retriever.prefetch(queries, k)
        return self.env.step(actions)
