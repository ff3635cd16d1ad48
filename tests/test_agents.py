"""Tests for the scripted memory strategies (agents/scripted/strategies/qa_strategies.py) and the text reader
(agents/scripted/strategies/world_reader.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the envs
from agents.scripted.strategies.world_reader import (
    Chain,
    ComparisonPlan,
    facts_in,
    parse_fact,
    parse_question,
    read_observation,
    sentences,
)
from agents.scripted.strategies.qa_strategies import STRATEGIES, OraclePolicy, RelevancePolicy, make_strategy
from tasks.world import COMPARISONS, DISTRACTOR_SENTENCES, RELATIONS, World, build_world

NON_ORACLE = sorted(name for name in STRATEGIES if name != "oracle")


def _mean_f1(name: str, seeds, run_episode, **env_kwargs) -> float:
    policy = make_strategy(name)
    env = gym.make("MemQA-v0", context=policy.context, **env_kwargs)
    scores = [run_episode(env, policy, seed)[1]["summary"]["f1"] for seed in seeds]
    return float(np.mean(scores))


# ---------------------------------------------------------------------------------------------- oracle


@pytest.mark.parametrize("kwargs", [{}, {"objectives": 4}, {"hops": 3}, {"hops": 4}])
def test_oracle_is_perfect(kwargs: dict, run_episode) -> None:
    env = gym.make("MemQA-v0", **kwargs)
    for seed in range(20):
        policy = OraclePolicy()
        infos, final = run_episode(env, policy, seed)
        episode = final["summary"]
        assert episode["f1"] == 1.0 and episode["em"] == 1.0, seed
        assert episode["invalid_actions"] == 0
        # Its evidence is always found on the synthetic world: one search per supporting document, by title,
        # in task order (documents a search already brought in are skipped), and no failed search.
        titles = [env.unwrapped.document(d).title for q in env.unwrapped.questions for d in q.supporting_ids]
        searches = [i["invocation"]["tool_input"] for i in infos if i["invocation"]["tool"] == "search"]
        assert searches == policy.queries and len(searches) <= len(titles)
        assert searches == [t for t in dict.fromkeys(titles) if t in searches]
        assert policy.evidence_complete and all(policy.supported)
        assert "Failed searches" not in final["invocation"]["memory_after"]
        assert episode["turns"] <= env.unwrapped.max_turns


def test_oracle_needs_the_env() -> None:
    policy = OraclePolicy()
    with pytest.raises(ValueError, match="reset"):
        policy.reset(None)
    env = gym.make("MemQA-v0")
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="reset"):
        OraclePolicy().act(obs)


# ---------------------------------------------------------------------------------------------- purity


@pytest.mark.parametrize("name", NON_ORACLE)
def test_strategies_are_pure_functions_of_the_observation(name: str) -> None:
    policy = make_strategy(name)
    env = gym.make("MemQA-v0", objectives=3, context=policy.context)
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        # No reset(env): these strategies must not need the env at all.
        while True:
            action = policy.act(obs)
            assert policy.act(obs) == action  # same observation, same action
            assert make_strategy(name).act(obs) == action  # no hidden state carried between calls
            obs, _, terminated, truncated, info = env.step(action)
            assert info["invocation"]["valid"], info["invocation"]["error"]
            if terminated or truncated:
                break


def test_make_strategy_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="nope"):
        make_strategy("nope")


# ---------------------------------------------------------------------------------------------- quality


@pytest.mark.parametrize("name", ["keep-all", "relevance", "history"])
def test_memory_strategies_solve_the_default_task(name: str, run_episode) -> None:
    assert _mean_f1(name, range(10), run_episode) >= 0.8


def test_last_observation_fails_the_default_task(run_episode) -> None:
    assert _mean_f1("last-observation", range(10), run_episode) < 0.3


def test_design_ordering_under_a_context_budget(run_episode) -> None:
    kwargs = {"objectives": 16, "context_budget": 1000}
    f1 = {name: _mean_f1(name, range(4), run_episode, **kwargs)
          for name in ("relevance", "keep-all", "history", "last-observation")}
    assert f1["relevance"] >= f1["history"] + 0.3, f1
    assert f1["keep-all"] >= f1["history"] + 0.3, f1
    assert f1["history"] > f1["last-observation"], f1
    tighter = {"objectives": 16, "context_budget": 800}
    assert _mean_f1("relevance", range(4), run_episode, **tighter) >= _mean_f1("keep-all", range(4), run_episode, **tighter)


def test_peak_context_compact_memory_vs_history(run_episode) -> None:
    """MEM1's point: compact memory keeps the peak context far below the growing transcript."""
    peaks = {}
    for name in ("relevance", "history"):
        policy = make_strategy(name)
        env = gym.make("MemQA-v0", objectives=8, context=policy.context)
        peaks[name] = np.mean([run_episode(env, policy, s)[1]["summary"]["peak_context_tokens"] for s in range(3)])
    assert peaks["history"] > 2 * peaks["relevance"], peaks


# ---------------------------------------------------------------------------------------------- memory shape


@pytest.mark.parametrize("budget", [40, 80])
def test_relevance_memory_within_budget(budget: int, run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=3)
    for seed in range(6):
        infos, _ = run_episode(env, RelevancePolicy(memory_budget=budget), seed)
        for info in infos:
            assert len(info["invocation"]["memory_after"].split()) <= budget


