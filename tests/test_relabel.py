"""Relabelled demonstrations (agents/llm/training/relabel.py, issue 61): another policy plays, each view's compact
expert labels every state it reached (CompactOracle.follow keeps the expert's bookkeeping on the policy's
episode), and distill/experiment/relabel.py continues a run's teacher on them."""

from __future__ import annotations

import json

import gymnasium as gym
import pandas as pd
import pytest

import memenv  # noqa: F401 - registers the envs
from agents.scripted.strategies.compact_oracle import CompactOracle

BUDGET_4_THREE = {"hops": 1, "fresh_facts": True, "corpus_size": 400, "objectives": 3, "memory_budget": 4,
                  "max_turns": 10}


def _play(policy, env, seed: int, follow: bool) -> list[str]:
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    actions = []
    while True:
        action = policy.act(obs)
        if follow:
            policy.follow(action)
        actions.append(action)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return actions


@pytest.mark.parametrize("reads_transcript", [False, True])
def test_following_its_own_actions_changes_nothing(reads_transcript: bool) -> None:
    env = gym.make("MemQA-v0", **BUDGET_4_THREE)
    for seed in range(12):
        plain, followed = CompactOracle(reads_transcript=reads_transcript), CompactOracle(reads_transcript=reads_transcript)
        assert _play(followed, env, seed, follow=True) == _play(plain, env, seed, follow=False)
        assert followed.queries == plain.queries and followed.researched == plain.researched
        assert followed._found == plain._found and followed._final == plain._final


def test_following_another_search_undoes_its_own_and_counts_what_that_search_found() -> None:
    from memenv.protocol import format_action, parse_action

    env = gym.make("MemQA-v0", **BUDGET_4_THREE)
    obs, _ = env.reset(seed=3)
    expert = CompactOracle(reads_transcript=True)
    expert.reset(env.unwrapped)
    with pytest.raises(ValueError, match="follow\\(\\) needs an act\\(\\) first"):
        expert.follow("anything")
    own = parse_action(expert.act(obs))
    assert own.tool == "search" and expert.queries == [own.argument]
    # The policy searched the title of a document the expert plans to read later, not its first choice.
    later = [d for plan in expert.plans for d in plan.docs if d.title != own.argument][-1]
    taken = format_action("", "search", later.title)
    expert.follow(taken)
    assert expert.queries == []  # its own query was never sent
    obs, *_ = env.step(taken)
    nxt = parse_action(expert.act(obs))
    assert later.id in expert._found and later.id in expert._seen  # what the policy's search showed is known
    assert nxt.tool == "search" and nxt.argument != later.title  # and never searched again by the transcript's expert


class _ScriptedGenerations:
    """A scripted strategy dressed as an LLM policy (generate -> Generation objects), one env at a time."""

    def __init__(self, strategy, llm_policy):
        self.strategy, self.llm = strategy, llm_policy
        self.tokenizer = llm_policy.tokenizer

    def reset(self, env):
        self.strategy.reset(env)

    def encode_prompt(self, obs):
        return self.llm.encode_prompt(obs)

    def encode_action(self, action):
        return self.llm.encode_action(action)

    def generate(self, observations):
        from agents.llm.generation.policy import Generation

        out = []
        for obs in observations:
            text = self.strategy.act(obs)
            ids = self.encode_action(text)
            out.append(Generation(self.encode_prompt(obs), ids, [0.0] * len(ids), text, "stop", 1.0))
        return out


def test_relabelled_states_carry_each_views_expert_action_on_the_policys_episode() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.training.relabel import relabelled_demonstrations

    tok = memqa_tokenizer()
    llm = LLMPolicy(tiny_model(tok, seed=0), tok, temperature=0.0)
    env_fn = lambda: gym.make("MemQA-v0", **BUDGET_4_THREE)  # noqa: E731
    seeds = list(range(40, 52))
    # The student is the memory view's expert itself: every memory-view label is the action it took.
    student = _ScriptedGenerations(CompactOracle(), llm)
    out = relabelled_demonstrations(student, env_fn, seeds, num_envs=1)
    states = out.stats
    assert states.memory_agrees.all() and states.seed.nunique() == len(seeds)
    assert (states.turn.groupby(states.seed).min() == 1).all()
    # Where the memory view drops a note the transcript still holds, the transcript's expert acts otherwise.
    assert states.views_differ.any() and not states.persistent_agrees.all()
    memory = [d for d in out.data if d.action_mask is None]
    flat = [d for d in out.data if d.action_mask is not None]
    assert len(memory) == len(flat) == len(states)
    for demo, (_, row) in zip(flat, states.iterrows()):
        scored = [i for i, m in enumerate(demo.action_mask) if m]
        label = tok.decode([demo.response_ids[i] for i in scored])
        assert scored == list(range(scored[0], len(demo.response_ids)))  # the loss on the last action only
        assert ("<answer>" in label) == (row.persistent_label == "answer")
    # The transcript example of turn t holds the student's t-1 earlier actions before its label.
    first, second = flat[0], flat[1]
    assert len(second.response_ids) > len(first.response_ids)
    with pytest.raises(ValueError, match="views must name"):
        relabelled_demonstrations(student, env_fn, seeds, views=("memory", "memory"))


