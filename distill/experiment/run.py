"""The whole experiment: :func:`run_experiment` runs every stage in order (each cached, so a rerun resumes), the
arm runs in worker processes (:func:`_run_arms`), and writes the report; ``until`` stops after the teacher's or
the student's stage (:data:`STAGES`, :func:`stage_summary`)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from memenv.files import write_atomic, write_text_atomic
from distill.experiment.config import (ARM_SETTINGS, RERUN_MAY_CHANGE, STUDENT_SETTINGS, ExperimentConfig, SettingsMismatchError,
                                       _config_record, changed_settings, check_settings)
from distill.experiment.report import comparisons_table, format_markdown, plot_curves, results_table, targets
from distill.experiment.config import ARMS, SFT_ARMS
from distill.experiment.baselines import (choose_lr, extended, run_sft_arm, run_sweep_point, sweep_dir, sweep_jobs,
                                          swept, with_lr)
from distill.experiment.stages import (_done, _log, actor_timing, build_student, build_teacher,
                                       persistent_diagnostics, read_stage_json, run_arm)


def _exit_with_parent(parent_pid: int, poll_seconds: float = 1.0) -> None:
    """Worker initializer: end this worker when the experiment's process is gone (killed rather than
    interrupted), instead of training the queued arms on as an orphan."""
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_jobs(cfg: ExperimentConfig, jobs: list[tuple], run, done, desc: str, *args) -> dict:
    """``run(cfg, *job, *args)`` for every job (``done(job)``: its cached result, or None); ``cfg.workers`` > 1
    runs them in that many processes (one torch thread each by default). Why processes, not threads: on a shared
    2-core machine a 2-thread tiny-model step was several times *slower* than a 1-thread one (every op waits for
    the thread that lost its core), while two 1-thread processes each keep their own pace."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing

    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=desc, unit="run", disable=not cfg.progress)
    results = {}
    todo = [j for j in jobs if done(j) is None]
    for job in jobs:
        if job not in todo:
            results[job] = run(cfg, *job, *args)  # cached: reads result.json
            bar.update(1)
    if cfg.workers == 1 or len(todo) <= 1:
        for job in todo:
            results[job] = run(cfg, *job, *args)
            bar.update(1)
    else:
        quiet = replace(cfg, progress=False)  # one bar (this one), not one per worker
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that already ran torch threads
        with ProcessPoolExecutor(max_workers=min(cfg.workers, len(todo)), mp_context=ctx,
                                 initializer=_exit_with_parent, initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(run, quiet, *job, *args): job for job in todo}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.update(1)
    bar.close()
    return results


def _run_arms(cfg: ExperimentConfig, jobs: list[tuple[str, int]], student: dict, teacher: dict) -> dict:
    """Every (arm, seed) run (:func:`_run_jobs`): the GRPO-trained arms first, then those matched to another arm's
    run of the same seed: the teacher-free control (its constant is MemOPD's mean distillation loss) and the SFT
    arms (their CPU budget is ``cfg.equal_cpu_arm``'s run)."""
    done = lambda job: _done(Path(cfg.out) / "arms" / job[0] / f"seed{job[1]}")  # noqa: E731
    results = {}
    matched = tuple(a for a, (_, f) in ARMS.items() if f is not None and f.get("distill_signal") == "constant")
    for run, phase in ((run_arm, [j for j in jobs if j[0] not in SFT_ARMS + matched]),
                       (run_arm, [j for j in jobs if j[0] in matched]),
                       (run_sft_arm, [j for j in jobs if j[0] in SFT_ARMS])):
        if phase:
            results.update(_run_jobs(cfg, phase, run, done, "arms x seeds", student, teacher))
    return results


