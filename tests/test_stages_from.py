"""``memenv experiment memopd --stages-from RUN`` (:func:`distill.experiment.run.link_stages`): a sensitivity run
(another arm setting) in its own folder takes the teacher and student stages of a finished run, links them, trains
nothing into that run's folder, and is refused where the stages were made with other settings."""

import dataclasses
import json

import pandas as pd
import pytest

from distill.experiment.config import DEFAULT_ARMS, ExperimentConfig, ModelSpec, SettingsMismatchError, _config_record
from distill.experiment.run import link_stages


def _tiny(out, **kw):
    base = dict(out=str(out), env_kwargs={"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 2},
                teacher=ModelSpec(hidden=32, layers=1, heads=2, sft_steps=3, sft_minutes=None, sft_episodes=4),
                student=ModelSpec(hidden=16, layers=1, heads=2, sft_steps=2, sft_minutes=None, sft_episodes=4),
                student_max_steps=4, probe_episodes=2, sft_threads=1, arms=DEFAULT_ARMS, vocab=400,
                tokenizer_episodes=8, seeds=1, updates=2, tasks_per_update=1, group_size=2, eval_episodes=4,
                seen_eval_episodes=3, curve_every=1, curve_episodes=2, max_new_tokens=10, num_envs=4, threads=1,
                workers=1, timing_rounds=1, diagnose_episodes=2, progress=False)
    return ExperimentConfig(**{**base, **kw})


def _fake_run(folder, cfg, stages=("teacher", "student")):
    """A run folder as a finished run leaves its record and stage results (no training)."""
    folder.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(_config_record(cfg)))
    for stage in stages:
        (folder / stage).mkdir()
        (folder / stage / "result.json").write_text('{"persistent_f1": 0.5, "train_draw_f1": 0.5}')


def test_the_stages_are_linked_for_another_arm_setting_and_a_rerun_keeps_them(tmp_path):
    source = tmp_path / "first"
    _fake_run(source, _tiny(source, lr=3e-5))
    sens = _tiny(tmp_path / "sens", lr=1e-5, distill_coef=0.1, updates=4, arms=("memopd",))
    link_stages(sens, source)
    for stage in ("teacher", "student"):
        link = tmp_path / "sens" / stage
        assert link.is_symlink() and link.resolve() == (source / stage).resolve()
    assert not (tmp_path / "sens" / "arms").exists() and not (tmp_path / "sens" / "sweep").exists()
    link_stages(sens, source)  # a rerun: the same links, kept
    assert (tmp_path / "sens" / "teacher").resolve() == (source / "teacher").resolve()


@pytest.mark.parametrize("change, named", [
    (lambda c: dataclasses.replace(c, teacher=dataclasses.replace(c.teacher, sft_steps=5)), "teacher.sft_steps 3 -> 5"),
    (lambda c: dataclasses.replace(c, student_max_steps=8), "student_max_steps"),
    (lambda c: dataclasses.replace(c, env_kwargs={**c.env_kwargs, "objectives": 1}), "env_kwargs.objectives 2 -> 1"),
])
def test_stages_made_with_other_settings_are_refused_naming_them(tmp_path, change, named):
    source = tmp_path / "first"
    _fake_run(source, _tiny(source))
    with pytest.raises(SettingsMismatchError, match=f"other settings: {named}.*only the arms' settings may differ"):
        link_stages(change(_tiny(tmp_path / "sens", lr=1e-5)), source)
    assert not (tmp_path / "sens" / "teacher").exists()


def test_an_unfinished_stage_a_folder_that_is_no_run_and_an_own_stage_are_refused(tmp_path):
    half = tmp_path / "half"
    _fake_run(half, _tiny(half), stages=("teacher",))  # the student would be trained into it through the link
    with pytest.raises(SettingsMismatchError, match=r"its student stage is not finished .*--until student"):
        link_stages(_tiny(tmp_path / "a"), half)
    with pytest.raises(SettingsMismatchError, match="no experiment.json there"):
        link_stages(_tiny(tmp_path / "b"), tmp_path / "nowhere")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "experiment.json").write_text("[1, 2]")
    with pytest.raises(SettingsMismatchError, match="not a run's settings"):
        link_stages(_tiny(tmp_path / "c"), tmp_path / "bad")
    source = tmp_path / "first"
    _fake_run(source, _tiny(source))
    own = tmp_path / "own"
    (own / "teacher").mkdir(parents=True)
    with pytest.raises(SettingsMismatchError, match=r"teacher exists already"):
        link_stages(_tiny(own), source)
    assert not (own / "teacher").is_symlink()


def test_a_sensitivity_run_reuses_a_real_runs_stages_and_writes_nothing_into_it(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from distill.experiment.run import run_experiment

    first = _tiny(tmp_path / "first")
    made = run_experiment(first, until="student")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "first").rglob("*") if p.is_file()}
    sens = _tiny(tmp_path / "sens", lr=1e-5)
    link_stages(sens, tmp_path / "first")
    again = run_experiment(sens, until="student")
    assert list(again.f1) == list(made.f1) and list(again.steps) == list(made.steps)  # read back, not retrained
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "first").rglob("*") if p.is_file()}
    assert after == before
    assert json.loads((tmp_path / "sens" / "experiment.json").read_text())["lr"] == 1e-5


