"""Real-text dialog strategies (agents.scripted.strategies.text_strategies): the reader, the scripted answers, bad
constructor arguments, the served variants and LLM-driven memories against a stand-in server on 127.0.0.1 (not a
model), and the bench's per-benchmark tables. Every strategy on every dialog env with fuzzed observations:
tests/test_bad_input.py."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import gymnasium as gym
import pytest

import memenv  # noqa: F401
from agents.scripted.bench import resolve_strategy, run_bench, run_episode, strategy_name
from agents.scripted.bench.tables import format_benchmark_tables
from agents.scripted.strategies.qa_strategies import make_strategy
from agents.scripted.strategies.text_strategies import (DialogTurn, extractive_answer, make_text_strategy,
                                             read_text_observation)
from tasks.conversations import ABSTENTION_ANSWER
from tasks.longmemeval import write_synthetic_longmemeval

from conftest import _tiny_locomo
from standin_openai import standin_server

RELEASE = Path(__file__).resolve().parent / "fixtures" / "beam_release"


@pytest.fixture
def data(tmp_path: Path) -> dict[str, str]:
    locomo = tmp_path / "locomo.json"
    locomo.write_text(json.dumps(_tiny_locomo()), encoding="utf-8")
    lme = write_synthetic_longmemeval(tmp_path / "lme.json", items=3, sessions=4, turns=4, words=20)
    return {"locomo": str(locomo), "longmemeval": str(lme), "beam": str(RELEASE)}


def _env(which: str, data: dict[str, str], policy, **kwargs):
    env_id, base = {"MemDialog": ("MemDialog-v0", {}),
                    "LoCoMo": ("MemDialog-LoCoMo-v0", {"data_path": data["locomo"], "questions": 3}),
                    "BEAM": ("MemDialog-BEAM-v0", {"data_path": data["beam"], "conversation": 0, "questions": 4}),
                    "BEAM-locomo": ("MemDialog-BEAM-v0", {"dataset": "locomo", "data_path": data["locomo"],
                                                          "questions": 3}),
                    "LongMemEval": ("MemDialog-LongMemEval-v0", {"data_path": data["longmemeval"]})}[which]
    return gym.make(env_id, **{"context": policy.context, **policy.env_kwargs, **base, **kwargs})


def _play(env, policy, seed: int = 0) -> dict:
    obs, _ = env.reset(seed=seed)
    policy.reset(env.unwrapped)
    while True:
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        assert info["invocation"]["valid"], info["invocation"]["error"]
        if terminated or truncated:
            assert terminated
            return info["summary"]


# ---------------------------------------------------------------------------------------------------- reader
def test_reader_reads_both_line_forms_multiline_turns_and_questions() -> None:
    obs = ("<task>\nintro\nQuestion 1: Where?\n</task>\n<information>[session 1/2, 8 May, 2023]\n"
           "Caroline: I went to a support group.\nMelanie: Nice!\n</information>\n\n"
           "<information>[session 1/2, 8 May, 2023]\n[invalid action, state unchanged: x]\nCaroline: I went to a "
           "support group.\n</information>\n<information>[session 2/2, 2023/05/21 (Sun) 19:50] [tool calls left: 3]\n"
           "User (#2:1): Step list:\n1. Location: near work\n**Step 2: Budget**\nAssistant (#2:2): Sure.\n"
           "</information>\n<information>[question 1/1] [asked on 2023/05/28 (Sun) 19:47]\n"
           "How long did I wait?\nNow answer with <answer>...</answer>.\n</information>")
    view = read_text_observation(obs)
    assert [(t.session, t.speaker) for t in view.turns] == [(1, "Caroline"), (1, "Melanie"), (2, "User"),
                                                            (2, "Assistant")]
    assert view.turns[2].text == "Step list: 1. Location: near work **Step 2: Budget**"
    assert (view.question, view.question_index, view.question_date) == ("How long did I wait?", 1,
                                                                        "2023/05/28 (Sun) 19:47")
    assert view.questions == ["Where?"] and view.session is None


def test_extractive_answers() -> None:
    turns = [DialogTurn(1, "1:56 pm on 8 May, 2023", "Caroline", "I went to the LGBTQ support group yesterday."),
             DialogTurn(2, "9 June, 2023", "Melanie", "I painted a sunrise by the lake.")]
    assert extractive_answer("When did Caroline go to the support group?", turns) == "8 May, 2023"
    assert extractive_answer("What did Melanie paint?", turns) == "I painted a sunrise by the lake."
    assert extractive_answer("What is Oscar's favourite opera?", turns) == ABSTENTION_ANSWER
    assert extractive_answer("", turns) == ABSTENTION_ANSWER and extractive_answer("Who?", []) == ABSTENTION_ANSWER


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("name, kwargs, error, fragment", [
    ("bm25", {"k": 0}, ValueError, "k must be an int >= 1"),
    ("bm25", {"k": "3"}, TypeError, "k must be an int"),
    ("bm25", {"answer_budget": 4}, ValueError, "answer_budget must be an int >= 16"),
    ("recency-window", {"window": 0}, ValueError, "window must be an int >= 1"),
    ("recency-window", {"window": True}, TypeError, "window"),
    ("full-context", {"context_budget": 10}, ValueError, "context_budget must be an int >= 64"),
    ("full-context", {"context_budget": 1.5}, TypeError, "context_budget"),
    ("bm25", {"nonsense": 1}, TypeError, "nonsense"),
])
def test_bad_strategy_arguments_name_the_argument(name: str, kwargs: dict, error: type, fragment: str) -> None:
    for env_id in ("MemDialog-v0", "MemDialog-BEAM-v0", "MemDialog-LongMemEval-v0"):
        with pytest.raises(error, match=fragment):
            make_strategy(name, env_id, **kwargs)


@pytest.mark.parametrize("name, family, fragment", [
    ("memagent", "MemDialog", "name a served model"),
    ("selfmem", "MemDialog-BEAM", "name a served model"),
    ("selfmem+openai:m@http://127.0.0.1:9", "MemDialog", "memory-tools protocol"),
    ("telepathy+openai:m@http://127.0.0.1:9", "MemDialog", "unknown text strategy"),
    ("bm25+openai:nomodel", "MemDialog", "openai:MODEL@URL"),
    ("bm25+gpt", "MemDialog", "served model openai:MODEL@URL"),
    ("bm25", "MemQA", "dialog env families"),
])
def test_bad_strategy_names_are_refused(name: str, family: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        make_text_strategy(name, family)


def test_bench_accepts_served_text_strategies_and_refuses_others() -> None:
    assert strategy_name("bm25+openai:m@http://127.0.0.1:8000") == "bm25+openai:m@http://127.0.0.1:8000"
    assert strategy_name("bm25") == "bm25" and strategy_name("recency-window") == "recency-window"
    for bad in ("bm25+nothing", "telepathy+openai:m@http://x", "memagent"):
        with pytest.raises(argparse.ArgumentTypeError):
            strategy_name(bad)
    with pytest.raises(ValueError, match="dialog env families"):
        resolve_strategy("bm25+openai:m@http://127.0.0.1:9", "MemQA-v0")


# ---------------------------------------------------------------------------------------------------- scripted
@pytest.mark.parametrize("which", ["MemDialog", "LoCoMo", "BEAM", "LongMemEval"])
def test_scripted_text_strategies_answer_from_their_context(data, which: str) -> None:
    env_id = {"MemDialog": "MemDialog-v0", "LoCoMo": "MemDialog-LoCoMo-v0", "BEAM": "MemDialog-BEAM-v0",
              "LongMemEval": "MemDialog-LongMemEval-v0"}[which]
    peaks = {}
    for name in ("full-context", "recency-window", "bm25"):
        policy = make_strategy(name, env_id)
        summary = _play(_env(which, data, policy), policy)
        assert summary["answered"] and all(a for a in summary["answers"])
        peaks[name] = summary["peak_context_tokens"]
    assert peaks["bm25"] <= peaks["full-context"]  # the env shows bm25 only the newest session
    if which == "LongMemEval":  # the planted fact is found by retrieval
        policy = make_strategy("bm25", env_id)
        summary = _play(_env(which, data, policy), policy, seed=0)
        assert "Biscuit" in summary["answers"][0] and summary["accuracy"] == 1.0


# ---------------------------------------------------------------------------------------------------- served
def _reply(prompt: str) -> str:
    if prompt.endswith("<memory>"):
        return "The dog is called Biscuit; the user met friends.</memory>"
    if prompt.rstrip().endswith("Facts:"):
        return "- The user's dog is called Biscuit\n2. The user likes tea\nNONE"
    return "Biscuit <tag>"


@pytest.mark.parametrize("which", ["MemDialog", "LoCoMo", "BEAM", "LongMemEval"])
@pytest.mark.parametrize("kind", ["full-context", "recency-window", "bm25", "memagent"])
def test_served_answer_context_strategies(data, which: str, kind: str) -> None:
    family = {"MemDialog": "MemDialog", "LoCoMo": "MemDialog", "BEAM": "MemDialog-BEAM",
              "LongMemEval": "MemDialog-LongMemEval"}[which]
    with standin_server(_reply) as server:
        policy = make_text_strategy(f"{kind}+openai:stand-in@{server.url}", family, retries=0)
        summary = _play(_env(which, data, policy), policy)
    answers = [r for r in server.requests if "Question:" in r["prompt"] and r["prompt"].endswith("Answer:")]
    assert len(answers) == len(summary["answers"]) and all(a == "Biscuit tag" for a in summary["answers"])
    assert all(r["model"] == "stand-in" and r["stop"] == ["\n"] for r in answers)
    last = answers[-1]["prompt"]
    assert summary["questions"][-1] in last
    if kind == "memagent":  # the memory the model wrote is what the answer is asked from
        assert "The dog is called Biscuit; the user met friends." in last
        writes = [r for r in server.requests if r["prompt"].endswith("<memory>")]
        assert len(writes) == summary["sessions"]
    if which == "LongMemEval":
        assert "(asked on 2023/12/30 (Sat) 09:00)" in last


@pytest.mark.parametrize("which", ["BEAM", "BEAM-locomo", "LongMemEval"])
def test_selfmem_stores_what_the_model_writes_and_answers_from_a_search(data, which: str) -> None:
    family = "MemDialog-LongMemEval" if which == "LongMemEval" else "MemDialog-BEAM"
    with standin_server(_reply) as server:
        policy = make_text_strategy(f"selfmem+openai:stand-in@{server.url}", family, retries=0)
        env = _env(which, data, policy)
        summary = _play(env, policy)
    assert summary["store_entries"] == 2 * summary["sessions"]  # two facts per session ("NONE" dropped)
    assert all(a == "Biscuit tag" for a in summary["answers"]) and summary["answered"]
    answers = [r["prompt"] for r in server.requests if r["prompt"].endswith("Answer:")]
    assert len(answers) == len(summary["answers"])
    if which == "LongMemEval":  # "What is the name of my dog?": the search finds the stored fact
        assert "The user's dog is called Biscuit" in answers[0]


def test_served_strategy_failure_is_a_server_error_naming_the_url(data) -> None:
    from agents.llm.adapters.served import ServerError

    policy = make_text_strategy("bm25+openai:m@http://127.0.0.1:9", "MemDialog", retries=0, timeout=1.0)
    env = _env("MemDialog", data, policy)
    with pytest.raises(ServerError, match="127.0.0.1:9"):
        _play(env, policy)


def test_bench_refuses_a_served_text_strategy_whose_server_is_down(tmp_path: Path, capsys) -> None:
    from memenv.cli import main

    code = main(["bench", "--strategies", "bm25+openai:m@http://127.0.0.1:9", "--envs", "MemDialog-v0", "-n", "1",
                 "--quiet", "--out", str(tmp_path / "out")])
    assert code != 0
    assert "--strategies bm25+openai:m@http://127.0.0.1:9" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- bench
def test_bench_prints_one_table_per_benchmark_under_its_metric(data) -> None:
    envs = [f"MemDialog-LoCoMo-v0:data_path={data['locomo']!r},questions=3",
            f"MemDialog-LongMemEval-v0:data_path={data['longmemeval']!r}",
            f"MemDialog-BEAM-v0:data_path={data['beam']!r},conversation=0,questions=4", "MemDialog-v0"]
    with standin_server(_reply) as server:
        names = ["bm25", f"memagent+openai:stand-in@{server.url}"]
        summary, episodes = run_bench(names, envs, episodes=1, progress=False)
    assert summary.failed.sum() == 0
    from agents.scripted.bench import format_table

    text = format_benchmark_tables(summary, format_table)
    assert "== LoCoMo: locomo_f1 = " in text and "== LongMemEval: accuracy (judge-free) = " in text
    assert "== BEAM: beam_score (judge-free) = " in text
    blocks = text.split("\n\n")
    assert blocks[0].splitlines()[0].split()[:3] == ["env", "strategy", "episodes"]  # MemDialog-v0: no official metric
    assert "official:" not in text
    locomo = next(b for b in blocks if b.startswith("== LoCoMo"))
    assert locomo.splitlines()[1].split()[:3] == ["env", "strategy", "locomo_f1"]
    assert "locomo_f1:" in locomo.splitlines()[1]  # and per category
    assert len(locomo.splitlines()) == 4  # header line, column line, one row per strategy


def test_bench_reports_judged_beam_both_ways_and_longmemeval_with_the_official_judge_models(data) -> None:
    """A stand-in judge grades every BEAM rubric item 0.5 and accepts every LongMemEval answer: BEAM's official
    score truncates each 0.5 to 0 (no event ordering here), the float score keeps it."""
    def judge(prompt: str) -> str:
        return "0.5" if "Rubric item:" in prompt else "yes"

    with standin_server(judge) as server:
        envs = [f"MemDialog-BEAM-v0:data_path={data['beam']!r},conversation=0,questions=4,"
                f"abilities=('summarization','information_extraction'),judge='openai:gpt-4.1-mini@{server.url}'",
                f"MemDialog-LongMemEval-v0:data_path={data['longmemeval']!r},"
                f"judge='openai:gpt-4o-2024-08-06@{server.url}'"]
        summary, _ = run_bench(["bm25"], envs, episodes=1, progress=False)
    assert summary.failed.sum() == 0
    beam, lme = summary.iloc[0], summary.iloc[1]
    assert (beam["official:beam_score"], beam["official:beam_score_float"], beam["official:judged"]) == (0.0, 0.5, 1.0)
    assert (lme["official:accuracy"], lme["official:judged"]) == (1.0, 1.0)
    models = {("beam" if "Rubric item:" in r["messages"][-1]["content"] else "lme", r["model"], r["temperature"])
              for r in server.requests}
    assert models == {("beam", "gpt-4.1-mini", 0.0), ("lme", "gpt-4o-2024-08-06", 0.0)}
    from agents.scripted.bench import format_table

    text = format_benchmark_tables(summary, format_table)
    block = next(b for b in text.split("\n\n") if b.startswith("== BEAM: beam_score = "))
    assert block.splitlines()[1].split()[:4] == ["env", "strategy", "beam_score", "beam_score_float"]
    assert re.search(r" bm25 +0\.000 +0\.500 ", block.splitlines()[2])  # official, then float
    assert "== LongMemEval: accuracy = " in text and "official:" not in text


def test_served_strategies_run_concurrently_in_the_bench_with_the_sequential_results(data) -> None:
    env = f"MemDialog-LoCoMo-v0:data_path={data['locomo']!r},questions=3"
    with standin_server(lambda prompt: prompt.split("Question: ")[-1].split()[0] if "Question: " in prompt
                        else "memory") as server:
        name = f"memagent+openai:stand-in@{server.url}"
        summary, episodes = run_bench([name], [env], episodes=4, progress=False)
        policy = resolve_strategy(name, "MemDialog-LoCoMo-v0")
        assert hasattr(policy, "run_episodes")
        made = _env("LoCoMo", data, policy)
        sequential = [_play(made, policy, seed)["f1"] for seed in range(4)]
    assert summary.failed.sum() == 0
    assert list(episodes.f1) == pytest.approx(sequential)
