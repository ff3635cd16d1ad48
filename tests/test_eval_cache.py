"""A stage's greedy evaluation written with its key (distill.experiment.evaluation.evaluate_per_seed(cache=...)): an
interrupted stage resumes after the evaluations it finished, and rows are reused only for the same weights,
episodes, view and settings."""

import json

import pandas as pd
import pytest

from tests.llm_common import TINY_BASE_ENV


@pytest.fixture(scope="module")
def tiny():
    from agents.llm.models.local import make_tiny

    return make_tiny(None, env_kwargs=TINY_BASE_ENV, episodes=8, vocab_size=400, hidden_size=32, layers=2, heads=2)


def _cfg(out):
    from distill.experiment.config import ExperimentConfig

    return ExperimentConfig(out=str(out), env_kwargs=dict(TINY_BASE_ENV), max_new_tokens=8, num_envs=2,
                            progress=False)


def _no_rollouts(monkeypatch):
    import agents.llm.records.rollouts as rollouts

    def refuse(*a, **k):
        raise AssertionError("played the episodes again")

    monkeypatch.setattr(rollouts, "rollout", refuse)


def test_a_finished_evaluation_is_read_back_and_only_for_its_own_key(tiny, tmp_path, monkeypatch):
    import torch

    from distill.experiment.evaluation import evaluate_per_seed

    lm, tok = tiny
    cfg, csv = _cfg(tmp_path), tmp_path / "end_eval.csv"
    rows = evaluate_per_seed(lm, tok, cfg, seeds=[0, 1, 2], pool="heldout", cache=csv)
    key = json.loads(csv.with_suffix(".key.json").read_text())
    assert key["seeds"] == [0, 1, 2] and key["pool"] == "heldout" and key["view"] == "memory"
    pd.testing.assert_frame_equal(pd.read_csv(csv, keep_default_na=False, dtype={"questions": str}), rows)

    with monkeypatch.context() as m:  # the same call: the rows come back without a rollout, equal
        _no_rollouts(m)
        pd.testing.assert_frame_equal(evaluate_per_seed(lm, tok, cfg, seeds=[0, 1, 2], pool="heldout", cache=csv),
                                      rows)
        for changed in (dict(seeds=[0, 1]), dict(seeds=[0, 1, 2], pool="train"),
                        dict(seeds=[0, 1, 2], view="persistent")):
            with pytest.raises(AssertionError, match="played the episodes again"):
                evaluate_per_seed(lm, tok, cfg, cache=csv, **{"pool": "heldout", **changed})
        with pytest.raises(AssertionError, match="played the episodes again"):  # another token cap
            cfg.max_new_tokens = 9
            evaluate_per_seed(lm, tok, cfg, seeds=[0, 1, 2], pool="heldout", cache=csv)
        cfg.max_new_tokens = 8
        with torch.no_grad():  # other weights, by one float of one tensor
            p = next(lm.parameters())
            p.view(-1)[0] += 1e-3
        try:
            with pytest.raises(AssertionError, match="played the episodes again"):
                evaluate_per_seed(lm, tok, cfg, seeds=[0, 1, 2], pool="heldout", cache=csv)
        finally:
            with torch.no_grad():
                p.view(-1)[0] -= 1e-3


def test_rows_without_their_key_or_with_a_damaged_key_are_evaluated_again(tiny, tmp_path, monkeypatch):
    from distill.experiment.evaluation import evaluate_per_seed

    lm, tok = tiny
    cfg, csv = _cfg(tmp_path), tmp_path / "start_eval.csv"
    rows = evaluate_per_seed(lm, tok, cfg, seeds=[3, 4], pool="heldout", cache=csv)
    key = csv.with_suffix(".key.json")
    for damage in (lambda: key.unlink(), lambda: key.write_text("{not json")):
        damage()
        with monkeypatch.context() as m:
            _no_rollouts(m)
            with pytest.raises(AssertionError, match="played the episodes again"):
                evaluate_per_seed(lm, tok, cfg, seeds=[3, 4], pool="heldout", cache=csv)
        again = evaluate_per_seed(lm, tok, cfg, seeds=[3, 4], pool="heldout", cache=csv)  # greedy: the same rows
        pd.testing.assert_frame_equal(again, rows)
        assert json.loads(key.read_text())["seeds"] == [3, 4]


def test_a_cache_is_reused_only_when_it_holds_exactly_the_rows_asked_for(tiny, tmp_path, monkeypatch, capsys):
    """Issue 64: a cached CSV cut short, emptied, holding other seeds' rows or a damaged score is never returned for
    the seeds asked: it is evaluated again, with a warning naming the file; the rows asked for come back."""
    from distill.experiment.evaluation import evaluate_per_seed

    lm, tok = tiny
    cfg, csv = _cfg(tmp_path), tmp_path / "end_eval.csv"
    rows = evaluate_per_seed(lm, tok, cfg, seeds=[5, 6, 7], pool="heldout", cache=csv)
    good = csv.read_text()
    lines = good.splitlines(keepends=True)
    damages = {
        "cut short": "".join(lines[:-1]),
        "empty": "",
        "other seeds": good.replace("\n5,", "\n9,", 1),
    }
    header = lines[0].strip().split(",")
    first = lines[1].strip().split(",")
    first[header.index("f1")] = "7.5"
    damages["a score outside [0, 1]"] = lines[0] + ",".join(first) + "\n" + "".join(lines[2:])
    for name, text in damages.items():
        csv.write_text(text)
        capsys.readouterr()
        with monkeypatch.context() as m:
            _no_rollouts(m)
            with pytest.raises(AssertionError, match="played the episodes again"):
                evaluate_per_seed(lm, tok, cfg, seeds=[5, 6, 7], pool="heldout", cache=csv)
        again = evaluate_per_seed(lm, tok, cfg, seeds=[5, 6, 7], pool="heldout", cache=csv)
        assert f"{csv}:" in capsys.readouterr().err, name
        pd.testing.assert_frame_equal(again, rows)