def tune_rl_lr(cfg: ExperimentConfig, student: dict, teacher: dict | None = None) -> ExperimentConfig:
    """``cfg`` with the learning rate of every arm of :func:`baselines.swept` chosen by the sweep
    (:func:`baselines.run_sweep_point`, :func:`baselines.choose_lr`): GRPO alone's in ``rl_lr`` (the only one before
    issue 61), the others' in ``lr_by_arm``. A choice on its grid's edge extends that arm's grid past the edge
    (:func:`baselines.extended`) and sweeps the new rate, up to ``cfg.sweep_extend`` times. The teacher-free
    control sweeps last, each of its runs matched to MemOPD's sweep run of the same seed at MemOPD's chosen rate."""
    arms = swept(cfg)
    if not arms:
        return cfg
    matched = [a for a in arms if ARMS[a][1] is not None and ARMS[a][1].get("distill_signal") == "constant"]
    for phase in ([a for a in arms if a not in matched], matched):
        grids = {arm: tuple(sorted(cfg.rl_lr_sweep)) for arm in phase}
        for round_ in range(cfg.sweep_extend + 1):
            pending = [a for a in phase if a in grids]
            if not pending:
                break
            jobs = [j for j in sweep_jobs(cfg, grids) if j[0] in pending]
            source = {} if not matched or phase is not matched else \
                {seed: sweep_dir(cfg, "memopd", cfg.lr_by_arm["memopd"], seed) for _, _, seed in jobs}
            done = lambda job: _done(sweep_dir(cfg, *job))  # noqa: E731
            runs = _run_jobs(cfg, jobs, _sweep_point, done, "lr sweep", student, teacher, source)
            for arm in pending:
                res = choose_lr(cfg, arm, {(lr, seed): r for (a, lr, seed), r in runs.items() if a == arm},
                                grids[arm])
                _log(cfg, f"{arm}'s learning rate: " + ", ".join(f"{r['lr']:g} -> probe F1 {r['probe_f1']:.3f}"
                                                                for r in res["table"])
                     + f"; chosen {res['chosen_lr']:g}" + (" (on the grid's edge)" if res["on_edge"] else ""))
                if res["on_edge"] and round_ < cfg.sweep_extend:
                    grids[arm] = extended(grids[arm], res["chosen_lr"])
                    continue
                cfg = with_lr(cfg, arm, res["chosen_lr"])
                del grids[arm]
    return cfg


def _sweep_point(cfg: ExperimentConfig, arm: str, lr: float, seed: int, student: dict, teacher: dict | None,
                 source: dict) -> dict:
    """One sweep job (:func:`_run_jobs` passes the job's fields, then the shared arguments)."""
    return run_sweep_point(cfg, arm, lr, seed, student, teacher, source.get(seed))


def arm_jobs(cfg: ExperimentConfig) -> list[tuple[str, int]]:
    """Every (arm, seed) run, seed-major: a run cut short or made in parts (one worker) holds every arm of its
    first seeds, already paired, rather than every seed of its first arms."""
    return [(arm, s) for s in range(cfg.seeds) for arm in cfg.arms]


#: Where ``run_experiment(until=...)`` / ``--until`` may stop: after the teacher's or the student's stage.
STAGES = ("teacher", "student")


def _rl_precision(cfg: ExperimentConfig) -> str:
    """What the host line says of the arms' arithmetic: sampling is always fp32; their training passes follow
    ``cfg.train_autocast`` (bf16 autocast where it resolves to it on this host)."""
    from agents.llm.models.precision import resolve_autocast

    train = resolve_autocast(cfg.train_autocast) if cfg.train_autocast is not None else "none"
    passes = "bf16 autocast" if train == "bf16" else "fp32"
    return f"SFT: autocast as shown; RL and distillation: sampling fp32, training passes {passes}"


@contextlib.contextmanager
def _no_checkpoint_bars():
    """transformers' own bars (``Loading weights``, ``Writing model shards``, one per checkpoint) off for the run,
    in this process and in the arm workers it spawns (``HF_HUB_DISABLE_PROGRESS_BARS``), so they do not mix with
    the stage headers and the experiment's bars; restored after."""
    from transformers.utils import logging as hf_logging

    was_on, env = hf_logging.is_progress_bar_enabled(), os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if env is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = env
        if was_on:
            hf_logging.enable_progress_bar()


def _stage(cfg: ExperimentConfig, name: str, what: str) -> None:
    """A stage header between the stages' output (with the progress output only)."""
    _log(cfg, f"\n== {name}: {what} ==")


