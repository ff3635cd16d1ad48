"""MemQA's memory-tools protocol (``memory_mode="tools"``), its scripted strategies, and the bench around them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import memenv  # noqa: F401 - registers the envs
from agents.scripted import make_strategy
from agents.scripted.bench import bench_env_kwargs, env_accepts, run_bench, EnvSpec
from agents.scripted.strategies.qa_strategies import env_family
from agents.scripted.strategies.qa_tool_strategies import QAToolOraclePolicy, QAToolRagPolicy, shown_documents
from memenv.memory_tools import MemoryStore


def _tools_env(**kwargs):
    env = gym.make("MemQA-v0", memory_mode="tools", objectives=1, **kwargs)
    obs, _ = env.reset(seed=3)
    return env, obs


def _memory(obs: str) -> str:
    return obs[obs.index("<memory>\n") + 9:obs.index("\n</memory>")]


def test_rewrite_stays_the_default_protocol():
    env = gym.make("MemQA-v0", objectives=1)
    obs, _ = env.reset(seed=3)
    assert "<memory>\n\n</memory>" in obs and "[store:" not in obs
    _, _, _, _, info = env.step("<mem_add>x</mem_add>")
    assert not info["invocation"]["valid"] and "store_entries" not in info["invocation"]
    _, _, _, _, info = env.step("<memory>kept</memory><search>x</search>")
    assert info["invocation"]["valid"] and info["invocation"]["memory_after"] == "kept"


def test_store_calls_edit_the_store_shown_in_the_memory_block():
    env, obs = _tools_env()
    assert _memory(obs) == "[store: 0 entries, 0/no limit tokens]"
    assert "<mem_add>text</mem_add>" in obs and "Question 1:" in obs
    obs, _, _, _, info = env.step("<mem_add>Wigei is a city in Wubuxora.</mem_add>")
    assert info["invocation"]["tool_output"] == "added entry 1 (6 tokens)"
    assert _memory(obs) == "[store: 1 entries, 6/no limit tokens]\n[1] Wigei is a city in Wubuxora."
    obs, _, _, _, _ = env.step("<mem_add>Tarsk is a river town.</mem_add>")
    obs, _, _, _, info = env.step("<mem_update id=1>Wigei lies in Wubuxora.</mem_update>")
    assert "[1] Wigei lies in Wubuxora.\n[2] Tarsk is a river town." in obs
    assert info["invocation"]["memory_before"].endswith("[2] Tarsk is a river town.")
    obs, _, _, _, info = env.step("<mem_search>river town</mem_search>")
    assert info["invocation"]["retrieved_entries"] == [2]
    assert obs.rstrip().endswith("[result] [2] Tarsk is a river town.\n</information>")
    obs, _, _, _, _ = env.step("<mem_delete id=1/>")
    assert _memory(obs) == "[store: 1 entries, 5/no limit tokens]\n[2] Tarsk is a river town."
    assert env.unwrapped.store.entries == {2: "Tarsk is a river town."}


def test_corpus_search_stays_shown_while_the_store_is_edited():
    env, _ = _tools_env()
    query = env.unwrapped.questions[0].question
    obs, _, _, _, info = env.step(f"<search>{query}</search>")
    docs = shown_documents(obs)
    assert len(docs) == 3 and info["invocation"]["retrieved_ids"] == [d.id for d in env.unwrapped.retrieve(query)]
    obs, _, _, _, _ = env.step("<mem_add>note</mem_add>")
    assert shown_documents(obs) == docs and "[result] added entry 1 (1 tokens)" in obs
    obs, _, _, _, _ = env.step("<search>Tarsk</search>")
    assert "[result]" not in obs  # a new search result replaces the old one and the store call's result


def test_hidden_store_shows_its_size_and_the_newest_hits_only():
    env, _ = _tools_env(show_store=False, search_k=1)
    env.step("<mem_add>alpha beta</mem_add>")
    env.step("<mem_add>beta gamma</mem_add>")
    obs, _, _, _, info = env.step("<mem_search>beta</mem_search>")
    assert _memory(obs) == "[store: 2 entries, 4/no limit tokens]"
    assert len(info["invocation"]["retrieved_entries"]) == 1  # search_k=1
    assert obs.count("[1] alpha beta") + obs.count("[2] beta gamma") == 1


@pytest.mark.parametrize("action, error", [
    ("<memory>m</memory><search>x</search>", "exactly one tool call per action, got 2"),
    ("<mem_delete id=9/>", "no entry 9 (the store is empty)"),
    ("<mem_update id=x>t</mem_update>", "id must be a non-negative integer"),
    ("<mem_add>" + "w " * 40 + "</mem_add>", "store full: 0/30 tokens used, this needs 40 more"),
    ("<search></search>", "<search>: empty query"),
    ("<next/>", "<next> is not available now"),
    ("plain text", "text outside the tool tags"),
    (7, "action must be a string"),
])
def test_invalid_calls_use_the_turn_and_change_nothing(action, error):
    env, _ = _tools_env(memory_budget=30)
    env.step("<mem_add>kept entry</mem_add>")
    env.step("<mem_delete id=1/>")  # the store is empty again, ids go on from 2
    obs2, reward, terminated, truncated, info = env.step(action)
    snapshot = info["invocation"]
    assert not snapshot["valid"] and error in snapshot["error"] and "invalid action, state unchanged" in obs2
    assert env.unwrapped.store.entries == {} and snapshot["memory_before"] == snapshot["memory_after"]
    assert _memory(obs2) == "[store: 0 entries, 0/30 tokens]" and "[result] deleted entry 1" in obs2
    assert f"[turns left: {env.unwrapped.max_turns - 3}]" in obs2 and not (terminated or truncated) and reward == 0.0


def test_answer_scores_and_ends_the_episode():
    env, _ = _tools_env()
    gold = env.unwrapped.questions[0].answers[0]
    _, reward, terminated, _, info = env.step(f"<answer>{gold}</answer>")
    assert terminated and reward == 1.0 and info["invocation"]["answer_f1"] == [1.0]
    summary = info["summary"]
    assert summary["memory_mode"] == "tools" and summary["store_entries"] == 0 and summary["f1"] == 1.0


def test_default_turn_limit_pays_for_one_call_per_stored_document():
    rewrite = gym.make("MemQA-v0", objectives=2, hops=2, top_k=3).unwrapped
    tools = gym.make("MemQA-v0", objectives=2, hops=2, top_k=3, memory_mode="tools").unwrapped
    assert (rewrite.max_turns - 2) * (3 + 3) == tools.max_turns - 2
    assert gym.make("MemQA-v0", memory_mode="tools", max_turns=5).unwrapped.max_turns == 5


def test_tools_strategy_family_follows_the_memory_mode():
    assert env_family("MemQA-v0") == "MemQA" and env_family("MemQA-v0", "tools") == "MemQA:tools"
    assert env_family("MemDialog-BEAM-v0", "tools") == "MemDialog-BEAM"  # no separate tools family there
    assert isinstance(make_strategy("rag", "MemQA-v0", memory_mode="tools"), QAToolRagPolicy)
    assert isinstance(make_strategy("oracle", "MemQA-v0", "tools"), QAToolOraclePolicy)
    with pytest.raises(ValueError, match="unknown strategy 'rag' for MemQA-v0: choose from oracle, keep-all"):
        make_strategy("rag", "MemQA-v0")
    with pytest.raises(ValueError, match="'history' for MemQA-v0 with memory_mode='tools': choose from oracle, rag"):
        make_strategy("history", "MemQA-v0", "tools")


def _episode(name: str, seed: int, **kwargs) -> tuple[dict, list[dict]]:
    env = gym.make("MemQA-v0", memory_mode="tools", **kwargs)
    policy = make_strategy(name, "MemQA-v0", "tools")
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    steps = []
    while True:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        steps.append(info["invocation"])
        if terminated or truncated:
            return info["summary"], steps


@pytest.mark.parametrize("show_store", [True, False])
def test_oracle_reaches_f1_one_storing_exactly_the_supporting_documents(show_store):
    for seed in range(4):
        summary, steps = _episode("oracle", seed, objectives=2, show_store=show_store)
        assert summary["f1"] == 1.0 and summary["invalid_actions"] == 0
        env = gym.make("MemQA-v0", memory_mode="tools", objectives=2).unwrapped
        env.reset(seed=seed)
        titles = {env.document(d).title for q in env.questions for d in q.supporting_ids}
        added = [s["tool_input"] for s in steps if s["tool"] == "mem_add"]
        assert sorted(a.partition(": ")[0] for a in added) == sorted(titles)
        assert summary["store_entries"] == len(titles)


def test_oracle_in_a_tight_store_skips_what_does_not_fit_and_never_acts_invalidly():
    summary, steps = _episode("oracle", 0, objectives=4, memory_budget=40)
    assert summary["invalid_actions"] == 0 and summary["store_tokens"] <= 40
    assert 0.0 < summary["f1"] < 1.0  # some evidence did not fit: those questions get "unknown"


def test_rag_stores_every_result_and_answers_from_store_searches():
    scores = []
    for seed in range(4):
        summary, steps = _episode("rag", seed, objectives=2, show_store=False)
        scores.append(summary["f1"])
        assert summary["invalid_actions"] == 0
        searches = [i for i, s in enumerate(steps) if s["tool"] == "search"]
        adds = [s for s in steps if s["tool"] == "mem_add"]
        assert len(adds) == summary["store_entries"] and len(adds) >= len(searches)  # every result stored
        hits = [s for s in steps if s["tool"] == "mem_search" and s["retrieved_entries"]]
        assert hits and steps[-2]["tool"] == "mem_search"  # it answers from what the store returned
    assert np.mean(scores) > 0


def test_rag_with_a_full_store_evicts_the_oldest_entry():
    summary, steps = _episode("rag", 0, objectives=1, memory_budget=30)
    deleted = [s["entry_id"] for s in steps if s["tool"] == "mem_delete"]
    added = [s["entry_id"] for s in steps if s["tool"] == "mem_add"]
    assert deleted and deleted == added[:len(deleted)] and summary["invalid_actions"] == 0


def test_bench_runs_the_tools_strategies_on_memqa():
    summary, rows = run_bench(["oracle", "rag"], ["MemQA-v0:memory_mode=tools"], episodes=3, progress=False)
    f1 = dict(zip(summary.strategy, summary.f1))
    assert f1["oracle"] == 1.0 and 0.0 < f1["rag"] <= 1.0
    assert (summary.invalid_rate == 0).all() and set(rows.env) == {"MemQA-v0:memory_mode=tools"}


# ------------------------------------------------------------------------- the bench keeps no snapshots

def test_bench_turns_snapshots_off_only_where_the_env_takes_the_kwarg_and_the_spec_is_silent():
    policy = make_strategy("relevance", "MemDialog-v0")
    assert env_accepts("MemDialog-v0", "keep_snapshots") and not env_accepts("MemQA-v0", "keep_snapshots")
    assert bench_env_kwargs(EnvSpec("MemDialog-v0"), policy)["keep_snapshots"] is False
    assert bench_env_kwargs(EnvSpec("MemDialog-v0", {"keep_snapshots": True}), policy)["keep_snapshots"] is True
    assert "keep_snapshots" not in bench_env_kwargs(EnvSpec("MemQA-v0"), make_strategy("relevance"))


def test_bench_results_are_unchanged_without_snapshots(monkeypatch):
    made = []
    real_make = gym.make

    def spy(env_id, **kwargs):
        env = real_make(env_id, **kwargs)
        made.append(env)
        return env

    monkeypatch.setattr("agents.scripted.bench.run.gym.make", spy)
    specs = ["MemDialog-v0:sessions=2,questions=3", "MemDialog-v0:sessions=2,questions=3,keep_snapshots=True"]
    summary, rows = run_bench(["relevance", "keep-all"], specs, episodes=2, progress=False)
    assert [env.unwrapped.keep_snapshots for env in made] == [False, False, True, True]
    assert [len(env.unwrapped._snapshots) > 0 for env in made] == [False, False, True, True]  # noqa: SLF001
    columns = [c for c in summary.columns if c not in ("env", "steps_per_s")]
    off, on = (summary[summary.env == EnvSpec.parse(s).label][columns].reset_index(drop=True) for s in specs)
    assert off.equals(on)
    row_columns = [c for c in rows.columns if c != "env"]
    off, on = (rows[rows.env == EnvSpec.parse(s).label][row_columns].reset_index(drop=True) for s in specs)
    assert off.equals(on) and len(off) == 4
