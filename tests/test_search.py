"""Search backends: tokenisation, the shared ranking rule, and BM25Sparse == BM25Reference."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memenv.search.bm25 import (
    BACKENDS,
    STOPWORDS,
    BM25Reference,
    BM25Sparse,
    SearchBackend,
    make_backend,
    tokenize,
    word_tokens,
)

VOCAB = [f"w{i}" for i in range(40)]


def random_corpus(seed: int, n_docs: int = 200, vocab: list[str] = VOCAB) -> list[str]:
    """Docs of 0-20 words with skewed word frequencies (so some terms have negative raw idf)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        # A prefix of the vocabulary per doc: low-numbered words appear in most docs.
        words = vocab[: rng.randint(1, len(vocab))]
        docs.append(" ".join(rng.choice(words) for _ in range(rng.randint(0, 20))))
    return docs


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return random_corpus(0)


@pytest.fixture(scope="module")
def pair(corpus: list[str]) -> tuple[BM25Sparse, BM25Reference]:
    return BM25Sparse(corpus), BM25Reference(corpus)


# --- tokenize ---------------------------------------------------------------------------------------


def test_tokenize_lowercases_and_splits_on_non_alphanumerics() -> None:
    assert tokenize("Hello, World! foo-bar_baz 42nd") == ["hello", "world", "foo", "bar", "baz", "42nd"]


def test_tokenize_strips_accents_and_compatibility_forms() -> None:
    assert tokenize("Café Zoë naïve ÉCOLE") == ["cafe", "zoe", "naive", "ecole"]
    assert tokenize("ﬁne x²") == ["fine", "x2"]  # NFKD: ligature and superscript decomposed


def test_tokenize_drops_stopwords() -> None:
    assert tokenize("What is the capital of France and who was its king") == ["capital", "france", "king"]
    assert tokenize("The THE a An") == []


def test_tokenize_edge_cases() -> None:
    assert tokenize("") == []
    assert tokenize("   ...!!! ") == []
    assert tokenize("東京 Москва") == []  # nothing of [a-z0-9] survives outside Latin script


def test_stopword_set_is_the_documented_one() -> None:
    expected = set(
        "the a an of in on and or is was to for by with at from as that this what which who whom whose "
        "did does do be are were it its".split()
    )
    assert STOPWORDS == expected


# --- agreement with the reference -------------------------------------------------------------------


