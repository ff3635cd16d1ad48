"""Horizon scaling: the MemQA-N*-v0 variants and ``memenv bench --sweep`` (table, CSV, PNG)."""

from __future__ import annotations

import contextlib
import io

import gymnasium as gym
import pandas as pd
import pytest

import memenv  # noqa: F401 - registers the environments
from agents.scripted.bench import Sweep, run_sweep
from memenv.cli import main
from memenv.registration import ENVIRONMENTS

SWEEP_VALUES = (1, 2, 8)
STRATEGIES = ("relevance", "keep-all", "history")


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_registered_horizon_variants(n):
    env_id = f"MemQA-N{n}-v0"
    assert env_id in ENVIRONMENTS
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    assert env.unwrapped.objectives == n
    assert len(info["questions"]) == n
    assert f"Question {n}:" in obs and f"Question {n + 1}:" not in obs
    env.close()


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    argv = ["bench", "--sweep", "objectives=" + ",".join(map(str, SWEEP_VALUES)), "--strategies", *STRATEGIES,
            "-n", "4", "--out", str(out), "--quiet"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    return out, stdout.getvalue()


def test_sweep_writes_csv_with_columns(sweep_run):
    out, _ = sweep_run
    table = pd.read_csv(out / "sweep.csv")
    assert list(table.columns) == ["env", "strategy", "objectives", "episodes", "failed", "f1", "em", "peak_context_tokens",
                                   "total_context_tokens", "invocations", "invalid_rate", "steps_per_s"]
    assert len(table) == len(SWEEP_VALUES) * len(STRATEGIES)
    assert set(table.env) == {"MemQA-v0"}
    assert sorted(set(table.objectives)) == list(SWEEP_VALUES)
    assert set(table.strategy) == set(STRATEGIES)
    assert (table.episodes == 4).all()
    episodes = pd.read_csv(out / "sweep_episodes.csv")
    assert len(episodes) == 4 * len(table)
    assert {"env", "strategy", "objectives", "seed", "f1", "peak_context_tokens"} <= set(episodes.columns)
    # atomic writes leave no temporary files behind
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "cells", "sweep.csv", "sweep.png", "sweep_episodes.csv"]
    assert len(list((out / "cells").iterdir())) == len(table)  # one file per finished cell, for a resume


def test_sweep_writes_png(sweep_run):
    out, _ = sweep_run
    data = (out / "sweep.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_sweep_prints_both_tables(sweep_run):
    _, printed = sweep_run
    assert "MemQA-v0: f1 vs objectives" in printed
    assert "MemQA-v0: peak_context_tokens vs objectives" in printed
    for name in STRATEGIES:
        assert name in printed


def test_memory_strategies_keep_context_nearly_constant(sweep_run):
    """MEM1's claim in miniature: history's peak context grows with N, a rewritten memory's barely does.

    Measured (4 episodes): history x8.8 from N=1 to N=8, relevance x1.6-1.8, keep-all x2.1-2.3.
    """
    out, _ = sweep_run
    table = pd.read_csv(out / "sweep.csv")
    peak = table.pivot(index="objectives", columns="strategy", values="peak_context_tokens")
    growth = peak.loc[8] / peak.loc[1]
    assert growth["history"] > 3.0
    assert growth["relevance"] < 2.5
    assert growth["keep-all"] < growth["history"] / 2
    assert (peak.loc[8, "history"] > 4 * peak.loc[8, ["relevance", "keep-all"]]).all()
    # and the compact memories do not buy that with accuracy
    f1 = table.pivot(index="objectives", columns="strategy", values="f1")
    assert (f1.loc[8, ["relevance", "keep-all"]] >= 0.9).all()


def test_sweep_applies_to_every_env_spec_and_keeps_its_kwargs():
    table, rows = run_sweep(["relevance"], ["MemQA-v0:objectives=2", "MemQA-v0:objectives=2,top_k=5"],
                            "context_budget=150,100000", episodes=2, progress=False)
    assert list(table.env) == ["MemQA-v0:objectives=2"] * 2 + ["MemQA-v0:objectives=2,top_k=5"] * 2
    assert list(table.context_budget) == [150, 100000, 150, 100000]
    assert (table.peak_context_tokens[table.context_budget == 150] <= 150).all()
    assert len(rows) == 8


def test_sweep_parse():
    assert Sweep.parse("objectives=1,2,4") == Sweep("objectives", (1, 2, 4))
    assert Sweep.parse("hops=(1,2),(2,3)").values == ((1, 2), (2, 3))
    assert Sweep.parse("context=memory,history").values == ("memory", "history")
    assert Sweep.parse("objectives=1,1,2").values == (1, 2)
    for bad in ("objectives", "=1,2", "objectives=", "not a key=1"):
        with pytest.raises(ValueError):
            Sweep.parse(bad)
    with pytest.raises(ValueError, match="clashes"):
        run_sweep(["relevance"], ["MemQA-v0"], "f1=1,2", episodes=1, progress=False)


def test_sweep_figure_reads_true_at_a_glance():
    """Token counts on a log axis with readable ticks, peak context from zero (a drop drawn to scale), and lines
    that coincide named in the panel and drawn apart (own line style, smaller marker each)."""
    import matplotlib.pyplot as plt

    from agents.scripted.bench import coinciding, sweep_figure, tick_label

    assert [tick_label(v) for v in (16, 1000, 128000, 1000000, 10000000, 2500000)] == \
        ["16", "1K", "128K", "1M", "10M", "2.5M"]
    assert coinciding({"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [0.5, 1.0], "d": [0.5, 1.0], "e": [0.0, 0.0]}) == \
        [["a", "b"], ["c", "d"]]
    rows = []
    for tokens, rag_peak in ((128_000, 2585.0), (1_000_000, 2170.0), (10_000_000, 2165.0)):
        for name, score, peak in (("oracle", 0.975, 2165.0), ("relevance", 0.975, 2170.0), ("rag", 0.2, rag_peak)):
            rows.append({"env": "MemDialog-BEAM-v0", "strategy": name, "chat_tokens": tokens, "score": score,
                         "f1": score, "peak_context_tokens": peak})
    fig = sweep_figure(pd.DataFrame(rows), "chat_tokens")
    try:
        score_ax, peak_ax = fig.axes[:2]
        for ax in (score_ax, peak_ax):
            assert ax.get_xscale() == "log"
            assert [t.get_text() for t in ax.get_xticklabels()] == ["128K", "1M", "10M"]
        assert peak_ax.get_ylim()[0] == 0 and peak_ax.get_ylim()[1] >= 2585
        assert score_ax.get_title() == "MemDialog-BEAM-v0\nsame line: oracle = relevance"
        assert peak_ax.get_title() == "MemDialog-BEAM-v0"  # no two peak lines are the same
        lines = score_ax.get_lines()
        assert len({line.get_linestyle() for line in lines}) == 3
        assert lines[0].get_markersize() > lines[1].get_markersize() > lines[2].get_markersize()
    finally:
        plt.close(fig)
