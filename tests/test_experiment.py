"""``memenv experiment memopd``: paired statistics on known numbers; a miniature end-to-end run (table
structure, the same held-out seeds at start and end, figures recomputable from the per-seed CSVs, resume)."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from distill.experiment import ARMS, RESULT_COLUMNS, ExperimentConfig, ModelSpec, arm_summary, paired_stats

from memenv.cli import main


def test_paired_stats_known_numbers():
    s = paired_stats([0, 0, 0, 0], [1, 0, 1, 0])
    assert s["mean"] == 0.5 and s["n"] == 4
    assert s["se"] == pytest.approx(math.sqrt(1 / 3) / 2)  # sd (ddof=1) of (1,0,1,0) is sqrt(1/3)
    assert s["z"] == pytest.approx(0.5 / (math.sqrt(1 / 3) / 2))
    # pairing removes the spread shared by start and end: a constant gain has zero standard error
    same = paired_stats([0.1, 0.9, 0.4], [0.3, 1.1, 0.6])
    assert same["mean"] == pytest.approx(0.2) and same["se"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="equal-length"):
        paired_stats([0, 1], [0, 1, 1])


def test_arm_summary_averages_training_seeds_before_pairing():
    start = pd.DataFrame({"seed": [7, 8, 9], "f1": [0.0, 0.5, 1.0], "em": [0, 0, 1]})
    ends = [pd.DataFrame({"seed": [7, 8, 9], "f1": [1.0, 0.5, 1.0], "em": [1, 0, 1]}),
            pd.DataFrame({"seed": [7, 8, 9], "f1": [0.0, 1.0, 1.0], "em": [0, 1, 1]})]
    out = arm_summary(start, ends)
    d = np.array([0.5, 0.25, 0.0])  # mean end over the two seeds minus start, per held-out seed
    assert out["gain_f1"] == pytest.approx(d.mean())
    assert out["gain_f1_se"] == pytest.approx(d.std(ddof=1) / math.sqrt(3))
    assert out["end_f1_std"] == pytest.approx(np.std([2.5 / 3, 2 / 3], ddof=1))  # spread over training seeds
    assert out["gain_f1_seed_std"] == pytest.approx(np.std([2.5 / 3 - 0.5, 2 / 3 - 0.5], ddof=1))
    with pytest.raises(ValueError, match="same held-out seeds"):
        arm_summary(start, [ends[0].assign(seed=[7, 8, 10])])


def _tiny(out):
    return ExperimentConfig(out=str(out), env_kwargs={"objectives": 2, "hops": 1, "comparison_rate": 0.0,
                                                      "max_turns": 2},
                            teacher=ModelSpec(hidden=32, layers=1, heads=2, sft_steps=3, sft_minutes=None,
                                              sft_episodes=4),
                            student=ModelSpec(hidden=16, layers=1, heads=2, sft_steps=2, sft_minutes=None,
                                              sft_episodes=4),
                            student_max_steps=4, probe_episodes=2, sft_threads=1,
                            vocab=400, tokenizer_episodes=8, seeds=2, updates=1, tasks_per_update=1, group_size=2,
                            eval_episodes=4, max_new_tokens=10, num_envs=4, threads=1, workers=2, timing_rounds=1,
                            diagnose_episodes=2, progress=False)


def test_miniature_run_table_pairing_and_resume(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agents.llm.training import eval_seeds
    from distill.experiment import run_experiment

    cfg = _tiny(tmp_path / "exp")
    table = run_experiment(cfg)
    out = tmp_path / "exp"
    saved = pd.read_csv(out / "results.csv")
    assert list(saved.columns) == RESULT_COLUMNS and list(saved.arm) == list(ARMS)
    assert (saved.seeds == 2).all() and (saved.updates == 1).all() and (saved.eval_episodes == 4).all()
    start = pd.read_csv(out / "student" / "start_eval.csv")
    assert list(start.seed) == eval_seeds(4)
    # weak start: SFT rounds of 2 steps until the probe F1 reaches 0.15 (a 16-wide model does not) or 4 steps
    student = json.loads((out / "student" / "result.json").read_text())
    assert [p["steps"] for p in student["probes"]] == [2, 4] and student["sft_steps"] == 4
    assert all(p["probe_f1"] < 0.15 for p in student["probes"])
    for arm in ARMS:
        ends = [pd.read_csv(out / "arms" / arm / f"seed{s}" / "end_eval.csv") for s in range(2)]
        for end in ends:
            assert list(end.seed) == list(start.seed)  # the same held-out seeds at start and end
        d = np.mean([e.f1.to_numpy() for e in ends], axis=0) - start.f1.to_numpy()
        row = saved.set_index("arm").loc[arm]
        assert row.start_f1 == pytest.approx(start.f1.mean())
        assert row.gain_f1 == pytest.approx(d.mean())
        assert row.gain_f1_se == pytest.approx(d.std(ddof=1) / 2, nan_ok=True)
    # the persistent reconstruction scores longer sequences than the aligned one
    by = saved.set_index("arm")
    assert by.loc["opd_persistent", "peak_scored_tokens"] > by.loc["memopd", "peak_scored_tokens"]
    assert math.isnan(by.loc["rl", "actor_s_packed"]) and by.loc["memopd", "actor_s_packed"] > 0
    diag = pd.read_csv(out / "diagnostics.csv").set_index("method")
    assert diag.loc["aligned", "p99_abs_dlogp"] <= 1e-4 < diag.loc["persistent", "p99_abs_dlogp"]
    md = (out / "results.md").read_text()
    assert all(label in md for label, _ in ARMS.values()) and "Targets:" in md
    assert (out / "learning_curves.png").stat().st_size > 0
    # resume: every stage is cached, nothing is retrained
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("result.json")}
    assert len(stamps) == 2 + len(ARMS) * 2
    again = run_experiment(cfg)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("result.json")} == stamps
    pd.testing.assert_frame_equal(again, table)
    assert json.loads((out / "experiment.json").read_text())["seeds"] == 2
    # cached arms of another configuration are refused, naming the file and the setting
    with pytest.raises(ValueError, match="updates"):
        run_experiment(dataclasses.replace(cfg, updates=2))
    # a finished SFT whose result.json is missing is evaluated again, not trained again
    teacher = json.loads((out / "teacher" / "result.json").read_text())
    metrics = (out / "teacher" / "metrics.csv").read_bytes()
    (out / "teacher" / "result.json").unlink()
    run_experiment(cfg)
    assert (out / "teacher" / "metrics.csv").read_bytes() == metrics
    assert json.loads((out / "teacher" / "result.json").read_text())["f1"] == teacher["f1"]


def test_cli_rejects_bad_options_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["experiment", "memopd", "--out", str(tmp_path / "x"), "--arms", "magic"])
    assert err.value.code == 2 and "--arms" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main(["experiment", "memopd", "--out", str(tmp_path / "x"), "--seeds", "0"])
    assert err.value.code == 2 and "--seeds" in capsys.readouterr().err
    for option, value, name in (("--lr", "0", "lr must be > 0"), ("--distill-coef", "-1", "distill_coef"),
                                ("--student-start-f1", "1.5", "student_start_f1")):
        assert main(["experiment", "memopd", "--out", str(tmp_path / "x"), option, value]) == 2
        assert capsys.readouterr().err.strip() == f"memenv experiment: error: {name}" + (
            {"lr must be > 0": ", got 0.0", "distill_coef": " must be >= 0, got -1.0",
             "student_start_f1": " must be in [0, 1], got 1.5"}[name])
    assert not (tmp_path / "x").exists()


def test_arm_workers_end_when_the_experiment_process_is_killed(tmp_path):
    """A worker started with _exit_with_parent exits on its own once its parent is gone (SIGKILL, so no
    executor shutdown runs), instead of training on as an orphan."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc")
    script = (
        "import multiprocessing, os, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from distill.experiment import _exit_with_parent\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),\n"
        "                               initializer=_exit_with_parent, initargs=(os.getpid(), 0.05))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    pool.submit(time.sleep, 120)\n"
        "    time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    try:
        worker = int(parent.stdout.readline())
        assert alive(worker)
        parent.kill()
        parent.wait()
        deadline = time.time() + 15
        while alive(worker) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the arm worker outlived the killed experiment process"
    finally:
        parent.kill()
