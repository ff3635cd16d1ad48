"""memenv.search.index: the disk-backed BM25 index ranks exactly as rank_bm25, detects a changed corpus, is atomic."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the environments
from memenv.context import sanitize
from memenv.cli import main as cli_main
from memenv.search.index.build import build_index
from memenv.search.index.format import IndexMismatchError
from memenv.search.index.search import BM25Index
from memenv.search.bm25 import SearchBackend, make_backend, tokenize
from tasks.corpus import load_corpus_jsonl
from tasks.types import DataFormatError

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "Café", "cafe", "the", "x1"]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def random_corpus(rng: np.random.Generator, n: int, words=WORDS, max_len: int = 12) -> list[dict]:
    """Short documents over a tiny vocabulary: many exact score ties, some empty documents."""
    return [{"id": f"d{i}", "title": f"T{i % 5}", "text": " ".join(rng.choice(words, int(rng.integers(0, max_len))))}
            for i in range(n)]


def indexed_texts(records: list[dict]) -> list[str]:
    return [f"{sanitize(r['title'])}\n{sanitize(r['text'])}" for r in records]


def without_range_bounds(index: BM25Index) -> BM25Index:
    """The index as one built before block-max bounds were added: search falls back to the threshold
    algorithm."""
    index.range_docs, index.term_max, index.range_row, index.range_max = 0, None, None, None
    return index


@pytest.mark.parametrize("chunk_docs,merge_postings,workers,range_docs",
                         [(1000, 10**6, 0, 64), (17, 40, 0, 1), (29, 7, 2, 8)])
@pytest.mark.parametrize("method", ["block-max", "threshold"])
def test_rankings_and_scores_identical_to_rank_bm25(tmp_path, chunk_docs, merge_postings, workers, range_docs,
                                                    method):
    rng = np.random.default_rng(chunk_docs)
    records = random_corpus(rng, 150)
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    build_index(corpus, tmp_path / "idx", chunk_docs=chunk_docs, merge_postings=merge_postings, workers=workers,
                range_docs=range_docs, progress=False)
    index = BM25Index(tmp_path / "idx", corpus_path=corpus)
    assert index.range_docs == range_docs and index.range_max is not None
    if method == "threshold":
        without_range_bounds(index)
    reference = make_backend("rank_bm25", indexed_texts(records))
    for _ in range(120):
        query = " ".join(rng.choice(WORDS + ["t2", "unknown"], int(rng.integers(1, 7))))  # repeats included
        assert np.array_equal(index.scores(query), reference.scores(query)), query
        for k in (1, 2, 5, 200):
            assert index.search(query, k) == reference.search(query, k), (query, k)
    assert index.search("unknown", 3) == [] and index.search("alpha", 0) == []
    with pytest.raises(ValueError, match="k must be >= 0"):
        index.search("alpha", -1)


def test_early_termination_matches_exhaustive_on_zipf_corpora(tmp_path):
    """Deep enough corpora that the threshold algorithm deepens, drops non-essential terms and falls back."""
    rng = np.random.default_rng(7)
    vocab = [f"w{i}" for i in range(300)]
    p = 1 / np.arange(1, 301) ** 1.05
    records = [{"id": str(i), "text": " ".join(rng.choice(vocab, int(rng.integers(5, 40)), p=p / p.sum()))}
               for i in range(2500)]
    build_index(write_jsonl(tmp_path / "z.jsonl", records), tmp_path / "z", progress=False, workers=0)
    index = without_range_bounds(BM25Index(tmp_path / "z"))
    reference = make_backend("bm25", indexed_texts([{"title": "", **r} for r in records]))
    for depth in (1, 4, 64):
        index.initial_depth = depth
        for _ in range(60):
            query = " ".join(rng.choice(vocab, int(rng.integers(1, 6)), p=p / p.sum()))
            for k in (1, 3, 10):
                assert index.search(query, k) == SearchBackend.rank(index.scores(query), k) \
                    == reference.search(query, k), (query, k, depth)


def zipf_index(tmp_path, n_docs: int, seed: int, range_docs: int):
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(300)]
    p = 1 / np.arange(1, 301) ** 1.05
    p /= p.sum()
    records = [{"id": str(i), "text": " ".join(rng.choice(vocab, int(rng.integers(5, 40)), p=p))}
               for i in range(n_docs)]
    build_index(write_jsonl(tmp_path / "z.jsonl", records), tmp_path / "z", progress=False, workers=0,
                range_docs=range_docs)
    return BM25Index(tmp_path / "z"), records, vocab, p, rng


@pytest.mark.parametrize("range_docs,first_chunk", [(4, 1), (16, 16), (64, 3)])
def test_block_max_search_matches_exhaustive_on_common_term_queries(tmp_path, range_docs, first_chunk):
    """Block-max pruning is exact on the queries the threshold algorithm could not prune: only very common
    terms (each in a large share of the documents, so every range holds them), repeated terms included."""
    index, records, vocab, p, rng = zipf_index(tmp_path, 3000, range_docs, range_docs)
    index.first_chunk = first_chunk
    df = np.diff(index.indptr)
    assert (index.range_row >= 0).any()  # stored rows, and (smaller ranges: more of them) bounds computed
    assert (index.range_row[df > 0] < 0).any() == (range_docs < 64)  # from the postings of rarer terms
    common = [t for t in vocab if t in index.vocab and df[index.vocab[t]] > len(records) // 4]
    assert len(common) >= 5
    reference = make_backend("bm25", indexed_texts([{"title": "", **r} for r in records]))
    queries = [" ".join(rng.choice(common, int(rng.integers(1, 7)))) for _ in range(80)]
    queries += [" ".join(rng.choice(vocab, int(rng.integers(1, 6)), p=p)) for _ in range(40)]
    for query in queries:
        for k in (1, 3, 10, 50):
            assert index.search(query, k) == SearchBackend.rank(index.scores(query), k) \
                == reference.search(query, k), (query, k)


def test_range_bounds_are_upper_bounds_of_every_score(tmp_path):
    """Each range's bound is at least every score in it, and at most the sum of the terms' largest weights in it
    plus the quantisation step (1/255 of a term's maximum) of the stored rows."""
    index, records, vocab, p, rng = zipf_index(tmp_path, 1000, 3, 8)
    n_ranges, width = index.range_max.shape[1], index.range_docs

    def per_range_max(values: np.ndarray) -> np.ndarray:
        padded = np.zeros(n_ranges * width)
        padded[: len(values)] = values
        return padded.reshape(n_ranges, width).max(axis=1)

    for _ in range(30):
        query = " ".join(rng.choice(vocab, int(rng.integers(1, 6)), p=p))
        query_terms = index._query_terms(query)
        terms = list(dict.fromkeys(query_terms))
        mult = np.bincount([terms.index(t) for t in query_terms], minlength=len(terms))
        bound = index._range_bounds(terms, mult)
        assert np.all(bound >= per_range_max(index.scores(query))), query
        tight = np.zeros(n_ranges)
        for j, t in enumerate(terms):
            lo, hi = index.indptr[t], index.indptr[t + 1]
            weights = np.zeros(len(records))
            weights[index.post_doc[lo:hi]] = index._weights(t, index.post_doc[lo:hi], index.post_tf[lo:hi])
            tight += mult[j] * per_range_max(weights)
        step = (mult * index.term_max[terms] * (index.range_row[terms] >= 0)).sum() / 255
        assert bound.dtype == np.float32 and np.all(bound >= tight), query
        assert np.all(bound <= tight * (1 + 1e-4) + step), query


def test_document_store_and_manifest(tmp_path):
    records = random_corpus(np.random.default_rng(1), 40) + [{"id": 99, "contents": '"Zoë\x07"\nbody text'}]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    build_index(corpus, tmp_path / "idx", chunk_docs=8, progress=False, workers=0)
    index = BM25Index(tmp_path / "idx")
    expected = [(d.id, sanitize(d.title), sanitize(d.text)) for d in load_corpus_jsonl(corpus)]
    assert [(d.id, d.title, d.text) for d in index.documents] == expected
    assert index.documents[-1].title == "Zoë\ufffd" and len(index.documents) == len(records)
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["n_docs"] == 41 and manifest["params"] == {"k1": 1.5, "b": 0.75, "epsilon": 0.25}
    assert manifest["corpus"]["fingerprint"]["size"] == corpus.stat().st_size
    assert isinstance(index.post_doc.base, np.memmap)  # memory-mapped, not read into memory
    reopened = pickle.loads(pickle.dumps(index))
    assert reopened.search("alpha beta", 5) == index.search("alpha beta", 5)


def test_changed_corpus_is_detected_and_named(tmp_path):
    records = random_corpus(np.random.default_rng(2), 30)
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    BM25Index(tmp_path / "idx", corpus_path=corpus)  # unchanged: fine
    write_jsonl(corpus, records[:-1])
    with pytest.raises(IndexMismatchError, match=r"corpus file .*c\.jsonl does not match the index .*idx.*size"):
        BM25Index(tmp_path / "idx", corpus_path=corpus)
    same_size = records[:-1] + [dict(records[-1], text=records[-1]["text"].upper())]
    write_jsonl(corpus, same_size)
    os.utime(corpus, ns=(0, json.loads((tmp_path / "idx" / "manifest.json").read_text())
                         ["corpus"]["fingerprint"]["mtime_ns"]))
    with pytest.raises(IndexMismatchError, match="head_tail_blake2b"):
        BM25Index(tmp_path / "idx", corpus_path=corpus)


def test_build_is_atomic_and_errors_name_the_record(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", random_corpus(np.random.default_rng(3), 20))
    build_index(good, tmp_path / "idx", progress=False, workers=0)
    before = (tmp_path / "idx" / "manifest.json").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n\n{"id": "b", "txt": "y"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad\.jsonl: line 3: missing key 'text'"):
        build_index(bad, tmp_path / "idx", progress=False, workers=0)
    assert (tmp_path / "idx" / "manifest.json").read_text() == before  # the old index is untouched
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"},
                                               {"id": "a", "text": "z"}])
    with pytest.raises(DataFormatError, match=r"duplicate document id 'a' \(records 0 and 2"):
        build_index(dup, tmp_path / "idx2", progress=False, workers=0)
    array = tmp_path / "array.json"
    array.write_text('[{"id": "a", "text": "x"}]', encoding="utf-8")
    with pytest.raises(DataFormatError, match="JSON array; the index needs JSON Lines"):
        build_index(array, tmp_path / "idx3", progress=False, workers=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["array.json", "bad.jsonl", "dup.jsonl", "good.jsonl",
                                                          "idx"]  # no temporary directories left behind


def test_cli_index_build(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", random_corpus(np.random.default_rng(4), 12))
    assert cli_main(["index", "build", str(corpus), str(tmp_path / "out"), "--workers", "0", "--k1", "1.2",
                     "--range-docs", "3"]) == 0
    assert "indexed 12 documents" in capsys.readouterr().out
    index = BM25Index(tmp_path / "out")
    assert index.k1 == 1.2 and index.range_docs == 3 and index.range_max.shape[1] == 4  # ceil(12 / 3) ranges
    with pytest.raises(ValueError, match="range_docs must be >= 1, got .*0"):
        build_index(corpus, tmp_path / "bad", range_docs=0, progress=False)


def test_memqa_over_an_index_matches_memqa_over_the_loaded_corpus(tmp_path):
    rng = np.random.default_rng(5)
    records = random_corpus(rng, 60)
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    questions = write_jsonl(tmp_path / "q.jsonl", [{"id": f"q{i}", "question": f"What about {w}?",
                                                     "answers": [w]} for i, w in enumerate(WORDS[:6])])
    build_index(corpus, tmp_path / "idx", progress=False, workers=0)
    in_memory = gym.make("MemQA-v0", corpus_path=corpus, questions_path=questions).unwrapped
    on_disk = gym.make("MemQA-v0", index_path=tmp_path / "idx", questions_path=questions).unwrapped
    checked = gym.make("MemQA-v0", index_path=tmp_path / "idx", corpus_path=corpus,
                       questions_path=questions).unwrapped
    for env in (in_memory, on_disk, checked):
        env.reset(seed=0)
    for query in ("alpha beta", "cafe gamma gamma", "theta t3"):
        action = f"<memory>m</memory><search>{query}</search>"
        results = [env.step(action) for env in (in_memory, on_disk, checked)]
        assert results[0][0] == results[1][0] == results[2][0]
        ids = [r[4]["invocation"]["retrieved_ids"] for r in results]
        assert ids[0] == ids[1] == ids[2] and ids[0]
    write_jsonl(corpus, records[:-1])
    with pytest.raises(IndexMismatchError, match="c.jsonl does not match"):
        gym.make("MemQA-v0", index_path=tmp_path / "idx", corpus_path=corpus, questions_path=questions)
    with pytest.raises(ValueError, match="needs questions_path="):
        gym.make("MemQA-v0", index_path=tmp_path / "idx")


def test_build_tokenises_each_document_as_tokenize_does(tmp_path):
    """The build's chunk tokeniser (ASCII fast path, sanitize only for non-ASCII, stopwords dropped per term
    after mapping) counts exactly what tokenize() of the sanitised title and text gives, document by document."""
    from memenv.search.index.build import _tokenize_chunk

    texts = ["the of and", "Zoë's 2nd-floor \x01ctrl\x7f nbsp\u00a0x \ufb01ne", "A an THE", "ﬁsh ǅ Ⅻ 𝐀bc x²",
             "x", "Alpha beta alpha\tALPHA", "\u2028line\u0085sep café CAFE", "beta the gamma the"]
    records = [{"id": f"d{i}", "title": "T" if i % 2 else "", "text": t} for i, t in enumerate(texts)]
    lines = [json.dumps(r).encode() for r in records]
    chunk = _tokenize_chunk(("c.jsonl", list(range(1, len(lines) + 1)), lines))
    counts = {}
    for t, d, tf in zip(chunk["ltid"], chunk["did"], chunk["tf"]):
        counts[(chunk["terms"][t], int(d))] = int(tf)
    expected = {}
    for d, text in enumerate(indexed_texts(records)):
        for tok in tokenize(text):
            expected[(tok, d)] = expected.get((tok, d), 0) + 1
    assert counts == expected
    assert list(chunk["lengths"]) == [len(tokenize(t)) for t in indexed_texts(records)]
    assert chunk["terms"] == list(dict.fromkeys(t for text in indexed_texts(records) for t in tokenize(text)))