def test_a_transcript_demonstration_scores_only_the_turns_asked() -> None:
    pytest.importorskip("transformers")
    from llm_common import memqa_tokenizer

    from agents.llm.records.transcript import TranscriptFormat
    from agents.llm.training.sft import transcript_demonstration

    tok = memqa_tokenizer()
    fmt = TranscriptFormat(tok)
    env = gym.make("MemQA-v0", **BUDGET_4_THREE)
    obs, _ = env.reset(seed=0)
    expert = CompactOracle()
    expert.reset(env.unwrapped)
    observations, actions = [], []
    for _ in range(3):
        action = expert.act(obs)
        observations.append(obs)
        actions.append(tok.encode(action, add_special_tokens=False))
        obs, *_ = env.step(action)
    first = tok.encode("x", add_special_tokens=False)
    whole = transcript_demonstration(first, actions, observations, fmt, tok)
    last = transcript_demonstration(first, actions, observations, fmt, tok, scored=[2])
    assert whole.response_ids == last.response_ids
    assert sum(whole.action_mask) == sum(map(len, actions)) and sum(last.action_mask) == len(actions[2])
    assert last.action_mask[-len(actions[2]):] == [1] * len(actions[2])
    with pytest.raises(ValueError, match="scored turn 3 is outside the episode's 3 actions"):
        transcript_demonstration(first, actions, observations, fmt, tok, scored=[3])


def test_relabel_continues_a_runs_teacher_into_a_run_folder_the_benchmarks_read(tmp_path, capsys) -> None:
    """distill/experiment/relabel.py on a run of tiny models: the new folder holds the run's settings and start,
    the continued teacher's result (both views, both pools), the labelled states; a rerun trains nothing more;
    bad input is named."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dataclasses import replace

    from test_experiment import _tiny, _tiny_run

    from distill.experiment.relabel import main

    run, out = tmp_path / "run", tmp_path / "out"
    with pytest.raises(SystemExit):
        main(["--run", str(run), "--out", str(out)])
    assert "no experiment.json" in capsys.readouterr().err
    cfg = _tiny(run, env_kwargs={"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 3,
                                 "memory_budget": 4, "fresh_facts": True, "corpus_size": 60})
    _tiny_run(run, tmp_path, replace(cfg, teacher=replace(cfg.teacher, sft_views=("memory", "persistent"),
                                                          sft_demo_expert="compact")))
    for bad, message in ((["--out", str(run)], "--out must be another folder"), (["--out", str(out), "--episodes", "0"],
                                                                                   "--episodes and --threads >= 1")):
        with pytest.raises(SystemExit):
            main(["--run", str(run), *bad])
        assert message in capsys.readouterr().err
    args = ["--run", str(run), "--out", str(out), "--minutes", "0.02", "--episodes", "6"]
    assert main(args) == 0
    result = json.loads((out / "teacher" / "result.json").read_text())
    assert {"f1", "seen_f1", "persistent_f1", "persistent_seen_f1", "view_gap"} <= set(result)
    assert result["relabel"]["labels"]["episodes"] == 6 and result["steps"] >= 1
    assert json.loads((out / "student" / "result.json").read_text())["path"] == str(tmp_path / "student")
    assert json.loads((out / "experiment.json").read_text()) == json.loads((run / "experiment.json").read_text())
    states = pd.read_csv(out / "relabel" / "states.csv")
    assert states.seed.nunique() == 6 and states.seed.min() >= 3 * 10**7
    before = (out / "teacher" / "metrics.csv").read_text()
    assert main(args) == 0 and (out / "teacher" / "metrics.csv").read_text() == before
    # a damaged example cache is named and made again, not a traceback
    (out / "relabel" / "examples.pkl").write_bytes(b"not a pickle")
    assert main(args) == 0 and "examples.pkl unreadable" in capsys.readouterr().err
    assert pd.read_csv(out / "relabel" / "states.csv").equals(states)
