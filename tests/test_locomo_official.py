"""LoCoMo's official score (memenv.scoring.locomo): hand cases for every category, and the env reporting it."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from memenv.scoring.locomo import locomo_f1, locomo_normalize, locomo_score, locomo_tokens
from memenv.scoring.qa import f1_score

from conftest import _tiny_locomo


def test_normalisation_drops_commas_punctuation_articles_and_and() -> None:
    assert locomo_normalize("The cat, and a Dog!") == "cat dog"
    assert locomo_tokens("Running races, flies") == ["run", "race", "fli"]  # Porter stems


def test_stemming_is_what_separates_it_from_squad_f1() -> None:
    # "hiking" and "hikes" share no surface token (SQuAD F1 0) but one stem (LoCoMo F1 1).
    assert f1_score("hiking", "hikes") == 0.0
    assert locomo_f1("hiking", "hikes") == 1.0
    assert locomo_score("She went hiking", "hikes", 4) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


def test_category_1_multi_hop_splits_on_commas_and_averages() -> None:
    gold = "Paris, Rome, Oslo"
    # Each gold part takes its best answer part: Paris 1, Rome 1, Oslo 0 -> 2/3.
    assert locomo_score("Rome, Paris", gold, 1) == pytest.approx(2 / 3)
    assert locomo_score("Paris, Rome, Oslo", gold, 1) == 1.0
    # Unsplit, the same answer would score the bag-of-words F1 of the joined strings instead.
    assert locomo_score("Rome, Paris", gold, 2) == pytest.approx(locomo_f1("Rome Paris", "Paris Rome Oslo"))
    assert locomo_score("Rome, Paris", gold, 2) != pytest.approx(2 / 3)


def test_category_2_temporal_is_plain_stemmed_f1() -> None:
    assert locomo_score("7 May 2023", "7 May 2023", 2) == 1.0
    assert locomo_score("May 2023", "7 May 2023", 2) == pytest.approx(0.8)
    assert locomo_score("yesterday", "7 May 2023", 2) == 0.0


def test_category_3_keeps_the_first_semicolon_part_of_the_gold() -> None:
    gold = "Likely yes; she enjoys outdoor activities"
    assert locomo_score("likely yes", gold, 3) == 1.0
    assert locomo_score("she enjoys outdoor activities", gold, 3) == 0.0  # the part after ';' is not scored
    assert locomo_score("she enjoys outdoor activities", gold, 4) > 0.5  # category 4 scores the whole gold


def test_category_4_single_hop_is_plain_stemmed_f1() -> None:
    assert locomo_score("Adoption agencies", "adoption agency", 4) == 1.0
    assert locomo_score("a counselor", "counseling", 4) == 0.0  # stems "counselor" and "counsel" differ
    assert locomo_score("", "adoption agency", 4) == 0.0


def test_category_5_adversarial_scores_only_abstentions() -> None:
    assert locomo_score("Not mentioned in the conversation", None, 5) == 1.0
    assert locomo_score("There is no information available about that.", "anything", 5) == 1.0
    assert locomo_score("NOT MENTIONED", None, 5) == 1.0
    assert locomo_score("She adopted a dog", "a dog", 5) == 0.0  # even the adversarial answer scores 0
    assert locomo_score("I don't know", None, 5) == 0.0  # other refusals are not the official wording


def test_bad_category_is_refused() -> None:
    for bad in (0, 6, True, "1"):
        with pytest.raises(ValueError, match="category must be a LoCoMo category 1..5"):
            locomo_score("x", "y", bad)


def test_memdialog_locomo_reports_the_official_score_beside_squad_f1(tmp_path: Path) -> None:
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(_tiny_locomo()), encoding="utf-8")
    env = gym.make("MemDialog-LoCoMo-v0", data_path=str(path), questions=None, conversation=0)
    env.reset(seed=0)
    questions = env.unwrapped.questions
    terminated = truncated = False
    while env.unwrapped.reading:
        env.step("<memory>m</memory>")
    answers = []
    for q in questions:
        answer = "Not mentioned in the conversation" if q.meta["category"] == 5 else q.answers[0] + "s"
        answers.append(answer)
        _, _, terminated, truncated, info = env.step(f"<answer>{answer}</answer>")
    assert terminated
    summary = info["summary"]
    expected = [locomo_score(a, q.answers[0], q.meta["category"]) for a, q in zip(answers, questions)]
    assert summary["locomo_f1_per_question"] == pytest.approx(expected)
    assert summary["locomo_f1"] == pytest.approx(sum(expected) / len(expected))
    assert summary["official_metric"] == "locomo_f1"
    assert set(summary["locomo_f1_by_type"]) == set(summary["f1_by_type"])
