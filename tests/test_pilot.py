"""The powered run's pilot (distill.experiment.pilot): its preset, and the plan read from its files: the length by
the pre-registered flattening rule, the seeds by a power analysis on the seed-level SD of MemOPD minus the
control, paired by episode."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from distill.experiment.pilot import PILOT, format_plan, pilot_config, pilot_plan
from distill.stats import minimum_detectable_effect, seeds_for_power

ARMS = ("rl", "memopd", "teacher_persistent", "constant")


def _pilot_files(out, seeds=4, episodes=50, shift=None, rising=False):
    """A finished pilot's files: probe curves every 20 updates to 240 (flat after 100, or rising to the end), end
    evaluations on the same episodes per arm and seed (MemOPD = control + shift[seed] on every episode)."""
    shift = shift if shift is not None else [0.01, 0.03, -0.01, 0.02][:seeds]
    rng = np.random.default_rng(0)
    (out).mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps({"arms": list(ARMS), "seeds": seeds, "updates": 240}))
    base = rng.uniform(0, 0.6, size=episodes)
    for arm in ARMS:
        for s in range(seeds):
            run = out / "arms" / arm / f"seed{s}"
            run.mkdir(parents=True)
            points = range(20, 241, 20)
            f1 = [min(u, 100) / 200 + 0.001 * s if not rising else u / 400 for u in points]
            pd.DataFrame({"update": list(points), "probe_f1": f1}).to_csv(run / "probe_curve.csv", index=False)
            f1_end = base + (shift[s] if arm == "memopd" else 0.0)
            order = np.arange(episodes)[::-1] if arm == "memopd" else np.arange(episodes)  # rows in another order
            pd.DataFrame({"seed": 10_000_000 + order, "f1": f1_end[order],
                          "em": 0.0}).to_csv(run / "end_eval.csv", index=False)
    return base, shift


def test_the_plan_reads_the_length_from_the_probe_curves_and_the_seeds_from_the_paired_sd(tmp_path):
    base, shift = _pilot_files(tmp_path / "pilot")
    plan = pilot_plan(tmp_path / "pilot")
    assert plan["updates"] == 100 and plan["flat"]
    assert plan["pilot_difference_per_seed"] == pytest.approx(shift)
    sd = float(np.std(shift, ddof=1))
    assert plan["seed_sd"] == pytest.approx(sd)
    assert plan["control_end_f1"] == pytest.approx(base.mean())
    assert plan["paper_effect"] == pytest.approx(0.07 * base.mean())
    assert plan["seeds"] == seeds_for_power(0.07 * base.mean(), sd) and plan["seeds"] >= 16
    assert plan["mde_16"] == pytest.approx(minimum_detectable_effect(sd, 16))
    saved = json.loads((tmp_path / "pilot" / "pilot_plan.json").read_text())
    assert saved["updates"] == 100 and saved["seeds"] == plan["seeds"]
    assert "train 100 updates (flat" in format_plan(plan)


def test_curves_still_rising_are_said_and_an_unfinished_pilot_is_named(tmp_path):
    _pilot_files(tmp_path / "a", rising=True)
    plan = pilot_plan(tmp_path / "a")
    assert plan["updates"] == 240 and not plan["flat"] and "still rising" in format_plan(plan)
    _pilot_files(tmp_path / "b")
    (tmp_path / "b" / "arms" / "teacher_persistent" / "seed2" / "end_eval.csv").unlink()
    with pytest.raises(ValueError, match="seed2/end_eval.csv is missing"):
        pilot_plan(tmp_path / "b")
    frame = pd.read_csv(tmp_path / "b" / "arms" / "memopd" / "seed1" / "end_eval.csv")
    frame.assign(seed=frame.seed + 1).to_csv(tmp_path / "b" / "arms" / "memopd" / "seed1" / "end_eval.csv", index=False)
    with pytest.raises(ValueError, match="other episodes"):
        pilot_plan(tmp_path / "b")
    _pilot_files(tmp_path / "c", shift=[0.02, 0.02, 0.02, 0.02])  # no spread: no seed count to size
    plan = pilot_plan(tmp_path / "c")
    assert plan["seeds"] is None and plan["seed_sd"] == 0 and "n/a" in format_plan(plan)
    assert math.isnan(plan["mde_16"])


def test_the_pilot_preset_is_the_powered_regime_with_probe_curves_and_fixed_rates(tmp_path):
    from distill.experiment.config import powered_config

    cfg, powered = pilot_config(str(tmp_path)), powered_config(str(tmp_path))
    assert (cfg.env_kwargs, cfg.teacher, cfg.student, cfg.arms) == (powered.env_kwargs, powered.teacher,
                                                                     powered.student, powered.arms)
    assert cfg.probe_curve and cfg.updates == 240 and cfg.curve_every == 20 and cfg.seeds == PILOT["seeds"]
    from distill.experiment.baselines import swept

    assert swept(cfg) == [] and cfg.rl_lr == 1e-4  # no sweep in the pilot: provisional rates


@pytest.mark.parametrize("argv,word", [(["--pilot"], "add --powered"), (["--powered", "--pilot", "--plateau"],
                                                                        "give one of them")])
def test_pilot_flag_is_refused_where_it_means_nothing(argv, word, tmp_path, capsys):
    from memenv.cli import main

    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["experiment", "memopd", "--out", str(tmp_path / "o"), *argv]))
    assert exc.value.code == 2 and word in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
