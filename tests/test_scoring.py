"""SQuAD/HotpotQA answer scoring: normalisation, EM, F1, aliases, multi-objective aggregation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memenv.scoring.qa import (
    best_em_f1,
    exact_match,
    f1_score,
    normalize_answer,
    score_objectives,
    split_answers,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Beatles", "beatles"),  # article + case
        ("a Tale of Two Cities", "tale of two cities"),
        ("An apple, a day", "apple day"),
        ("theatre another anthem", "theatre another anthem"),  # articles only as whole words
        ("U.S.A.", "usa"),  # punctuation removed, not replaced by spaces
        ("Jean-Paul Sartre", "jeanpaul sartre"),
        ("  multiple   spaces\tand\nnewlines ", "multiple spaces and newlines"),
        ("$1,000!", "1000"),
        ("THE", ""),
        ("", ""),
        ("Café", "café"),  # no unicode folding, as the official scripts
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_exact_match() -> None:
    assert exact_match("the Beatles!", "Beatles") == 1.0
    assert exact_match("Beatles", "The Rolling Stones") == 0.0
    assert exact_match("", "") == 1.0
    assert isinstance(exact_match("a", "b"), float)


def test_f1_hand_computed() -> None:
    # pred tokens {barack, obama}, gold {obama}: P = 1/2, R = 1, F1 = 2/3.
    assert f1_score("Barack Obama", "Obama") == pytest.approx(2 / 3)
    # pred "new york city" vs gold "york city new jersey": common 3, P = 3/3, R = 3/4, F1 = 6/7.
    assert f1_score("New York City", "York City, New Jersey") == pytest.approx(6 / 7)
    # Bag of words with multiplicity: pred [x, x, y], gold [x, y, y]: common = x:1 + y:1 = 2, P = R = 2/3.
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("The Beatles", "beatles.") == 1.0
    assert f1_score("Paris", "London") == 0.0


def test_f1_special_answers() -> None:
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("Yes.", "yes") == 1.0
    assert f1_score("yes", "no") == 0.0
    # Token overlap does not count against a yes/no/noanswer gold or prediction.
    assert f1_score("yes it is", "yes") == 0.0
    assert f1_score("no", "no way") == 0.0
    assert f1_score("noanswer", "no answer") == 0.0


def test_f1_empty_sides() -> None:
    assert f1_score("", "Paris") == 0.0
    assert f1_score("Paris", "") == 0.0
    assert f1_score("the", "") == 1.0  # both normalise to "": consistent with EM (SQuAD v2 rule)


def test_best_em_f1_over_aliases() -> None:
    assert best_em_f1("NYC", ["New York City", "NYC"]) == (1.0, 1.0)
    em, f1 = best_em_f1("New York", ["New York City", "Big Apple"])
    assert em == 0.0 and f1 == pytest.approx(0.8)  # P = 1, R = 2/3
    # EM and F1 are maximised independently.
    em, f1 = best_em_f1("obama", ["Barack Obama", "obama"])
    assert (em, f1) == (1.0, 1.0)
    assert best_em_f1("Paris", "Paris") == (1.0, 1.0)  # a bare string is one alias
    assert best_em_f1("Paris", []) == (0.0, 0.0)
    assert best_em_f1(None, ["Paris"]) == (0.0, 0.0)


def test_score_objectives_aggregation_and_missing() -> None:
    golds = [["Paris"], ["Barack Obama", "Obama"], ["1969"]]
    out = score_objectives(["paris", "Barack H. Obama"], golds)  # third answer missing
    assert out["em"] == [1.0, 0.0, 0.0]
    assert out["f1"][0] == 1.0
    assert out["f1"][1] == pytest.approx(0.8)  # vs "Barack Obama": P = 2/3, R = 1
    assert out["f1"][2] == 0.0
    assert out["em_sum"] == 1.0
    assert out["f1_sum"] == pytest.approx(1.8)
    assert out["em_mean"] == pytest.approx(1 / 3)
    assert out["f1_mean"] == pytest.approx(0.6)
    assert set(out) == {"em", "f1", "em_sum", "f1_sum", "em_mean", "f1_mean"}


def test_score_objectives_extra_none_and_empty() -> None:
    out = score_objectives(["a1", None, "c", "surplus"], ["A1", "b", ["c", "C!"]])
    assert out["em"] == [1.0, 0.0, 1.0]
    assert out["em_sum"] == 2.0
    empty = score_objectives([], [])
    assert empty == {"em": [], "f1": [], "em_sum": 0.0, "f1_sum": 0.0, "em_mean": 0.0, "f1_mean": 0.0}


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("Paris; Obama; 1969", 3, ["Paris", "Obama", "1969"]),
        (" Paris ;Obama ", 3, ["Paris", "Obama", ""]),  # padded
        ("a; b; c; d", 2, ["a", "b"]),  # surplus dropped
        ("", 2, ["", ""]),
        ("only", 1, ["only"]),
        ("a;;c", 3, ["a", "", "c"]),  # an empty slot stays in place
        ("anything", 0, []),
    ],
)
def test_split_answers(text: str, n: int, expected: list[str]) -> None:
    assert split_answers(text, n) == expected


def test_split_answers_negative() -> None:
    with pytest.raises(ValueError):
        split_answers("a", -1)


@given(st.text(), st.text())
def test_metric_properties(pred: str, gold: str) -> None:
    em, f1 = exact_match(pred, gold), f1_score(pred, gold)
    assert 0.0 <= f1 <= 1.0
    assert em in (0.0, 1.0)
    if em == 1.0:
        assert f1 == 1.0
    assert f1 == pytest.approx(f1_score(gold, pred))  # F1 is symmetric
