"""MemRead-v0: streamed long documents, chunk protocol, memory budget, determinism, scripted strategies."""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memenv  # noqa: F401 - registers the environments
from agents.scripted.strategies.reading_strategies import READ_STRATEGIES
from agents.scripted.strategies.qa_strategies import make_strategy
from memenv.envs.memread import MemReadEnv
from tasks.documents import plan_long_document, token_counts
from tasks.types import Document

EPISODE_KEYS = {
    "f1", "em", "f1_sum", "em_sum", "f1_mean", "em_mean", "f1_per_objective", "em_per_objective", "answers",
    "gold", "turns", "peak_context_tokens", "total_context_tokens", "invalid_actions", "snapshots", "doc_tokens",
    "chunks", "answered",
}
_HEADER = re.compile(r"^Doc (\d+) \(Title: ([^)\n]*)\) ?", re.MULTILINE)


def small_env(**kwargs) -> MemReadEnv:
    return MemReadEnv(**{"doc_tokens": 2000, "corpus_size": 300, **kwargs})


def roll(env, policy, seed):
    obs, _ = env.reset(seed=seed)
    policy.reset(env)
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        if terminated or truncated:
            return info["summary"], reward


def test_check_env_and_registration():
    env = gym.make("MemRead-v0", doc_tokens=2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    assert env.unwrapped.memory_budget == 256 and env.unwrapped.chunk_tokens == 512
    assert env.unwrapped.objectives == 1


def test_same_seed_same_episode_and_other_seed_differs():
    a, b = small_env(), small_env()
    obs_a, info_a = a.reset(seed=7)
    obs_b, info_b = b.reset(seed=7)
    assert obs_a == obs_b and info_a["questions"] == info_b["questions"]
    assert np.array_equal(a.plan.paragraphs, b.plan.paragraphs)
    for _ in range(3):
        step_a, step_b = a.step("<memory>x</memory>"), b.step("<memory>x</memory>")
        assert step_a[0] == step_b[0]
    a.reset(seed=8)
    b.reset(seed=7)
    assert not np.array_equal(a.plan.paragraphs, b.plan.paragraphs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunks_reassemble_to_a_document_with_every_gold_doc(seed):
    env = small_env(objectives=2, chunk_tokens=256)
    _, info = env.reset(seed=seed)
    chunks = list(env.iter_chunks())
    assert len(chunks) == info["chunks"] == env.plan.n_chunks
    sizes = [len(c.split()) for c in chunks]
    assert max(sizes) <= 256
    assert sum(sizes) == info["doc_tokens"] >= 2000
    assert info["doc_tokens"] < 2000 + max(len(d.text.split()) + 20 for d in env.documents)
    text = "\n".join(chunks)
    numbers = [int(m.group(1)) for m in _HEADER.finditer(text)]
    assert numbers == list(range(1, len(numbers) + 1))  # every paragraph once, in order
    gold = {d for q in env.questions for d in q.supporting_ids}
    assert gold
    for doc_id in gold:
        doc = env.document(doc_id)
        assert text.count(f"(Title: {doc.title}) {doc.text}") == 1
    for doc_id, chunk in zip(env.plan.gold_indices, env.plan.gold_chunks):
        assert env.documents[int(doc_id)].text in chunks[chunk]


def test_long_paragraphs_are_split_at_word_boundaries():
    docs = [Document(f"d{i}", f"T{i}", " ".join(f"w{i}_{k}" for k in range(100))) for i in range(5)]
    header, text = token_counts(docs)
    plan = plan_long_document(np.random.default_rng(0), header, text, [2], doc_tokens=300, chunk_tokens=40)
    chunks = list(plan.iter_chunks(docs))
    assert all(len(c.split()) <= 40 for c in chunks)
    # The pieces of each paragraph, headers removed, give back its text.
    pieces: dict[int, list[str]] = {}
    for chunk in chunks:
        m = _HEADER.match(chunk)
        pieces.setdefault(int(m.group(1)), []).append(chunk[m.end():])
    for position, parts in pieces.items():
        assert " ".join(parts) == docs[int(plan.paragraphs[position - 1])].text
    assert sum(len(c.split()) for c in chunks) == plan.total_tokens


def test_million_token_plan_is_indices_only():
    env = MemReadEnv(doc_tokens=1_000_000, keep_snapshots=False)
    _, info = env.reset(seed=0)
    assert info["doc_tokens"] >= 1_000_000 and info["chunks"] > 1500
    assert env.plan.paragraphs.nbytes < 200_000  # int32 per paragraph, no text
    obs = None
    for _ in range(5):
        obs, *_ , step_info = env.step("<memory>m</memory>")
        assert step_info["invocation"]["valid"]
    assert f"[chunk 6/{info['chunks']}]" in obs
    assert env._snapshots == []  # noqa: SLF001 - nothing accumulates with keep_snapshots=False


def test_protocol_answer_phase_and_episode_info():
    env = small_env()
    obs, info = env.reset(seed=3)
    n = info["chunks"]
    assert "[chunk 1/" in obs and "Question 1:" in obs
    for i in range(n):
        obs, reward, terminated, truncated, step = env.step(f"<memory>note {i}</memory>")
        assert step["invocation"]["valid"] and step["invocation"]["chunk"] == i and not terminated
    assert "[document finished" in obs and "<memory>\nnote %d\n</memory>" % (n - 1) in obs
    obs, _, terminated, _, step = env.step("<memory>more</memory>")  # a memory-only action is not an answer
    assert not terminated and not step["invocation"]["valid"] and "answer" in step["invocation"]["error"]
    gold = env.questions[0].answers[0]
    obs, reward, terminated, truncated, step = env.step(f"<answer>{gold}</answer>")
    assert terminated and not truncated and reward == 1.0
    episode = step["summary"]
    assert EPISODE_KEYS <= set(episode)
    assert episode["turns"] == n + 2 and episode["invalid_actions"] == 1 and episode["answered"]
    assert episode["answers"] == [gold] and episode["chunks"] == n and len(episode["snapshots"]) == n + 2
    assert episode["peak_context_tokens"] == max(s["context_tokens"] for s in episode["snapshots"])


def test_early_answer_ends_and_truncation_scores_zero():
    env = small_env()
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<memory>m</memory><answer>nothing</answer>")
    assert terminated and info["summary"]["chunks_read"] == 0 and reward == 0.0
    env = small_env(max_turns=3)
    env.reset(seed=0)
    for _ in range(2):
        assert not env.step("<memory>m</memory>")[3]
    _, reward, terminated, truncated, info = env.step("<memory>m</memory>")
    assert truncated and not terminated and reward == 0.0 and info["summary"]["f1"] == 0.0
    assert not info["summary"]["answered"]


def test_invalid_action_repeats_the_chunk():
    env = small_env()
    obs0, _ = env.reset(seed=1)
    obs1, _, _, _, info = env.step("no tags at all")
    assert not info["invocation"]["valid"] and "[chunk 1/" in obs1 and "invalid action" in obs1
    assert env.chunk(0) in obs1
    obs2, _, _, _, info = env.step("")  # memory mode: the memory must be rewritten
    assert not info["invocation"]["valid"]
    obs3, *_ = env.step("<memory></memory>")
    assert "[chunk 2/" in obs3


def test_memory_budget_enforced():
    env = small_env(memory_budget=10)
    env.reset(seed=0)
    words = " ".join(f"w{i}" for i in range(50))
    obs, _, _, _, info = env.step(f"<memory>{words}</memory>")
    assert info["invocation"]["memory_after"] == " ".join(f"w{i}" for i in range(10))
    assert info["invocation"]["memory_truncated_tokens"] == 40
    assert "w9" in obs and "w10" not in obs
    assert "at most 10 tokens" in obs


def test_keep_snapshots_false_and_history_mode_blank_actions():
    env = small_env(keep_snapshots=False)
    env.reset(seed=0)
    policy = make_strategy("oracle", "MemRead-v0")
    obs, _ = env.reset(seed=0)
    policy.reset(env)
    while True:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        assert "invocation" in info
        if terminated or truncated:
            break
    assert info["summary"]["snapshots"] == [] and info["summary"]["f1"] == 1.0

    env = small_env(context="history")
    obs, info = env.reset(seed=0)
    obs, _, _, _, step = env.step("")
    assert step["invocation"]["valid"] and "[chunk 1/" in obs and "[chunk 2/" in obs


def test_oracle_is_perfect_and_last_observation_is_worse():
    scores = {}
    for name in ("oracle", "relevance", "keep-all", "last-observation"):
        policy = make_strategy(name, "MemRead-v0")
        env = MemReadEnv(doc_tokens=4000, context=policy.context)
        scores[name] = np.mean([roll(env, policy, seed)[0]["f1"] for seed in range(8)])
    assert scores["oracle"] == 1.0
    assert scores["last-observation"] < scores["keep-all"] <= scores["relevance"]
    assert set(READ_STRATEGIES) == {"oracle", "keep-all", "relevance", "last-observation", "history"}


def test_history_strategy_reads_the_transcript():
    policy = make_strategy("history", "MemRead-v0")
    env = small_env(context="history")
    episode, _ = roll(env, policy, 0)
    assert episode["f1"] == 1.0 and episode["peak_context_tokens"] > 2000


def test_hotpot_source(hotpot_path):
    env = MemReadEnv(data_path=hotpot_path, doc_tokens=300, chunk_tokens=64)
    _, info = env.reset(seed=0)
    text = "\n".join(env.iter_chunks())
    for doc_id in env.questions[0].supporting_ids:
        assert env.document(doc_id).text in text
    episode, reward = roll(env, make_strategy("oracle", "MemRead-v0"), 0)
    assert reward == 1.0


def test_bad_kwargs():
    for kwargs in ({"doc_tokens": 0}, {"chunk_tokens": 8}, {"objectives": 0}, {"max_turns": 0}, {"dataset": "hotpotqa"}):
        with pytest.raises(ValueError):
            MemReadEnv(**kwargs)


_ENV = None


def fuzz_env() -> MemReadEnv:
    global _ENV
    if _ENV is None:
        _ENV = small_env(max_turns=6)
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
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        assert isinstance(info["invocation"]["valid"], bool)
        if terminated or truncated:
            assert "summary" in info
            env.reset(seed=0)