def test_relevance_memory_within_small_budget(run_episode) -> None:
    # Regression: answer lines used to be kept even past the budget.
    env = gym.make("MemQA-v0", objectives=4)
    for seed in range(5):
        infos, _ = run_episode(env, RelevancePolicy(memory_budget=5), seed)
        for info in infos:
            assert len(info["invocation"]["memory_after"].split()) <= 5


def test_keep_all_memory_is_monotone(run_episode) -> None:
    env = gym.make("MemQA-v0", objectives=4)
    grew = 0
    for seed in range(8):
        infos, _ = run_episode(env, make_strategy("keep-all"), seed)
        for info in infos:
            inv = info["invocation"]
            before, after = facts_in(inv["memory_before"]), facts_in(inv["memory_after"])
            assert before.items() <= after.items()
            assert set(sentences(inv["memory_before"])) <= set(sentences(inv["memory_after"]))
            grew += len(after) > len(before)
    assert grew > 8


# ---------------------------------------------------------------------------------------------- reader


def _names(world: World, kind: str, n: int = 3) -> list[str]:
    """A few names of a kind, preferring multi-word ones (look-alikes, work titles with "of")."""
    names = sorted((e.name for e in world.entities.values() if e.kind == kind), key=lambda s: (-len(s.split()), s))
    return names[:n]


def test_parse_question_round_trips_world_questions() -> None:
    world = build_world()
    rng = np.random.default_rng(0)
    for hops in (1, 2, 3, 4):
        for kind in ("bridge", "comparison"):
            for _ in range(40):
                q = world.sample_question(rng, hops, kind)
                plan = parse_question(q.question)
                facts = q.meta["facts"]
                if kind == "bridge":
                    assert plan == Chain(q.meta["start"], tuple(q.meta["chain"])), q.question
                else:
                    side_a, side_b = facts[:hops], facts[hops:]
                    assert plan == ComparisonPlan(
                        q.meta["attribute"],
                        Chain(side_a[0][0], tuple(f[1] for f in side_a[:-1])),
                        Chain(side_b[0][0], tuple(f[1] for f in side_b[:-1])),
                    ), q.question


@pytest.mark.parametrize("relation", sorted(RELATIONS))
def test_parse_question_every_template(relation: str) -> None:
    world = build_world()
    rel = RELATIONS[relation]
    inner_chains = [(), ("works_for",), ("created_by", "born_in")]
    for start in _names(world, rel.source) + _names(world, "work", 1):
        for inner in inner_chains:
            x = World.noun_phrase(start, [RELATIONS[r] for r in inner])
            for template in rel.questions:
                assert parse_question(template.format(x=x)) == Chain(start, inner + (relation,)), template


@pytest.mark.parametrize("attribute", sorted(COMPARISONS))
def test_parse_question_every_comparison(attribute: str) -> None:
    world = build_world()
    comp = COMPARISONS[attribute]
    a_start, b_start = _names(world, "work", 2)
    for inner_a, inner_b in [((), ()), (("created_by",), ("founded_by", "works_for"))]:
        a = World.noun_phrase(a_start, [RELATIONS[r] for r in inner_a])
        b = World.noun_phrase(b_start, [RELATIONS[r] for r in inner_b])
        assert parse_question(comp.question.format(a=a, b=b)) == ComparisonPlan(
            attribute, Chain(a_start, inner_a), Chain(b_start, inner_b))


def test_parse_question_rejects_other_language() -> None:
    for text in ("What is the meaning of life?", "Who wrote the Iliad?", "", "Question 1: hello"):
        assert parse_question(text) is None


@pytest.mark.parametrize("relation", sorted(RELATIONS))
def test_parse_fact_every_sentence_template(relation: str) -> None:
    world = build_world()
    rel = RELATIONS[relation]
    objects = _names(world, rel.target) if rel.target else ["1987", "452013"]
    for subject in _names(world, rel.source):
        for obj in objects:
            for template in rel.sentences:
                sentence = template.format(s=subject, o=obj)
                assert parse_fact(sentence) == (subject, relation, obj), sentence


def test_parse_fact_ignores_distractors() -> None:
    world = build_world()
    a, b = _names(world, "person", 2)
    for template in DISTRACTOR_SENTENCES:
        sentence = template.format(s=a, e=b, y=1977, topic="tin mining")
        assert parse_fact(sentence) is None, sentence
    assert parse_fact("") is None
    assert parse_fact("Doc 1 (Title: X) nothing") is None


def test_sentences_and_facts_in_search_results() -> None:
    env = gym.make("MemQA-v0")
    env.reset(seed=0)
    target = env.unwrapped.questions[0].supporting_ids[0]
    doc = env.unwrapped.document(target)
    _, _, _, _, info = env.step(f"<memory>m</memory><search>{doc.title}</search>")
    output = info["invocation"]["tool_output"]
    assert "Doc 1 (Title:" in output
    found = facts_in(output)
    entity = build_world().entities[target]
    for relation, value in entity.facts.items():
        assert found[(entity.name, relation)] == build_world().value_text(value)
    assert not any(s.startswith("Doc ") for s in sentences(output))


def test_read_observation() -> None:
    env = gym.make("MemQA-v0", objectives=3)
    obs, _ = env.reset(seed=1)
    view = read_observation(obs)
    assert view.questions == [q.question for q in env.unwrapped.questions]
    assert view.memory == "" and view.turns_left == env.unwrapped.max_turns
    obs, *_ = env.step("<memory>line one\nline two</memory><search>capital</search>")
    view = read_observation(obs)
    assert view.memory == "line one\nline two"
    assert view.turns_left == env.unwrapped.max_turns - 1
    assert "Doc 1 (Title:" in view.information
