"""Continue a run's teacher past the budget it was made with (``memenv experiment memopd ... --extend-teacher
--teacher-minutes M``): a teacher whose curve still rises when its budget ends gets more SFT from its latest
checkpoint, in the same folder, rather than a new run that pays for the first part again.

What it does, in order, before any training: the run's ``experiment.json`` must differ from the new settings in
the teacher's budget only (``teacher.sft_minutes`` and/or ``teacher.sft_steps``), each at least what it was and
one larger; no stage made *from* the teacher may exist yet (the student's finished start, whose window is a share
of the teacher's F1, the arms, the timing, the diagnostics: each is named if present); the teacher must be this
run's own (not linked from another run). Then the teacher's finished result and its evaluation files move to
``teacher/before-extension-STEP/`` (kept as the record of the shorter teacher, never overwritten), and
``experiment.json`` records the new budget. The next ``run_experiment`` resumes the SFT from the latest checkpoint
(weights, AdamW moments, random state, both clocks) and evaluates the longer teacher afresh.

**The learning-rate schedule it resumes on**: the SFT's cosine is laid over the whole budget (``schedule_by
"budget"``: CPU-seconds; else steps), so the continued run follows the cosine of the *new* budget from the point
already spent: a warm restart from the old schedule's floor (``min_lr_ratio * lr``) to the value the longer
schedule has there (:func:`resume_lr` says both), then down to the same floor at the new budget's end. The first
part was trained on the old, faster decay; the record says so (``extensions`` in the teacher's result)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memenv.files import write_text_atomic
from distill.experiment.config import (ARM_SETTINGS, RERUN_MAY_CHANGE, STUDENT_LENGTH_SETTINGS, ExperimentConfig,
                                       ModelSpec, SettingsMismatchError, _config_record, changed_settings)

#: The teacher settings an extension may raise.
BUDGET_FIELDS = ("sft_minutes", "sft_steps")
#: Stages made from the teacher: an extension would leave them describing a teacher that no longer exists.
LATER_STAGES = (("student/result.json", "the student's start (its window is a share of the teacher's F1)"),
                ("arms", "the arms"), ("timing.csv", "the timing"), ("diagnostics.csv", "the diagnostics"))
EXTENSIONS_FILE = "extensions.json"


def resume_lr(cfg: ExperimentConfig, spent_seconds: float, step: int, minutes: float | None,
              steps: int) -> float:
    """The SFT learning rate at ``step`` with ``spent_seconds`` on the budget clock under a teacher budget of
    ``minutes`` (None: steps) and ``steps``: the same :func:`agents.llm.training.sft.lr_at` the SFT uses."""
    from dataclasses import replace

    from agents.llm.training.sft import lr_at
    from distill.experiment.stages import _sft_config

    spec = replace(cfg.teacher, sft_minutes=minutes, sft_steps=steps)
    return lr_at(step, _sft_config(cfg, spec, Path(cfg.out) / "teacher"), spent_seconds)


def _budget_change(old: dict[str, Any], cfg: ExperimentConfig) -> tuple[dict, dict, str]:
    """The recorded teacher spec (``old``: a run's ``experiment.json``), ``cfg``'s, and the settings other than
    the teacher's budget in which they differ (empty: none)."""
    before = {**asdict(ModelSpec()), **old["teacher"]}
    after = asdict(cfg.teacher)
    others = changed_settings({**old, "teacher": {**before, **{k: after[k] for k in BUDGET_FIELDS}}}, cfg,
                              RERUN_MAY_CHANGE + ARM_SETTINGS + STUDENT_LENGTH_SETTINGS)
    return before, after, others


def budget_grew_only(cfg: ExperimentConfig) -> bool:
    """Whether the run in ``cfg.out`` differs from ``cfg`` in a larger teacher budget and nothing else: what a
    refusal then suggests (``--extend-teacher``)."""
    try:
        old = json.loads((Path(cfg.out) / "experiment.json").read_text(encoding="utf-8"))
        before, after, others = _budget_change(old, cfg)
    except (OSError, ValueError, TypeError, KeyError):
        return False
    grew = [k for k in BUDGET_FIELDS if before[k] != after[k]]
    return not others and bool(grew) and all(before[k] is not None and after[k] is not None and after[k] > before[k]
                                             for k in grew)


def extend_teacher(cfg: ExperimentConfig) -> dict[str, Any]:
    """Prepare ``cfg.out`` so that the next run continues its teacher's SFT to ``cfg.teacher``'s larger budget
    (see the module's docstring); returns what was done (``from``/``to`` budgets, the checkpoint's step and
    clocks, the learning rate there under the old and the new schedule, where the earlier result went). Refused
    with :class:`SettingsMismatchError`, naming the reason, where anything but the budget differs, the budget
    does not grow, or a stage made from the teacher exists. The same call again, once it has extended the run
    (the budget equal to its last extension's), changes nothing and returns that extension with ``again``: the
    command that started the continuation also resumes it."""
    from agents.llm.training.common import latest_checkpoint, load_trainer_state
    from distill.experiment.stages import read_stage_json

    out = Path(cfg.out)
    record = out / "experiment.json"
    if not record.is_file():
        raise SettingsMismatchError(f"--extend-teacher: {out} holds no run (no experiment.json); start it without "
                                    "--extend-teacher")
    old = read_stage_json(record, "that run's settings record")
    if not isinstance(old, dict) or not isinstance(old.get("teacher"), dict):
        raise SettingsMismatchError(f"--extend-teacher: {record} is not a run's settings (no teacher spec)")
    teacher = out / "teacher"
    if teacher.is_symlink():
        raise SettingsMismatchError(f"--extend-teacher: {teacher} is linked from {os.readlink(teacher)}: extend "
                                    "the teacher in the run that made it")
    before, after, others = _budget_change(old, cfg)
    if others:
        raise SettingsMismatchError(f"--extend-teacher changes the teacher's budget only; these differ too: {others}")
    shrunk = [k for k in BUDGET_FIELDS if before[k] is not None and (after[k] is None or after[k] < before[k])]
    if shrunk:
        raise SettingsMismatchError("--extend-teacher: the budget may only grow; "
                                    + ", ".join(f"teacher.{k} {before[k]} -> {after[k]}" for k in shrunk))
    history = teacher / EXTENSIONS_FILE
    past = read_stage_json(history, "the teacher's extension record") if history.exists() else []
    if all(before[k] == after[k] for k in BUDGET_FIELDS):
        if past and past[-1].get("to") == {k: after[k] for k in BUDGET_FIELDS}:
            # the same command again, after the extension it made: the SFT (or its evaluation) simply resumes
            return {**past[-1], "again": True}
        raise SettingsMismatchError(f"--extend-teacher: the teacher's budget is unchanged ({before['sft_minutes']} "
                                    f"min, {before['sft_steps']} steps): give a larger --teacher-minutes")
    later = [what for name, what in LATER_STAGES if (out / name).exists()]
    if later:
        raise SettingsMismatchError(f"--extend-teacher: {out} already has stages made from this teacher: "
                                    f"{', '.join(later)}; they would describe a teacher that no longer exists: use "
                                    "another --out with --teacher-from, or move them away")
    ckpt = latest_checkpoint(teacher) if teacher.is_dir() else None
    if ckpt is None:
        raise SettingsMismatchError(f"--extend-teacher: {teacher} has no checkpoint to continue; start the run "
                                    "without --extend-teacher")
    state = load_trainer_state(ckpt)
    step, clocks = int(state["step"]), tuple(float(v) for v in state.get("elapsed", (0.0, 0.0)))
    spent = clocks[0 if cfg.teacher.sft_clock == "wall" else 1]
    done = {"from": {k: before[k] for k in BUDGET_FIELDS}, "to": {k: after[k] for k in BUDGET_FIELDS},
            "checkpoint_step": step, "wall_seconds": clocks[0], "cpu_seconds": clocks[1],
            "lr_old_schedule": resume_lr(cfg, spent, step, before["sft_minutes"], before["sft_steps"]),
            "lr_new_schedule": resume_lr(cfg, spent, step, after["sft_minutes"], after["sft_steps"])}
    if (teacher / "result.json").exists():
        kept = teacher / f"before-extension-{step:07d}"
        if kept.exists():
            raise SettingsMismatchError(f"--extend-teacher: {kept} exists already (an earlier extension from the same "
                                        "checkpoint): move it away first")
        kept.mkdir()
        for f in sorted(teacher.glob("teacher*_eval*")) + [teacher / "result.json"]:
            os.replace(f, kept / f.name)
        done["earlier_result"] = str(kept)
    write_text_atomic(history, json.dumps(past + [done], indent=2))
    write_text_atomic(record, json.dumps(_config_record(cfg), indent=2))
    return done


def format_extension(done: dict[str, Any]) -> str:
    """One paragraph saying what :func:`extend_teacher` did and the learning rate the SFT resumes on."""
    budget = lambda b: (f"{b['sft_minutes']:g} min" if b["sft_minutes"] else f"{b['sft_steps']} steps")  # noqa: E731
    kept = f"; its earlier result kept in {done['earlier_result']}" if "earlier_result" in done else ""
    if done.get("again"):  # the extension was made by an earlier call: this one resumes it
        return (f"teacher already extended to {budget(done['to'])} (from step {done['checkpoint_step']:,}): its SFT "
                "resumes from its latest checkpoint")
    return (f"teacher extended from {budget(done['from'])} to {budget(done['to'])}: its SFT resumes at step "
            f"{done['checkpoint_step']:,} ({done['cpu_seconds'] / 60:.1f} CPU-min spent) at lr "
            f"{done['lr_new_schedule']:.2e} (the cosine re-laid over the new budget; {done['lr_old_schedule']:.2e} "
            f"under the old){kept}")


__all__ = ["BUDGET_FIELDS", "EXTENSIONS_FILE", "budget_grew_only", "extend_teacher", "format_extension", "resume_lr"]
