"""Gold answers and replies of every type the official files write them in (numbers, lists) score as their text;
an empty gold answer is refused at load, naming the item; an item without sessions is a clear error.

One conversion (:func:`tasks.types.answer_text`) serves every loader and scorer, so a gold ``3.0`` and a reply
``"3"`` (or ``3``) are the same text, ``"3"``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the envs
from memenv.envs.memdialog import score_answer
from memenv.scoring.beam import event_order_score, nugget_scores, score_beam_answer
from memenv.scoring.locomo import locomo_score
from memenv.scoring.longmemeval import score_longmemeval_answer
from memenv.scoring.qa import best_em_f1, exact_match, f1_score, score_objectives, split_answers
from tasks import DataFormatError, Question, answer_text
from tasks.beam import load_probing_questions
from tasks.conversations import is_abstention_answer
from tasks.corpus import load_questions_jsonl
from tasks.hotpot import load_hotpotqa
from tasks.locomo import load_locomo
from tasks.longmemeval import index_longmemeval

from conftest import TINY_HOTPOT, TINY_LONGMEMEVAL, _tiny_locomo


@pytest.mark.parametrize("value, text", [
    ("Paris", "Paris"), (3, "3"), (3.0, "3"), (-2.0, "-2"), (2.5, "2.5"), (np.int64(4), "4"), (np.float64(7.0), "7"),
    ([1, "b", 2.0], "1, b, 2"), (None, ""), (1e16, "10000000000000000"),
])
def test_answer_text_writes_numbers_as_a_person_would(value, text):
    assert answer_text(value) == text


@pytest.mark.parametrize("value, error, words", [
    (True, TypeError, "got bool"), ({"a": 1}, TypeError, "got dict"), (float("nan"), ValueError, "finite"),
    ([1, {}], TypeError, "got dict"),
])
def test_answer_text_refuses_what_is_no_answer(value, error, words):
    with pytest.raises(error, match=words):
        answer_text(value)


# ---------------------------------------------------------------------------------------------------- loaders

def _longmemeval(tmp_path: Path, **changes) -> str:
    item = {**copy.deepcopy(TINY_LONGMEMEVAL[0]), **changes}
    if item["haystack_sessions"] == []:
        item["haystack_dates"], item["haystack_session_ids"] = [], []
    path = tmp_path / "lme.json"
    path.write_text(json.dumps([item]), encoding="utf-8")
    return str(path)


def test_a_longmemeval_number_answer_scores_the_reply_that_says_it(tmp_path):
    path = _longmemeval(tmp_path, answer=3.0, question="How many dogs do I have?")
    assert index_longmemeval(path)[0].answer == "3"
    env = gym.make("MemDialog-LongMemEval-v0", data_path=path, memory_mode="tools")
    env.reset(seed=0)
    for _ in range(2):
        env.step("<next/>")
    *_, info = env.step("<answer>3</answer>")
    assert info["summary"]["score"] == 1.0  # kept as "3.0" it scored 0


@pytest.mark.parametrize("answer", ["", "   ", None])
def test_an_empty_longmemeval_answer_is_refused_naming_the_item(tmp_path, answer):
    with pytest.raises(DataFormatError, match=r"lme\.json: item 0 \(t1\): answer: empty answer"):
        index_longmemeval(_longmemeval(tmp_path, answer=answer))


def test_a_longmemeval_answer_of_another_type_is_refused_naming_it(tmp_path):
    with pytest.raises(DataFormatError, match=r"item 0 \(t1\): answer: .*got bool"):
        index_longmemeval(_longmemeval(tmp_path, answer=True))


@pytest.mark.parametrize("answer", [["Biscuit", "Pepper"], ["Biscuit"], []])
def test_a_list_as_a_longmemeval_or_locomo_answer_is_refused_naming_the_record(tmp_path, answer):
    """Before: a list was joined by ", " ("Biscuit, Pepper") and scored silently; both formats have one answer
    per question, so a list is a damaged record."""
    with pytest.raises(DataFormatError, match=r"lme\.json: item 0 \(t1\): answer: an answer must be a string or a "
                                              r"number, got list"):
        index_longmemeval(_longmemeval(tmp_path, answer=answer))
    with pytest.raises(DataFormatError, match=r"lme\.json"):  # the env too, at make
        gym.make("MemDialog-LongMemEval-v0", data_path=_longmemeval(tmp_path, answer=answer))
    for key, category in (("answer", 1), ("answer", 5), ("adversarial_answer", 5)):
        data = _tiny_locomo()
        qa = data[0]["qa"][0]
        qa["category"] = category
        qa[key] = answer
        path = tmp_path / "locomo.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(DataFormatError, match=rf"locomo\.json: record 0.*qa\[0\]\.{key}: an answer must be "
                                                  r"a string or a number, got list"):
            load_locomo(path)
    assert answer_text(["a", 2]) == "a, 2"  # where lists are answers (BEAM's event ordering) they still are


def test_a_longmemeval_item_without_sessions_is_a_clear_error(tmp_path):
    path = _longmemeval(tmp_path, haystack_sessions=[], answer_session_ids=[])
    with pytest.raises(DataFormatError, match=r"item 0 \(t1\): haystack_sessions is empty"):
        index_longmemeval(path)
    with pytest.raises(DataFormatError, match="haystack_sessions is empty"):  # at make, not a StopIteration at reset
        gym.make("MemDialog-LongMemEval-v0", data_path=path)


def test_locomo_number_answers_are_their_text_and_empty_ones_are_refused(tmp_path):
    data = _tiny_locomo()
    data[0]["qa"][0]["answer"] = 2022.0
    data[0]["qa"][1]["answer"] = 7
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    questions = load_locomo(path)[0].questions
    assert [q.answers[0] for q in questions[:2]] == ["2022", "7"]
    data[0]["qa"][1]["answer"] = "  "
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"qa\[1\]\.answer: empty answer"):
        load_locomo(path)


def test_beam_references_of_numbers_and_lists_and_empty_ones(tmp_path):
    path = tmp_path / "probing_questions.json"
    path.write_text(json.dumps({
        "information_extraction": [{"question": "How many sisters?", "answer": 2.0}],
        "event_ordering": [{"question": "Order?", "answer": ["woke up", "ate lunch"]}],
    }), encoding="utf-8")
    extraction, ordering = load_probing_questions(path)
    assert extraction.answers == ("2",)
    assert ordering.answers == ("woke up\nate lunch",) and ordering.meta["order"] == ["woke up", "ate lunch"]
    path.write_text(json.dumps({"information_extraction": [{"question": "How many?", "answer": ""}]}),
                    encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"information_extraction\[0\]: answer: empty answer"):
        load_probing_questions(path)


def test_question_files_take_number_answers_and_refuse_empty_and_odd_ones(tmp_path):
    path = tmp_path / "questions.jsonl"

    def load(answers):
        path.write_text(json.dumps({"id": "q1", "question": "How many?", "answers": answers}) + "\n",
                        encoding="utf-8")
        return load_questions_jsonl(path)

    assert load([3.0, "", "three"])[0].answers == ("3", "three")
    assert load(12)[0].answers == ("12",)
    with pytest.raises(DataFormatError, match="no non-empty gold answer"):
        load(["", "  "])
    with pytest.raises(DataFormatError, match=r"answers\[1\]: .*got dict"):
        load(["3", {"x": 1}])


def test_hotpotqa_number_answer(tmp_path):
    data = copy.deepcopy(TINY_HOTPOT)
    data[0]["answer"] = 1976.0
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert load_hotpotqa(path).questions[0].answers == ("1976",)


def test_a_question_with_an_empty_gold_answer_cannot_be_built():
    with pytest.raises(ValueError, match="question 'q': gold answer 1 is ' '"):
        Question("q", "How many?", ("3", " "))


# ---------------------------------------------------------------------------------------------------- scorers

def test_every_scorer_takes_a_number_reply_as_its_text():
    assert f1_score(3, "3") == exact_match(3.0, "3") == 1.0
    assert best_em_f1(3, 3.0) == (1.0, 1.0)  # a bare number gold is one alias
    assert score_objectives([3, "Paris"], [["3"], ["Paris"]])["f1_mean"] == 1.0
    assert split_answers(5, 2) == ["5", ""]
    assert locomo_score(3.0, 3, 2) == 1.0  # str(3.0) was "3.0", normalised to "30": F1 0
    assert locomo_score(2022, "2022", 4) == 1.0
    lme = Question("t", "How many dogs?", ("2",), kind="single-session-user", meta={})
    assert score_longmemeval_answer(2, lme)["score"] == 1.0
    beam = Question("b", "How many sisters?", ("2",), kind="information_extraction",
                    meta={"ability": "information_extraction", "rubric": ["2"]})
    assert score_beam_answer(2.0, beam)["score"] == 1.0
    assert nugget_scores(7, ["7"]) == [1.0]
    zero = Question("z", "How many cats?", ("0",), kind="counting", meta={})
    assert score_answer(0, zero) == (1.0, 1.0)  # `prediction or ""` made the reply 0 no answer
    assert is_abstention_answer(3) is False
    assert event_order_score(["woke up", "ate lunch"], ["woke up", "ate lunch"]) == 1.0
    assert event_order_score(["ate lunch", "woke up"], ["woke up", "ate lunch"]) == 0.0