#: The stages a sensitivity run may take from another run's folder (:func:`link_stages`): the costly ones, which
#: no arm setting reads.
LINKED_STAGES = ("teacher", "student")


def link_stages(cfg: ExperimentConfig, source: str | Path, stages: tuple[str, ...] = LINKED_STAGES) -> None:
    """Make ``cfg.out``'s teacher and student stages links to those of the run in ``source``: a sensitivity run
    that changes only arm settings (:data:`~distill.experiment.config.ARM_SETTINGS`: an lr, the distillation
    coefficient, the updates) pays for neither SFT again, and runs in its own folder, so the first run's arms and
    report stay as they were. Refused (:class:`SettingsMismatchError`, one line naming what) where ``source`` lacks
    a finished stage (the run would train into ``source`` through the link), its settings differ in any other
    than the arms' (and :data:`~distill.experiment.config.RERUN_MAY_CHANGE`), or ``cfg.out`` holds a stage of its
    own; links already there to the same stages are kept (a rerun). ``stages=("teacher",)`` (``--teacher-from``)
    links the teacher only: the student's settings (:data:`~distill.experiment.config.STUDENT_SETTINGS`) may then
    differ too, and this run builds its own start from the linked teacher."""
    if tuple(stages) not in (LINKED_STAGES, ("teacher",)):
        raise ValueError(f"stages must be {LINKED_STAGES} or ('teacher',), got {stages!r}")
    what = f"--stages-from {source}" if tuple(stages) == LINKED_STAGES else f"--teacher-from {source}"
    if not str(source).strip():
        raise SettingsMismatchError(f"{what}: expected a run's folder, got an empty path")
    try:
        src = Path(source).resolve()
    except (OSError, RuntimeError) as exc:  # missing, or a loop of symbolic links
        raise SettingsMismatchError(f"{what}: cannot be read as a folder ({type(exc).__name__}: "
                                    f"{getattr(exc, 'strerror', None) or exc})") from None
    if not (src / "experiment.json").is_file():
        raise SettingsMismatchError(f"{what}: no experiment.json there (not a memenv experiment memopd --out folder)")
    old = read_stage_json(src / "experiment.json", "that run's settings record")
    if not isinstance(old, dict):
        raise SettingsMismatchError(f"{what}: its experiment.json is not a run's settings (a JSON object)")
    for stage in stages:
        if not (src / stage / "result.json").is_file():
            raise SettingsMismatchError(f"{what}: its {stage} stage is not finished ({src / stage / 'result.json'} "
                                        f"is missing); finish it there first (--until {stage})")
    teacher = read_stage_json(src / "teacher" / "result.json", "that run's teacher stage")
    later = [k for k, on in (("train_draw_f1", bool(old.get("env_kwargs", {}).get("fresh_facts"))),
                             ("persistent_f1", True)) if on and k not in (teacher if isinstance(teacher, dict) else {})]
    if later:  # this version would add them, writing into that run through the link: refused, that run untouched
        raise SettingsMismatchError(f"{what}: its teacher stage predates figures this version adds "
                                    f"({', '.join(later)}); rerun that run once with --until teacher to add them "
                                    "there, then link it")
    free = RERUN_MAY_CHANGE + ARM_SETTINGS + (STUDENT_SETTINGS if "student" not in stages else ())
    changed = changed_settings(old, cfg, free)
    if changed:
        raise SettingsMismatchError(f"{what}: its stages were made with other settings: {changed}; only the arms' "
                                    + ("settings may differ" if "student" in stages else "and the student's settings "
                                       "may differ"))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        link = out / stage
        if link.is_symlink() and link.resolve() == (src / stage).resolve():
            continue
        if link.exists() or link.is_symlink():
            raise SettingsMismatchError(f"{link} exists already: {what} links the {stage} stage into a folder "
                                        "without one; use another --out")
        link.symlink_to(src / stage, target_is_directory=True)


