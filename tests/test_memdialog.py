"""MemDialog-v0: synthetic conversations, question types, abstention scoring, protocol, scripted strategies."""

from __future__ import annotations

import datetime as dt
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memenv  # noqa: F401 - registers the environments
from agents.scripted.strategies.reading_strategies import DIALOG_STRATEGIES, DialogReader, dated_lines
from agents.scripted.strategies.qa_strategies import make_strategy
from memenv.envs.memdialog import MemDialogEnv, score_answer
from tasks.conversations import (
    ABSTENTION_ANSWER,
    QUESTION_TYPES,
    generate_conversation,
    is_abstention_answer,
    sample_questions,
)
from tasks.types import Question

EPISODE_KEYS = {
    "f1", "em", "f1_sum", "em_sum", "f1_mean", "em_mean", "f1_per_objective", "em_per_objective", "answers",
    "gold", "turns", "peak_context_tokens", "total_context_tokens", "invalid_actions", "snapshots",
    "f1_by_type", "em_by_type", "count_by_type", "question_types", "answered", "sessions",
}


def roll(env, policy, seed):
    obs, _ = env.reset(seed=seed)
    policy.reset(env)
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        if terminated or truncated:
            return info["summary"]


def test_check_env_and_defaults():
    env = gym.make("MemDialog-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    assert env.unwrapped.sessions == 8 and env.unwrapped.n_questions == 5 and env.unwrapped.memory_budget == 256


def test_determinism_per_seed():
    a, b = MemDialogEnv(), MemDialogEnv()
    obs_a, info_a = a.reset(seed=5)
    obs_b, info_b = b.reset(seed=5)
    assert obs_a == obs_b and info_a["questions"] == info_b["questions"]
    assert a.conversation.sessions == b.conversation.sessions
    for _ in range(3):
        assert a.step("<memory>k</memory>")[0] == b.step("<memory>k</memory>")[0]
    _, info_c = a.reset(seed=6)
    assert a.conversation.sessions != b.conversation.sessions
    c1 = generate_conversation(np.random.default_rng(3))
    c2 = generate_conversation(np.random.default_rng(3))
    assert c1 == c2


@pytest.mark.parametrize("seed", range(5))
def test_generator_question_types_and_knowledge_update(seed):
    conv = generate_conversation(np.random.default_rng(seed), sessions=6)
    kinds = {q.kind for q in conv.questions}
    assert kinds == set(QUESTION_TYPES)
    session_of = {t.dia_id: s.index for s in conv.sessions for t in s.turns}
    for q in conv.questions:
        for dia_id in q.supporting_ids:
            assert conv.turn(dia_id) is not None
        if q.kind == "knowledge-update":
            old_id, new_id = q.supporting_ids
            assert session_of[old_id] < session_of[new_id]
            assert q.answers[0] != q.meta["old_value"]
            assert q.answers[0] in conv.turn(new_id).text and q.meta["old_value"] in conv.turn(old_id).text
        if q.kind == "abstention":
            assert q.answers == (ABSTENTION_ANSWER,) and q.meta["abstention"] and not q.supporting_ids
        if q.kind == "temporal" and not q.meta.get("order"):
            day = dt.date.fromisoformat(q.meta["date"])
            session_day = dt.datetime.strptime(
                next(s.date for s in conv.sessions if s.index == session_of[q.supporting_ids[0]]), "%d %B %Y").date()
            assert 0 <= (session_day - day).days <= 1
    # Five questions drawn stratified cover the five types.
    picked = sample_questions(np.random.default_rng(seed), conv, 5)
    assert {q.kind for q in picked} == set(QUESTION_TYPES)


def test_reader_answers_every_synthetic_question_from_the_full_conversation():
    reader = DialogReader()
    for seed in range(3):
        conv = generate_conversation(np.random.default_rng(seed))
        text = "\n".join(f"[session {s.index}/{len(conv.sessions)}, {s.date}]\n" + "\n".join(t.render() for t in s.turns)
                         for s in conv.sessions)
        lines = dated_lines(text)
        for q in conv.questions:
            assert score_answer(reader.answer(q.question, lines), q) == (1.0, 1.0), q


def test_abstention_scoring():
    abst = Question("a", "What is the name of Ava's cat?", (ABSTENTION_ANSWER,), meta={"abstention": True})
    fact = Question("f", "What is Ava's job?", ("nurse",), meta={"abstention": False})
    adversarial_with_answer = Question("n", "Is Oscar Ava's pet?", (ABSTENTION_ANSWER, "No"), meta={"abstention": True})
    assert score_answer(ABSTENTION_ANSWER, abst) == (1.0, 1.0)
    assert score_answer("Not mentioned.", abst) == (1.0, 1.0)
    assert score_answer("No information available", abst) == (1.0, 1.0)
    assert score_answer("Whiskers", abst) == (0.0, 0.0)
    assert score_answer("", abst) == (0.0, 0.0)
    assert score_answer(ABSTENTION_ANSWER, fact) == (0.0, 0.0)
    assert score_answer("a nurse", fact) == (1.0, 1.0)
    assert score_answer("no", adversarial_with_answer) == (1.0, 1.0)
    assert is_abstention_answer("It is NOT mentioned in the conversation!")


def test_protocol_questions_one_per_turn_and_per_type_scores():
    env = MemDialogEnv(sessions=3)
    obs, info = env.reset(seed=0)
    assert "[session 1/3," in obs and "Question 5:" in obs
    _, _, _, _, step = env.step("<memory>m</memory><answer>x</answer>")  # no answering while reading
    assert not step["invocation"]["valid"] and "after the last session" in step["invocation"]["error"]
    for i in range(3):
        obs, _, terminated, _, step = env.step(f"<memory>s{i}</memory>")
        assert step["invocation"]["valid"] and not terminated
    assert "[question 1/5]" in obs and env.questions[0].question in obs
    _, _, _, _, step = env.step("<memory>m</memory>")  # a memory-only action is not an answer
    assert not step["invocation"]["valid"]
    rewards = []
    for j, q in enumerate(env.questions):
        obs, reward, terminated, truncated, step = env.step(f"<answer>{q.answers[0]}</answer>")
        rewards.append(reward)
        assert step["invocation"]["answer_f1"] == [1.0] and terminated == (j == 4)
    episode = step["summary"]
    assert EPISODE_KEYS <= set(episode)
    assert rewards[-1] == 1.0 and rewards[:-1] == [0.0] * 4
    assert episode["f1"] == 1.0 and episode["invalid_actions"] == 2 and episode["turns"] == 10
    assert set(episode["f1_by_type"]) == set(QUESTION_TYPES) == set(episode["count_by_type"])
    assert episode["answered"]


def test_per_type_scores_reflect_answers():
    env = MemDialogEnv(sessions=3)
    env.reset(seed=1)
    for _ in range(3):
        env.step("<memory></memory>")
    for q in env.questions:
        answer = q.answers[0] if q.kind == "abstention" else "wrong"
        *_, info = env.step(f"<answer>{answer}</answer>")
    episode = info["summary"]
    assert episode["f1_by_type"]["abstention"] == 1.0
    assert all(v == 0.0 for k, v in episode["f1_by_type"].items() if k != "abstention")
    assert episode["f1"] == pytest.approx(1 / 5)


def test_truncation_and_budget():
    env = MemDialogEnv(sessions=2, max_turns=3, memory_budget=4)
    env.reset(seed=0)
    _, _, _, _, step = env.step("<memory>a b c d e f</memory>")
    assert step["invocation"]["memory_after"] == "a b c d" and step["invocation"]["memory_truncated_tokens"] == 2
    env.step("<memory>x</memory>")
    _, reward, terminated, truncated, step = env.step("<answer>foo</answer>")
    assert truncated and not terminated and not step["summary"]["answered"]
    assert step["summary"]["questions_answered"] == 1 and reward == 0.0


def test_questions_after_reading_and_history_mode():
    env = MemDialogEnv(sessions=2, questions_upfront=False)
    obs, _ = env.reset(seed=0)
    assert "Question 1:" not in obs
    env = MemDialogEnv(sessions=2, context="history")
    obs, _ = env.reset(seed=0)
    obs, _, _, _, step = env.step("")
    assert step["invocation"]["valid"] and "[session 1/2," in obs and "[session 2/2," in obs


def test_scripted_strategies_order():
    scores = {}
    for name in DIALOG_STRATEGIES:
        policy = make_strategy(name, "MemDialog-v0")
        env = MemDialogEnv(context=policy.context)
        scores[name] = np.mean([roll(env, policy, seed)["f1"] for seed in range(8)])
    assert scores["oracle"] == 1.0
    assert scores["relevance"] >= scores["keep-all"] > scores["last-observation"]
    assert scores["history"] == 1.0


_ENV = None


def fuzz_env() -> MemDialogEnv:
    global _ENV
    if _ENV is None:
        _ENV = MemDialogEnv(sessions=2, questions=2, max_turns=6)
    return _ENV


TAGGED = st.lists(st.sampled_from(["<memory>", "</memory>", "<answer>", "</answer>", "<think>", "</think>",
                                   "<search>", "x", " ", "\n", "\x00", "🙂"]), max_size=12).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(st.one_of(st.text(max_size=40), TAGGED), min_size=1, max_size=8))
def test_arbitrary_action_text_never_raises(actions):
    env = fuzz_env()
    env.reset(seed=0)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        assert isinstance(info["invocation"]["valid"], bool)
        if terminated or truncated:
            assert set(info["summary"]["f1_by_type"]) <= set(QUESTION_TYPES)
            env.reset(seed=0)
