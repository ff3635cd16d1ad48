"""The fair-evidence experiment's parts (issue 45): GRPO alone's learning-rate sweep on train-pool probes, the
equal-CPU SFT arms (continued SFT on oracle demonstrations; sequence-level distillation on the teacher's episodes),
the warm-up reaching every GRPO arm, the teacher measured acting in both views, and the preset."""

import json

import pandas as pd
import pytest

from distill.experiment.config import (FAIR_ARMS, SFT_ARMS, ExperimentConfig, ModelSpec, fair_config)


def _tiny(out, **kw):
    base = dict(out=str(out), env_kwargs={"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 2},
                teacher=ModelSpec(hidden=32, layers=1, heads=2, sft_steps=3, sft_minutes=None, sft_episodes=4,
                                  sft_views=("memory", "persistent")),
                student=ModelSpec(hidden=16, layers=1, heads=2, sft_steps=2, sft_minutes=None, sft_episodes=4),
                student_max_steps=2, probe_episodes=2, sft_threads=1, arms=("rl", "memopd", "sft_continued", "seqkd"),
                vocab=400, tokenizer_episodes=8, seeds=1, updates=2, tasks_per_update=1, group_size=2,
                eval_episodes=3, seen_eval_episodes=2, curve_every=1, curve_episodes=2, max_new_tokens=10,
                num_envs=2, threads=1, workers=1, timing_rounds=1, diagnose_episodes=2, progress=False,
                warmup_updates=2, rl_lr_sweep=(1e-3, 3e-3), sweep_seeds=1)
    return ExperimentConfig(**{**base, **kw})


def test_fair_preset_and_its_checks(tmp_path):
    cfg = fair_config(str(tmp_path))
    assert cfg.arms == FAIR_ARMS and cfg.seeds >= 10 and cfg.warmup_updates > 0 and len(cfg.rl_lr_sweep) >= 3
    assert cfg.teacher.sft_views == ("memory", "persistent") and cfg.env_kwargs["fresh_facts"]
    assert set(SFT_ARMS) == {"sft_continued", "seqkd"}
    with pytest.raises(ValueError, match="equal_cpu_arm"):
        _tiny(tmp_path, arms=("rl", "sft_continued"))
    with pytest.raises(ValueError, match="equal_cpu_arm must be a GRPO-trained arm"):
        _tiny(tmp_path, equal_cpu_arm="seqkd")
    with pytest.raises(ValueError, match="sft_views"):
        _tiny(tmp_path, teacher=ModelSpec(sft_views=("flat",)))
    with pytest.raises(ValueError, match="rl_lr_sweep"):
        _tiny(tmp_path, rl_lr_sweep=(0.0,))


def test_cli_fair_flag_refuses_other_presets(tmp_path, capsys):
    from memenv.cli import main

    for extra in (["--quick"], ["--world", "fixed"]):
        assert main(["experiment", "memopd", "--fair", "--out", str(tmp_path / "x"), *extra]) == 2
        assert "--fair is the fresh world's fair-evidence preset" in capsys.readouterr().err


@pytest.mark.slow  # an end-to-end miniature: ~1-2 min on a loaded 2-core machine
def test_cli_fair_run_settings_reach_the_config(tmp_path, monkeypatch):
    """The fair run's command (docs/results.md): SFT at 1 thread (a CPU-minute budget buys more steps there), arms
    in 2 processes of 1 thread each."""
    import distill.experiment.cli as cli
    from memenv.cli import main

    seen = []

    def capture(cfg, until=None):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(cli, "run_experiment", capture)
    with pytest.raises(SystemExit):
        main(["experiment", "memopd", "--fair", "--out", str(tmp_path / "x"), "--sft-threads", "1", "--workers", "2",
              "--threads", "1", "--quiet"])
    cfg = seen[0]
    assert (cfg.sft_threads, cfg.workers, cfg.threads) == (1, 2, 1)
    assert cfg.arms == FAIR_ARMS and cfg.teacher.sft_views == ("memory", "persistent")


def test_miniature_fair_run_sweep_warmup_and_equal_cpu_sft_arms(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from distill.experiment.run import run_experiment
    from distill.experiment.baselines import SFT_ARM_SEED_BASE

    cfg = _tiny(tmp_path / "exp")
    out = tmp_path / "exp"
    run_experiment(cfg)
    teacher = json.loads((out / "teacher" / "result.json").read_text())
    for key in ("persistent_f1", "persistent_f1_se", "persistent_seen_f1", "view_gap"):
        assert key in teacher
    held = pd.read_csv(out / "teacher" / "teacher_persistent_eval.csv")
    assert list(held.seed) == list(pd.read_csv(out / "teacher" / "teacher_eval.csv").seed)  # the same episodes
    # the sweep: every lr ran on train-pool probes; the rl arm trains at the chosen one, the others at cfg.lr
    sweep = json.loads((out / "sweep" / "result.json").read_text())
    assert [row["lr"] for row in sweep["table"]] == [1e-3, 3e-3] and sweep["chosen_lr"] in (1e-3, 3e-3)
    best = max(sweep["table"], key=lambda r: (r["probe_f1"], -r["lr"]))
    assert sweep["chosen_lr"] == best["lr"]
    rl = json.loads((out / "arms" / "rl" / "seed0" / "settings.json").read_text())
    memopd = json.loads((out / "arms" / "memopd" / "seed0" / "settings.json").read_text())
    assert rl["lr"] == sweep["chosen_lr"] and memopd["lr"] == cfg.lr
    assert rl["warmup_updates"] == memopd["warmup_updates"] == 2
    lrs = pd.read_csv(out / "arms" / "memopd" / "seed0" / "metrics.csv")["lr"].tolist()
    assert lrs == pytest.approx([cfg.lr / 2, cfg.lr])
    # the SFT arms: trained for the MemOPD run's CPU of the same seed, data making included
    budget = json.loads((out / "arms" / "memopd" / "seed0" / "result.json").read_text())["train_cpu_seconds"]
    for arm in ("sft_continued", "seqkd"):
        res = json.loads((out / "arms" / arm / "seed0" / "result.json").read_text())
        assert res["budget_cpu_seconds"] == budget and res["data_cpu_seconds"] > 0
        # the SFT's own budget is what the data left of it (at least a second: a miniature's budget is tiny), and
        # the arm's CPU is that training's plus the data's
        sft = json.loads((out / "arms" / arm / "seed0" / "sft" / "config.json").read_text())
        assert sft["max_seconds"] == pytest.approx(max(1.0, budget - res["data_cpu_seconds"]))
        assert sft["lr"] == cfg.student.lr and sft["seed"] == 0
        assert res["train_cpu_seconds"] >= min(budget, sft["max_seconds"] + res["data_cpu_seconds"]) * 0.8
        end = pd.read_csv(out / "arms" / arm / "seed0" / "end_eval.csv")
        assert list(end.seed) == list(pd.read_csv(out / "student" / "start_eval.csv").seed)
    episodes = json.loads((out / "arms" / "seqkd" / "seed0" / "teacher_episodes.json").read_text())
    assert episodes["episodes"] > 0 and episodes["demonstrations"]
    assert SFT_ARM_SEED_BASE["oracle"] != SFT_ARM_SEED_BASE["teacher"]
    report = (out / "results.md").read_text()
    assert "GRPO alone's learning rate (sweep" in report and f"chosen **{sweep['chosen_lr']:g}**" in report
    assert "teacher acting in the flattened transcript" in report and "within 0.05" in report
    assert "lr warm-up over 2 updates" in report
    # a rerun reads every cached run (nothing retrained)
    stamp = (out / "arms" / "seqkd" / "seed0" / "result.json").stat().st_mtime_ns
    run_experiment(cfg)
    assert (out / "arms" / "seqkd" / "seed0" / "result.json").stat().st_mtime_ns == stamp


def test_teacher_view_target_judges_the_gap_between_the_views():
    from distill.experiment.report import targets

    base = {"f1": 0.90, "f1_se": 0.01, "seen_f1": 0.97, "persistent_seen_f1": 0.96, "persistent_f1_se": 0.01,
            "view_gap_se": 0.01}
    empty = pd.DataFrame(columns=["a", "b"])
    for persistent, met in ((0.87, True), (0.95, True), (0.84, False), (0.96, False)):
        teacher = {**base, "persistent_f1": persistent, "view_gap": 0.90 - persistent}
        (goal,) = [g for g in targets(pd.DataFrame(), empty, teacher) if "both views" in g["target"]]
        assert goal["met"] is met and goal["value"] == pytest.approx(0.90 - persistent)
        assert f"persistent {persistent:.3f}" in goal["detail"]
    # a teacher measured in the memory view only (an earlier run) gets no such target
    assert not [g for g in targets(pd.DataFrame(), empty, base) if "both views" in g["target"]]


def test_matched_control_claim_states_the_teachers_view_gap_beside_it():
    from distill.experiment.report import targets

    teacher = {"f1": 0.30, "f1_se": 0.04, "persistent_f1": 0.44, "persistent_f1_se": 0.05, "view_gap_se": 0.047}
    comparisons = pd.DataFrame([{"a": "memopd", "b": "teacher_persistent", "diff": 0.02, "boot_low": -0.01},
                                {"a": "memopd", "b": "rl", "diff": 0.02, "boot_low": -0.01}])

    def details(gap):
        goals = targets(pd.DataFrame(), comparisons, {**teacher, "view_gap": gap})
        control = [g for g in goals if "teacher-persistent control" in g["target"]]
        rl = [g for g in goals if "above GRPO" in g["target"] or g["target"].startswith("MemOPD above")]
        return control[0]["detail"], rl[0]["detail"]

    control, rl = details(-0.140)  # the control's teacher acts better in its own view
    assert "memory minus persistent -0.140 ± 0.047" in control and "a MemOPD win holds despite it" in control
    assert "view" not in rl  # only the matched control's comparison carries it
    control, _ = details(+0.10)
    assert "a MemOPD loss holds despite it" in control and "win cannot be told apart" in control
    control, _ = details(0.03)  # within the tolerance: a fair control, no caveat
    assert "memory minus persistent" not in control


def test_a_comparison_of_two_collapsed_arms_says_so_rather_than_reading_as_a_null():
    from distill.experiment.report import targets

    comparisons = pd.DataFrame([{"a": "memopd", "b": "teacher_persistent", "diff": 0.0, "boot_low": 0.0},
                                {"a": "memopd", "b": "rl", "diff": -0.05, "boot_low": -0.1}])
    table = pd.DataFrame([{"arm": "memopd", "end_f1": 0.0, "gain_f1": -0.1},
                          {"arm": "teacher_persistent", "end_f1": 0.0, "gain_f1": -0.1},
                          {"arm": "rl", "end_f1": 0.05, "gain_f1": -0.05}])
    goals = {g["target"].split(":")[0]: g for g in targets(table, comparisons)}
    control = goals["MemOPD (aligned) above the teacher-persistent control"]
    assert not control["met"] and "both arms end at F1 0 on every seed" in control["detail"]
    assert "collapsed" not in goals["MemOPD above GRPO alone"]["detail"]  # one arm above the floor: a comparison
    table.loc[table.arm == "teacher_persistent", "end_f1"] = 0.01
    control = [g for g in targets(table, comparisons) if "control" in g["target"]][0]
    assert "collapsed" not in control["detail"]


@pytest.mark.slow  # an end-to-end miniature of four swept arms: ~2-3 min on a loaded 2-core machine
def test_miniature_powered_run_forgetful_teacher_swept_arms_and_the_teacher_free_control(tmp_path):
    """Issue 61's pipeline end to end at toy sizes: the teacher trained on forgetful demonstrations in both views,
    every arm's learning rate swept (GRPO alone's where it always was, the others' in their own folders), the
    teacher-free control matched to MemOPD's mean distillation loss of the same seed, and the report comparing
    MemOPD with it and it with GRPO alone."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from distill.experiment.run import run_experiment

    arms = ("rl", "memopd", "teacher_persistent", "constant")
    out = tmp_path / "exp"
    cfg = _tiny(out, env_kwargs={"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 4},
                teacher=ModelSpec(hidden=32, layers=1, heads=2, sft_steps=3, sft_minutes=None, sft_episodes=4,
                                  sft_views=("memory", "persistent"), sft_forget_rate=1.0),
                arms=arms, swept_arms=arms, rl_lr_sweep=(1e-3, 3e-3), updates=1, warmup_updates=0, probe_curve=True)
    run_experiment(cfg)
    from distill.experiment.length import flat_length, probe_curves

    curves = probe_curves(out, arms, 1)  # each arm's train-pool probe F1 at its curve points (here: the end)
    assert all(list(c["update"]) == [1] for c in curves.values()) and flat_length(curves, 40)["updates"] == 1
    assert json.loads((out / "teacher" / "config.json").read_text())["demo_forget_rate"] == 1.0
    chosen = {"rl": json.loads((out / "sweep" / "result.json").read_text())["chosen_lr"]}
    for arm in arms[1:]:
        res = json.loads((out / "sweep" / arm / "result.json").read_text())
        assert res["arm"] == arm and [r["lr"] for r in res["table"]] == [1e-3, 3e-3]
        chosen[arm] = res["chosen_lr"]
    for arm in arms:
        assert json.loads((out / "arms" / arm / "seed0" / "settings.json").read_text())["lr"] == chosen[arm]
    memopd = json.loads((out / "arms" / "memopd" / "seed0" / "result.json").read_text())
    constant = json.loads((out / "arms" / "constant" / "seed0" / "settings.json").read_text())
    assert constant["distill_signal"] == "constant" and constant["constant_signal"] == memopd["distill_loss"] > 0
    swept_memopd = json.loads((out / "sweep" / "memopd" / f"lr{chosen['memopd']:g}" / "seed1000" / "result.json")
                              .read_text())
    sweep_constant = json.loads((out / "sweep" / "constant" / "lr0.001" / "seed1000" / "settings.json").read_text())
    assert sweep_constant["constant_signal"] == swept_memopd["distill_loss"]
    comparisons = pd.read_csv(out / "comparisons.csv")
    assert {("memopd", "constant"), ("constant", "rl")} <= set(zip(comparisons.a, comparisons.b))
    report = (out / "results.md").read_text()
    assert "MemOPD above teacher-free control" in report and "teacher-free control's learning rate (sweep" in report