def random_queries(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    extra = ["unknownterm", "the", "W3", "w1,w1"]  # unknown, stopword, case, punctuation-joined repeat
    return [" ".join(rng.choice(VOCAB + extra) for _ in range(rng.randint(0, 6))) for _ in range(n)]


def test_scores_equal_reference(pair: tuple[BM25Sparse, BM25Reference]) -> None:
    fast, ref = pair
    for q in random_queries(1, 300):
        s_fast, s_ref = fast.scores(q), ref.scores(q)
        assert s_fast.dtype == np.float64 and s_fast.shape == (len(fast),)
        np.testing.assert_allclose(s_fast, s_ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("k", [1, 3, 10, 1000])
def test_rankings_equal_reference(pair: tuple[BM25Sparse, BM25Reference], k: int) -> None:
    fast, ref = pair
    for q in random_queries(2, 200):
        assert fast.search(q, k) == ref.search(q, k), q


def test_scores_are_bit_identical(pair: tuple[BM25Sparse, BM25Reference]) -> None:
    # Stronger than the contract (~1e-9): same operations in the same order, so exact ties stay exact.
    fast, ref = pair
    for q in random_queries(3, 100):
        assert np.array_equal(fast.scores(q), ref.scores(q)), q


def test_repeated_query_terms_count_each_time(pair: tuple[BM25Sparse, BM25Reference]) -> None:
    for backend in pair:
        once, twice = backend.scores("w5"), backend.scores("w5 w5")
        np.testing.assert_allclose(twice, 2 * once, rtol=1e-12)
        # Term order only changes the float summation order (both backends sum in query order).
        np.testing.assert_allclose(backend.scores("w5 w7 w5"), backend.scores("w5 w5 w7"), rtol=1e-12)


def test_unknown_terms(pair: tuple[BM25Sparse, BM25Reference]) -> None:
    for backend in pair:
        assert backend.search("nosuchword", 5) == []
        assert backend.search("the of and", 5) == []  # stopwords only: an empty query
        assert backend.search("", 5) == []
        assert not backend.scores("nosuchword").any()
        # An unknown term adds nothing to the known ones.
        assert np.array_equal(backend.scores("w9 nosuchword"), backend.scores("w9"))


def test_k_larger_than_matches_returns_only_matches() -> None:
    docs = ["apple banana", "cherry", "apple", "durian", "elderberry"]
    for name in BACKENDS:
        backend = make_backend(name, docs)
        # Only docs 0 and 2 contain "apple"; docs with score 0 never pad the result.
        assert backend.search("apple", 10) == [2, 0]  # doc 2 is shorter, so it scores higher
        assert backend.search("apple", 1) == [2]
        assert backend.search("apple", 0) == []


def test_ties_go_to_lower_index() -> None:
    docs = ["gamma delta", "alpha beta", "zeta", "alpha beta", "beta alpha", "eta", "alpha beta"]
    for name in BACKENDS:
        backend = make_backend(name, docs)
        scores = backend.scores("alpha")
        assert scores[1] == scores[3] == scores[4] == scores[6] > 0
        assert backend.search("alpha", 10) == [1, 3, 4, 6]
        # The cut at k falls inside the tie: still the lowest indices win.
        assert backend.search("alpha", 2) == [1, 3]
        assert backend.search("alpha", 3) == [1, 3, 4]


def test_rank_rule_directly() -> None:
    s = np.array([0.5, 2.0, 0.0, 2.0, -1.0, 1.0, 2.0])
    assert SearchBackend.rank(s, 2) == [1, 3]
    assert SearchBackend.rank(s, 4) == [1, 3, 6, 5]
    assert SearchBackend.rank(s, 100) == [1, 3, 6, 5, 0]  # 0.0 and -1.0 never returned
    assert SearchBackend.rank(np.zeros(5), 3) == []
    assert SearchBackend.rank(np.zeros(0), 3) == []
    with pytest.raises(ValueError):
        SearchBackend.rank(s, -1)
    with pytest.raises(TypeError):
        SearchBackend.rank(s, 2.0)  # type: ignore[arg-type]


def test_negative_idf_is_floored_with_epsilon() -> None:
    # "common" is in 4 of 5 docs: raw idf log(1.5) - log(4.5) < 0, replaced by epsilon * mean raw idf.
    docs = ["common x", "common y", "common z", "common", "rare"]
    fast, ref = BM25Sparse(docs), BM25Reference(docs)
    n_docs = 5
    raw = {"common": 4, "x": 1, "y": 1, "z": 1, "rare": 1}
    raw_idf = {t: math.log(n_docs - n + 0.5) - math.log(n + 0.5) for t, n in raw.items()}
    average = sum(raw_idf.values()) / len(raw_idf)
    assert fast.average_idf == pytest.approx(average)
    assert fast.idf[fast.vocab["common"]] == pytest.approx(0.25 * average)
    assert fast.idf[fast.vocab["rare"]] == pytest.approx(raw_idf["rare"])
    np.testing.assert_array_equal(fast.scores("common"), ref.scores("common"))
    assert fast.search("common", 5) == ref.search("common", 5)


def test_bm25_formula_by_hand() -> None:
    docs = ["cat dog", "cat cat mouse", "bird", "fish fish fish fish"]
    fast = BM25Sparse(docs)
    n_docs, avgdl, k1, b = 4, (2 + 3 + 1 + 4) / 4, 1.5, 0.75
    idf_cat = math.log(n_docs - 2 + 0.5) - math.log(2 + 0.5)  # = 0: in exactly half the docs

    def weight(tf: int, dl: int, idf: float) -> float:
        return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    idf_mouse = math.log(n_docs - 1 + 0.5) - math.log(1 + 0.5)
    expected = [weight(1, 2, idf_cat), weight(2, 3, idf_cat) + weight(1, 3, idf_mouse), 0.0, 0.0]
    np.testing.assert_allclose(fast.scores("cat mouse"), expected, rtol=1e-12, atol=1e-15)
    assert fast.search("cat mouse", 3) == [1]  # idf(cat) == 0 exactly: doc 0 scores 0 and is dropped


def test_custom_parameters_and_tokenizer(corpus: list[str]) -> None:
    fast = make_backend("bm25", corpus, k1=0.9, b=0.4, epsilon=0.1)
    ref = make_backend("rank_bm25", corpus, k1=0.9, b=0.4, epsilon=0.1)
    for q in random_queries(4, 50):
        np.testing.assert_allclose(fast.scores(q), ref.scores(q), rtol=0, atol=1e-9)

    def split(text: str) -> list[str]:  # case-sensitive whitespace tokeniser, stopwords kept
        return text.split()

    docs = ["The cat", "the Cat", "THE CAT"]
    for name in BACKENDS:
        backend = make_backend(name, docs, tokenizer=split)
        assert backend.tokenizer is split
        assert backend.search("the", 5) == [1]
        assert backend.search("cat", 5) == [0]


def test_degenerate_corpora() -> None:
    for name in BACKENDS:
        empty = make_backend(name, [])
        assert len(empty) == 0
        assert empty.search("anything", 3) == []
        assert empty.scores("anything").shape == (0,)

        stop = make_backend(name, ["the of", "", "and a"])  # no indexable token at all
        assert len(stop) == 3
        assert stop.search("the", 3) == []
        assert np.array_equal(stop.scores("x"), np.zeros(3))

        single = make_backend(name, ["lonely word"])
        # idf = log(0.5) - log(1.5) < 0 for every term, and so is the epsilon floor: nothing is returned.
        assert single.search("lonely", 3) == []


def test_len_and_type_checks(corpus: list[str]) -> None:
    assert len(BM25Sparse(corpus)) == len(corpus) == len(BM25Reference(corpus))
    with pytest.raises(TypeError):
        BM25Sparse(["ok", 3])  # type: ignore[list-item]


def test_scores_returns_fresh_array(pair: tuple[BM25Sparse, BM25Reference]) -> None:
    fast, _ = pair
    a = fast.scores("w1")
    a[:] = 99.0
    assert not np.array_equal(fast.scores("w1"), a)


# --- make_backend -----------------------------------------------------------------------------------


def test_make_backend_names() -> None:
    docs = ["alpha beta", "gamma"]
    assert isinstance(make_backend("bm25", docs), BM25Sparse)
    assert isinstance(make_backend("rank_bm25", docs), BM25Reference)
    assert set(BACKENDS) == {"bm25", "rank_bm25"}


@pytest.mark.parametrize("name", ["BM25", "tfidf", "", None])
def test_make_backend_unknown_name(name: object) -> None:
    with pytest.raises(ValueError) as err:
        make_backend(name, ["doc"])  # type: ignore[arg-type]
    assert "'bm25'" in str(err.value) and "'rank_bm25'" in str(err.value)


# --- property test ----------------------------------------------------------------------------------

PROP_VOCAB = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"]
words = st.sampled_from(PROP_VOCAB + ["zzz"])  # "zzz" never occurs in a document


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from(PROP_VOCAB), max_size=8), min_size=1, max_size=25),
    queries=st.lists(st.lists(words, max_size=6), min_size=1, max_size=5),
    k=st.integers(min_value=0, max_value=30),
)
def test_property_sparse_matches_reference(
    docs: list[list[str]], queries: list[list[str]], k: int
) -> None:
    texts = [" ".join(d) for d in docs]
    fast, ref = BM25Sparse(texts), BM25Reference(texts)
    for words_ in queries:
        q = " ".join(words_)
        np.testing.assert_allclose(fast.scores(q), ref.scores(q), rtol=0, atol=1e-9)
        assert fast.search(q, k) == ref.search(q, k)