def test_the_cli_option_links_and_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    import distill.experiment.cli as experiment_cli
    from memenv.cli import main

    seen = {}

    def fake_run(cfg, until=None):  # the stages themselves are tested above
        seen["cfg"] = cfg
        return pd.DataFrame({"stage": ["student"], "path": ["x"]})

    monkeypatch.setattr(experiment_cli, "run_experiment", fake_run)
    from distill.experiment.config import quick_config, world_config

    source = tmp_path / "first"
    _fake_run(source, world_config(quick_config(str(source)), "fixed", quick=True))
    assert main(["experiment", "memopd", "--quick", "--quiet", "--out", str(tmp_path / "sens"), "--lr", "1e-5",
                 "--stages-from", str(source), "--until", "student"]) == 0
    assert (tmp_path / "sens" / "teacher").is_symlink() and seen["cfg"].lr == 1e-5
    capsys.readouterr()
    assert main(["experiment", "memopd", "--quick", "--quiet", "--out", str(tmp_path / "other"), "--seeds", "3",
                 "--student-steps", "7", "--stages-from", str(source)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other settings: student.sft_steps 200 -> 7;" in err[0]


def test_teacher_from_links_the_teacher_only_and_lets_the_start_differ(tmp_path, monkeypatch, capsys):
    """``--teacher-from RUN`` (issue 61's plateau question): only the teacher is linked, from a run whose teacher is
    finished; the student's settings may differ (this run builds its own start), the teacher's and the env's may
    not; --plateau needs --powered, and the two link options exclude each other."""
    source = tmp_path / "first"
    _fake_run(source, _tiny(source), stages=("teacher",))  # its student not built: no matter here
    mine = _tiny(tmp_path / "plateau", student_plateau=0.01, student_max_steps=8, arms=("memopd",))
    with pytest.raises(SettingsMismatchError, match="its student stage is not finished"):
        link_stages(mine, source)  # both stages: refused
    link_stages(mine, source, ("teacher",))
    assert (tmp_path / "plateau" / "teacher").is_symlink() and not (tmp_path / "plateau" / "student").exists()
    other_teacher = dataclasses.replace(mine, out=str(tmp_path / "x"), teacher=dataclasses.replace(mine.teacher,
                                                                                                  sft_steps=9))
    with pytest.raises(SettingsMismatchError, match="teacher.sft_steps 3 -> 9.*and the student's settings may differ"):
        link_stages(other_teacher, source, ("teacher",))
    with pytest.raises(ValueError, match="stages must be"):
        link_stages(mine, source, ("student",))
    from memenv.cli import main

    assert main(["experiment", "memopd", "--plateau", "--out", str(tmp_path / "y")]) == 2
    assert "--plateau is a variant of --powered" in capsys.readouterr().err
    assert main(["experiment", "memopd", "--powered", "--out", str(tmp_path / "z"), "--stages-from", str(source),
                 "--teacher-from", str(source)]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_the_plateau_rule_stops_the_start_when_a_probe_no_longer_improves():
    from distill.experiment.config import PLATEAU_ARMS, plateau_config
    from distill.experiment.stages import plateau_verdict

    probes = [{"probe_f1": f} for f in (0.2, 0.4, 0.45, 0.455)]
    assert [plateau_verdict(probes[:n], 0.01) for n in (1, 2, 3, 4)] == ["continue", "continue", "continue", "plateau"]
    assert plateau_verdict([{"probe_f1": 0.5}, {"probe_f1": 0.3}], 0.01) == "plateau"  # a drop is no improvement
    cfg = plateau_config("unused")
    assert cfg.arms == PLATEAU_ARMS and cfg.student_plateau == 0.01 and cfg.swept_arms == ("memopd",)
    assert cfg.equal_cpu_arm == "memopd" and cfg.teacher.sft_demo_expert == "compact"
    with pytest.raises(ValueError, match="student_plateau"):
        plateau_config("unused", student_plateau=0.0)


def test_a_plateau_start_is_built_from_a_linked_teacher_and_stops_at_its_plateau(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from distill.experiment.run import run_experiment

    run_experiment(_tiny(tmp_path / "first"), until="teacher")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "first").rglob("*") if p.is_file()}
    plateau = _tiny(tmp_path / "plateau", student_plateau=0.99, student_probes=(1, 2, 3), student_max_steps=3)
    link_stages(plateau, tmp_path / "first", ("teacher",))
    run_experiment(plateau, until="student")
    res = json.loads((tmp_path / "plateau" / "student" / "result.json").read_text())
    # the second probe cannot gain 0.99 F1 on the first: the plateau, two probes in
    assert res["plateau"] == {"tolerance": 0.99, "verdict": "plateau"} and res["sft_steps"] == 2
    assert [p["steps"] for p in res["probes"]] == [1, 2] and "start_window" not in res
    assert not (tmp_path / "plateau" / "student").is_symlink()
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "first").rglob("*") if p.is_file()} == before


def test_a_link_loop_or_an_old_teacher_layout_is_refused_and_that_run_never_written(tmp_path):
    """Issue 64: a symbolic-link loop is one line, not a traceback; a RUN whose teacher stage predates figures this
    version adds (the persistent-view evaluation) is refused rather than completed through the link."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    with pytest.raises(SettingsMismatchError, match="cannot be read as a folder"):
        link_stages(_tiny(tmp_path / "a"), tmp_path / "loop")
    with pytest.raises(SettingsMismatchError, match="empty path"):
        link_stages(_tiny(tmp_path / "a"), "")
    old = tmp_path / "old"
    _fake_run(old, _tiny(old))
    (old / "teacher" / "result.json").write_text('{"f1": 0.5}')  # before persistent_f1 existed
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    with pytest.raises(SettingsMismatchError, match=r"predates figures this version adds \(persistent_f1\)"):
        link_stages(_tiny(tmp_path / "b", lr=1e-5), old)
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "b" / "teacher").exists()
