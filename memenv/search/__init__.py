"""Search for the environments' ``<search>`` tool: :mod:`~memenv.search.bm25` (in-memory BM25 backends and the
shared tokeniser), :mod:`~memenv.search.index` (the on-disk BM25 index for corpora that do not fit in memory),
:mod:`~memenv.search.remote` (a retrieval server over HTTP) and :mod:`~memenv.search.http` (the one JSON-over-HTTP
request loop that the retrieval server, served models and judges share)."""

from memenv.search.bm25 import BACKENDS, STOPWORDS, SearchBackend, make_backend, tokenize

__all__ = ["BACKENDS", "STOPWORDS", "SearchBackend", "make_backend", "tokenize"]