def test_backends_pickle(corpus: list[str]) -> None:
    # Envs (and their backends) are shipped to AsyncVectorEnv worker processes.
    import pickle

    for name in BACKENDS:
        backend = make_backend(name, corpus)
        clone = pickle.loads(pickle.dumps(backend))
        assert np.array_equal(clone.scores("w1 w2 w30"), backend.scores("w1 w2 w30"))


def test_ascii_fast_path_equals_the_regular_expression_on_every_ascii_character() -> None:
    """tokenize() translates ASCII text byte by byte instead of running the regex: the same tokens, for
    every ASCII character (controls, punctuation, digits, both cases) in random strings."""
    import re

    rng = random.Random(0)
    alphabet = [chr(c) for c in range(128)] + ["the ", "of ", "A "]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        expected = [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in STOPWORDS]
        assert tokenize(text) == expected, repr(text)
    assert word_tokens("The Cat_sat") == ["the", "cat", "sat"]  # before the stopword filter


@pytest.mark.parametrize("backend", ["bm25", "rank_bm25"])
@pytest.mark.parametrize("kw, named", [({"k1": float("nan")}, "k1"), ({"k1": -1.0}, "k1"), ({"b": 5}, "b"),
                                        ({"b": -0.1}, "b"), ({"epsilon": float("inf")}, "epsilon")])
def test_in_memory_backends_refuse_bm25_parameters_out_of_range(backend, kw, named):
    # The same rule as the disk index: a NaN k1 would make every score NaN and every search match nothing.
    with pytest.raises(ValueError, match=f"BM25 parameter {named} must be a finite number"):
        make_backend(backend, ["paris is in france", "berlin is in germany"], **kw)