def run_experiment(cfg: ExperimentConfig, until: str | None = None) -> pd.DataFrame:
    """All stages (cached, resumable); returns the results table and writes the outputs under ``cfg.out``.

    ``until`` (``"teacher"`` or ``"student"``) stops after that stage, its result cached as a full run would
    leave it (a later call without ``until`` resumes from it), and returns that stage's one-row summary instead
    of the results table: the teacher's and the weak start's F1 can be measured before the arms are paid for."""
    if until is not None and until not in STAGES:
        raise ValueError(f"until must be one of {list(STAGES)} or None, got {until!r}")
    with _no_checkpoint_bars():
        return _run_stages(cfg, until)


def _run_stages(cfg: ExperimentConfig, until: str | None) -> pd.DataFrame:
    import torch

    from agents.llm.models.precision import host_line, resolve_autocast

    check_settings(cfg)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    host = host_line(resolve_autocast("auto")) + f" ({_rl_precision(cfg)})"
    _log(cfg, host)
    write_text_atomic(out / "experiment.json", json.dumps(_config_record(cfg), indent=2))
    _stage(cfg, "teacher", "SFT on oracle demonstrations, then held-out and seen evaluation (cached)")
    teacher = build_teacher(cfg)
    _log(cfg, f"teacher: held-out F1 {teacher['f1']:.3f} (EM {teacher['em']:.3f}), seen {teacher['seen_f1']:.3f}")
    if until == "teacher":
        return stage_summary({"teacher": teacher})
    _stage(cfg, "student", "the weak start: SFT rounds until the probe F1 target, then evaluation (cached)")
    student = build_student(cfg, teacher)
    _log(cfg, f"student start: held-out F1 {student['f1']:.3f} (EM {student['em']:.3f}), seen "
              f"{student['seen_f1']:.3f}")
    if until == "student":
        return stage_summary({"teacher": teacher, "student": student})
    start = pd.read_csv(out / "student" / "start_eval.csv")
    start_seen = pd.read_csv(out / "student" / "start_eval_seen.csv")
    _stage(cfg, "timing", "the actor's cost on one update's records")
    timing = actor_timing(cfg, student)
    if swept(cfg):
        _stage(cfg, "lr sweep", "the learning rate of " + ", ".join(swept(cfg)))
        cfg = tune_rl_lr(cfg, student, teacher)
    jobs = arm_jobs(cfg)
    _stage(cfg, "arms", f"{len(cfg.arms)} arm(s) x {cfg.seeds} training seed(s): {' '.join(cfg.arms)}")
    results = _run_arms(cfg, jobs, student, teacher)
    runs = {arm: [results[(arm, s)] for s in range(cfg.seeds)] for arm in cfg.arms}
    read = lambda arm, name: [pd.read_csv(out / "arms" / arm / f"seed{s}" / name)  # noqa: E731
                              for s in range(cfg.seeds)]
    ends = {arm: read(arm, "end_eval.csv") for arm in cfg.arms}
    ends_seen = {arm: read(arm, "end_eval_seen.csv") for arm in cfg.arms}
    _stage(cfg, "report", "statistics, results.md, learning curves")
    diagnostics = persistent_diagnostics(cfg) if "flattening" in cfg.arms else None
    table = results_table(cfg, start, ends, runs, timing, start_seen, ends_seen)
    comparisons = comparisons_table(ends, ends_seen)
    goals = targets(table, comparisons, teacher, student)
    write_atomic(out / "results.csv", lambda tmp: table.to_csv(tmp, index=False))
    write_atomic(out / "comparisons.csv", lambda tmp: comparisons.to_csv(tmp, index=False))
    write_text_atomic(out / "results.md", format_markdown(cfg, table, comparisons, teacher, student, timing,
                                                          diagnostics, host, goals))
    plot_curves(cfg, out / "learning_curves.png", start)
    return table


def stage_summary(stages: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per built stage (teacher, student start): its F1 on held-out and seen questions with their SEs
    over episodes, its SFT steps and CPU seconds, its parameter count."""
    keys = ("f1", "f1_se", "em", "seen_f1", "seen_f1_se", "steps", "train_cpu_seconds", "parameters", "path")
    return pd.DataFrame([{"stage": name, **{k: res.get(k) for k in keys}} for name, res in stages.items()])


__all__ = ["STAGES", "LINKED_STAGES", "arm_jobs", "link_stages", "run_experiment", "stage_summary"]
