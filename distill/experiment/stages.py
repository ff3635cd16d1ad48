"""The experiment's stages, each cached under ``OUT`` (its ``result.json``; a rerun skips it): the teacher's SFT
(:func:`build_teacher`), the student's weak start (:func:`build_student`), one arm from that start for one training
seed (:func:`arm_config`, :func:`run_arm`), the actor timing of the packings (:func:`actor_timing`) and the
flattened transcript's misalignment (:func:`persistent_diagnostics`), with the greedy evaluation they share
(:func:`distill.experiment.evaluation.evaluate_per_seed`). See :mod:`distill.experiment` for what each stage
writes."""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memenv.files import write_atomic, write_text_atomic
from distill.experiment.config import (ARMS, ENV_ID, SFT_ARMS, ExperimentConfig, ModelSpec, SettingsMismatchError,
                                       pool_env_kwargs)
from distill.experiment.evaluation import PROBE_SEED_BASE, evaluate_per_seed, make_env_fn
from distill.stats import standard_error


def _log(cfg: ExperimentConfig, text: str) -> None:
    if cfg.progress:
        print(text, flush=True)


def _done(path: Path) -> dict[str, Any] | None:
    """A stage's cached result, or None. One without the scores every stage records was made by another version
    of the experiment: refused (:class:`SettingsMismatchError`) rather than failing later on a missing key."""
    f = path / "result.json"
    if not f.exists():
        return None
    res = read_stage_json(f, "that stage's result")
    missing = [key for key in ("f1", "em", "seen_f1") if not isinstance(res, dict) or key not in res]
    if missing:
        raise SettingsMismatchError(f"{f} was made by another version of the experiment (no {', '.join(missing)}); "
                                    f"use another --out, or delete {path} to make that stage again")
    return relocated(res, path)


class StageFileError(SettingsMismatchError):
    """A cached stage's file cannot be read (cut short, not JSON) or names a checkpoint that is gone: one line
    naming the file; the stage is redone only when the user deletes what the message names."""


def read_stage_json(path: Path, what: str) -> Any:
    """The JSON of a stage's file, or :class:`StageFileError` naming it (a file cut short by a full disk or a
    copy, or edited by hand): the run stops there rather than redoing a stage the user may want to keep."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise StageFileError(f"{path} is damaged ({type(exc).__name__}: {reason}): delete it to redo {what} "
                             "(the stage's checkpoints are kept), or restore it") from None


def _under_stage(stored: str, stage: Path) -> Path | None:
    """Where ``stored`` (an absolute path written by a stage in ``stage``'s folder, before the run folder was
    moved or copied) is now: its part after the last folder named like ``stage``, under ``stage``."""
    parts = Path(stored).parts
    if stage.name not in parts:
        return None
    tail = parts[len(parts) - parts[::-1].index(stage.name):]
    return stage.joinpath(*tail)


def relocated(res: dict[str, Any], stage: Path) -> dict[str, Any]:
    """``res`` with its checkpoint ``path`` re-resolved under ``stage`` when the stored absolute path is gone (the
    run folder was moved or copied: a rerun resumes from where the folder is now); a path found nowhere is a
    :class:`StageFileError` naming it."""
    stored = res.get("path")
    if not isinstance(stored, str) or Path(stored).exists():
        return res
    moved = _under_stage(stored, stage)
    if moved is None or not moved.exists():
        raise StageFileError(f"{stage / 'result.json'} names the checkpoint {stored}, which is gone (and is not "
                             f"under {stage} either): delete {stage / 'result.json'} to redo that stage's evaluation")
    return {**res, "path": str(moved.resolve())}


def _portable(settings: dict[str, Any]) -> dict[str, Any]:
    """Arm settings with the checkpoint paths of this run's own stages (``model``: the student's, ``teacher``:
    the teacher's) reduced to their part under the run folder, so that a moved run folder still matches."""
    out = dict(settings)
    for key, name in (("model", "student"), ("teacher", "teacher")):
        value = out.get(key)
        if isinstance(value, str) and name in Path(value).parts:
            parts = Path(value).parts
            out[key] = str(Path(*parts[len(parts) - 1 - parts[::-1].index(name):]))
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=float))


def _sft_config(cfg: ExperimentConfig, spec: ModelSpec, out: Path, model: str | None = None, **overrides: Any):
    from agents.llm.training.sft import SFTConfig

    return SFTConfig(**{**_sft_settings(cfg, spec, out, model), **overrides})


def _sft_settings(cfg: ExperimentConfig, spec: ModelSpec, out: Path, model: str | None) -> dict[str, Any]:
    return dict(env_id=ENV_ID, env_kwargs=pool_env_kwargs(cfg, "train"), out_dir=str(out), model=model, seed=0,
                     episodes=spec.sft_episodes, demo_worlds=spec.sft_worlds, steps=spec.sft_steps, batch_size=16,
                     lr=spec.lr, warmup=spec.warmup if spec.warmup is not None else min(100, max(1, spec.sft_steps // 10)),
                     autocast="auto", bucket=8,
                     # unpadded widths, as every experiment's SFT was made (the fair run's teacher included): its
                     # buckets of similar lengths already bound the shapes the bf16 kernels see
                     pad_multiple=1,
                     schedule_by="budget" if spec.sft_minutes else "steps", tiny_split_spaces="suffix",
                     tiny_vocab=cfg.vocab, tiny_min_frequency=1, tiny_tokenizer_episodes=cfg.tokenizer_episodes,
                     # A model from scratch also learns the task text (an LM loss on 30% of the observation tokens);
                     # a pretrained base needs no such pretraining.
                     prompt_loss_weight=0.0 if cfg.model else 1.0, prompt_loss_fraction=0.3, eval_every=spec.curve_every,
                     eval_episodes=spec.curve_episodes,
                     save_every=10 if cfg.model else 250,  # a pretrained base's SFT step costs ~1 CPU-min
                     keep_checkpoints=1, max_seconds=spec.sft_minutes * 60 if spec.sft_minutes else None,
                     budget_clock=spec.sft_clock, threads=cfg.sft_threads, tiny_hidden=spec.hidden,
                     tiny_layers=spec.layers, tiny_heads=spec.heads, max_new_tokens=cfg.max_new_tokens,
                     num_envs=cfg.num_envs, resume=True, progress=cfg.progress, views=spec.sft_views,
                     demo_env_overrides=dict(spec.sft_env), demo_forget_rate=spec.sft_forget_rate,
                     demo_expert=spec.sft_demo_expert,
                     # a pretrained base's activations at 16 long invocations outgrow a 24 GiB machine (SmolLM2's 30
                     # layers: OOM at ~24 GB), so they are recomputed in the backward
                     gradient_checkpointing=bool(cfg.model))


def _trained(out: Path):
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import latest_checkpoint

    return load_pretrained(latest_checkpoint(out))


def _sft_finished(out: Path, spec: ModelSpec) -> dict[str, Any] | None:
    """The last metrics row of an SFT run whose latest checkpoint already spent its steps or time budget (a
    resume would rebuild the demonstrations only to take one more step), else None."""
    from agents.llm.training.common import latest_checkpoint, load_trainer_state

    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return None
    state = load_trainer_state(ckpt)
    spent = state.get("elapsed", (0.0, 0.0))[0 if spec.sft_clock == "wall" else 1]
    if int(state["step"]) < spec.sft_steps and not (spec.sft_minutes and spent >= spec.sft_minutes * 60):
        return None
    rows = pd.read_csv(out / "metrics.csv")
    return rows[rows["step"] <= int(state["step"])].iloc[-1].to_dict()


def _evaluate_both(lm, tok, cfg: ExperimentConfig, out: Path, name: str,
                   view: str = "memory") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Held-out and seen evaluations of ``lm`` acting in ``view``, written to ``out/{name}_eval.csv`` and
    ``{name}_eval_seen.csv`` (``{name}_persistent_eval.csv`` ... in the persistent view)."""
    name = name if view == "memory" else f"{name}_{view}"
    held = evaluate_per_seed(lm, tok, cfg, pool="heldout", view=view, cache=out / f"{name}_eval.csv")
    seen = evaluate_per_seed(lm, tok, cfg, pool="train", episodes=cfg.seen_eval_episodes, view=view,
                             cache=out / f"{name}_eval_seen.csv")
    return held, seen


def _persistent_view_eval(lm, tok, cfg: ExperimentConfig, out: Path) -> dict[str, float]:
    """The teacher's greedy F1 *acting* in the flattened transcript (the view the teacher-persistent control scores
    it in), on the same held-out and seen episodes as in the memory view: a control that changes one thing needs a
    teacher about as good in both (``view_gap``: memory-view minus persistent-view held-out F1)."""
    held, seen = _evaluate_both(lm, tok, cfg, out, "teacher", view="persistent")
    memory = pd.read_csv(out / "teacher_eval.csv")
    return {"persistent_f1": float(held.f1.mean()), "persistent_f1_se": standard_error(held.f1),
            "persistent_seen_f1": float(seen.f1.mean()), "persistent_seen_f1_se": standard_error(seen.f1),
            "view_gap": float(memory.f1.mean() - held.f1.mean()),
            "view_gap_se": standard_error(memory.f1.to_numpy() - held.f1.to_numpy()),
            "persistent_turns": float(held.turns.mean())}


def _pretrained_init(cfg: ExperimentConfig, layers: int, folder: Path, keep_last: int = 0) -> str:
    """The starting weights of a model made from ``cfg.model``: the base folder itself when ``layers`` is 0 or
    keeps every decoder layer and ``cfg.system_prompt`` is unset, else (once) its first ``layers`` layers (all
    when 0; with ``keep_last``, the first ``layers - keep_last`` and the last ``keep_last``:
    :func:`agents.llm.models.pretrained.shrink`) saved to ``folder`` with the tokenizer and the prompt settings
    (``cfg.system_prompt`` when set)."""
    from agents.llm.models.local import load_pretrained, save_pretrained
    from agents.llm.models.pretrained import resolve, shrink

    base = resolve(cfg.model)
    depth = json.loads((base / "config.json").read_text()).get("num_hidden_layers")
    whole = depth is None or layers == 0 or layers >= int(depth)
    if whole and cfg.system_prompt is None:
        return str(base)
    if not (folder / "config.json").exists():
        lm, tok = load_pretrained(base)
        if cfg.system_prompt is not None:
            tok.memenv_prompt = {**(getattr(tok, "memenv_prompt", None) or {}), "system_prompt": cfg.system_prompt}
        save_pretrained(lm if whole else shrink(lm, int(layers), keep_last=int(keep_last)), tok, folder)
    return str(folder)


def build_teacher(cfg: ExperimentConfig) -> dict[str, Any]:
    """SFT the teacher (resumes a partial run), then evaluate it; cached in ``OUT/teacher/result.json``."""
    from agents.llm.training.sft import train_sft
    from agents.llm.training.common import Timer, latest_checkpoint

    out = Path(cfg.out) / "teacher"
    if (res := _done(out)) is not None:
        missing = {"train_draw_f1": bool(cfg.env_kwargs.get("fresh_facts")), "persistent_f1": True}
        if any(on and key not in res for key, on in missing.items()):  # cached before these figures existed
            lm, tok = _trained(out)
            if missing["train_draw_f1"] and "train_draw_f1" not in res:
                res.update(_train_draw_eval(lm, tok, cfg, out))
            if "persistent_f1" not in res:
                res.update(_persistent_view_eval(lm, tok, cfg, out))
            _write_json(out / "result.json", res)
        return res
    timer = Timer()
    base = _pretrained_init(cfg, cfg.teacher.layers, out / "init", cfg.teacher.keep_last) if cfg.model else None
    row = _sft_finished(out, cfg.teacher) or train_sft(_sft_config(cfg, cfg.teacher, out, model=base))
    lm, tok = _trained(out)
    held, seen = _evaluate_both(lm, tok, cfg, out, "teacher")
    res = {"path": str(latest_checkpoint(out).resolve()), "steps": int(row.get("step")),
           "train_cpu_seconds": row.get("cpu_seconds"), "train_wall_seconds": row.get("seconds"),
           "f1": float(held.f1.mean()), "em": float(held.em.mean()), "f1_se": standard_error(held.f1),
           "seen_f1": float(seen.f1.mean()), "seen_f1_se": standard_error(seen.f1), "stage_cpu_seconds": timer.cpu(),
           "parameters": sum(p.numel() for p in lm.parameters()), **asdict(cfg.teacher)}
    if cfg.env_kwargs.get("fresh_facts"):
        res.update(_train_draw_eval(lm, tok, cfg, out))
    res.update(_persistent_view_eval(lm, tok, cfg, out))
    if (out / "extensions.json").exists():  # continued past an earlier budget (distill.experiment.extend)
        res["extensions"] = read_stage_json(out / "extensions.json", "the teacher's extension record")
    _write_json(out / "result.json", res)
    return res


def _train_draw_eval(lm, tok, cfg: ExperimentConfig, out: Path) -> dict[str, float]:
    """Fresh world: the teacher's F1 on *training draws* (the first ``seen_eval_episodes`` SFT demonstration seeds:
    facts, documents and questions it was trained on), written to ``teacher_eval_train_draws.csv``. A reader scores
    about as well on held-out draws; a model that recalls its training episodes scores higher here."""
    seeds = range(min(cfg.seen_eval_episodes, cfg.teacher.sft_episodes))
    drawn = evaluate_per_seed(lm, tok, cfg, seeds=seeds, pool="train", cache=out / "teacher_eval_train_draws.csv")
    return {"train_draw_f1": float(drawn.f1.mean()), "train_draw_f1_se": standard_error(drawn.f1)}


def _probe_schedule(cfg: ExperimentConfig) -> list[int]:
    """The SFT step counts at which the weak start is probed: ``cfg.student_probes`` (else every
    ``student.sft_steps`` steps), those past ``student_max_steps`` dropped, ending at ``student_max_steps``."""
    cap = cfg.student_max_steps
    points = cfg.student_probes or range(cfg.student.sft_steps, cap + 1, cfg.student.sft_steps)
    return sorted({n for n in points if n < cap} | {cap})


class WeakStartNotReached(SettingsMismatchError):
    """The weak start's probes stayed at or below the window's floor up to ``student_max_steps``: no start is
    written (a rerun with more steps resumes the SFT); reported in one line like a settings mismatch."""


def weak_start_verdict(probe_f1: float, floor: float, ceiling: float | None) -> str:
    """The weak start's stop rule at one probe: ``"continue"`` while its F1 is <= ``floor`` (no learning visible
    yet); with a ``ceiling`` (the window rule, ``ExperimentConfig.student_start_ratio`` x the teacher's F1),
    ``"stop"`` in (floor, ceiling] and ``"overshot"`` above it (the window fell between two probes; the start is
    stronger than asked, and more SFT would only make it stronger); without one (the rule before issue 47),
    ``"stop"`` at F1 >= ``floor``."""
    if ceiling is None:
        return "stop" if probe_f1 >= floor else "continue"
    if probe_f1 <= floor:
        return "continue"
    return "stop" if probe_f1 <= ceiling else "overshot"


def plateau_verdict(probes: list[dict[str, Any]], tolerance: float) -> str:
    """The plateau rule (``ExperimentConfig.student_plateau``): ``"plateau"`` once the last probe's F1 exceeds the
    best earlier probe's by less than ``tolerance`` (more SFT no longer improves the start), else ``"continue"``."""
    if len(probes) < 2:
        return "continue"
    best = max(p["probe_f1"] for p in probes[:-1])
    return "plateau" if probes[-1]["probe_f1"] - best < tolerance else "continue"


def _start_window(cfg: ExperimentConfig, teacher: dict[str, Any]) -> tuple[float, float | None]:
    """The window's floor and ceiling: ``student_start_f1`` (raised to ``student_start_floor_ratio`` x the
    teacher's held-out F1 where set) and ``student_start_ratio`` x that F1 (the figure the issue's "<= 0.4 of the
    teacher's" names; the probes themselves are train-pool episodes, so the choice never sees evaluation
    episodes), or None (the rule before issue 47)."""
    floor = cfg.student_start_f1
    if cfg.student_start_floor_ratio is not None:
        floor = max(floor, cfg.student_start_floor_ratio * float(teacher["f1"]))
    return floor, None if cfg.student_start_ratio is None else cfg.student_start_ratio * float(teacher["f1"])


def build_student(cfg: ExperimentConfig, teacher: dict[str, Any]) -> dict[str, Any]:
    """The student on the teacher's tokenizer (a tiny model, a cut of the pretrained base, or the whole base),
    weakly SFT'd until a probe meets the stop rule (:func:`weak_start_verdict`); its per-episode start evaluations
    are saved."""
    from agents.llm.models.local import build_tiny_model, load_tokenizer, save_pretrained
    from agents.llm.training.sft import train_sft
    from agents.llm.training.common import latest_checkpoint, load_trainer_state

    out = Path(cfg.out) / "student"
    if (res := _done(out)) is not None:
        return res
    tok = load_tokenizer(teacher["path"])
    init = out / "init"
    if cfg.model:
        init = Path(_pretrained_init(cfg, cfg.student.layers, init, cfg.student.keep_last))
    elif not (init / "config.json").exists():
        save_pretrained(build_tiny_model(tok, seed=1, hidden_size=cfg.student.hidden, layers=cfg.student.layers,
                                         heads=cfg.student.heads), tok, init)
    probe_seeds = range(PROBE_SEED_BASE, PROBE_SEED_BASE + cfg.probe_episodes)
    probes_path = out / "probes.json"
    probes = read_stage_json(probes_path, "the weak start's probes") if probes_path.exists() else []
    done = latest_checkpoint(out / "sft")
    done_steps = int(load_trainer_state(done)["step"]) if done is not None else 0
    schedule = _probe_schedule(cfg)
    floor, ceiling = _start_window(cfg, teacher)
    if ceiling is not None and floor >= ceiling:  # a teacher too weak for a weak start with learning visible
        _log(cfg, f"warning: the start window ({floor:.3g}, {ceiling:.3f}] is empty (the teacher's held-out F1 "
                  f"{float(teacher['f1']):.3f}): the first probe above {floor:.3g} stops the SFT, flagged overshot")
    # A resumed run continues at the first probe point at or after its last checkpoint.
    steps = next((n for n in schedule if n >= done_steps), schedule[-1])
    while True:  # SFT rounds (each resumes the last) until the probe F1 reaches the weak-start target
        spec = replace(cfg.student, sft_steps=steps)
        # A constant learning rate after warm-up (min_lr_ratio 1): a cosine over each round's end would spend
        # every later round near its floor.
        row = _sft_finished(out / "sft", spec) or train_sft(_sft_config(cfg, spec, out / "sft", model=str(init),
                                                                        min_lr_ratio=1.0))
        lm, tok = _trained(out / "sft")
        if not probes or probes[-1]["steps"] != steps:  # probes: train-pool questions (model selection)
            probes.append({"steps": steps, "probe_f1": float(evaluate_per_seed(lm, tok, cfg, probe_seeds,
                                                                               pool="train").f1.mean())})
            write_text_atomic(probes_path, json.dumps(probes))
        if cfg.student_plateau is not None:
            verdict = plateau_verdict(probes, cfg.student_plateau)
            target = f"plateau rule (< {cfg.student_plateau:g} over the best earlier probe): {verdict}"
        else:
            verdict = weak_start_verdict(probes[-1]["probe_f1"], floor, ceiling)
            target = (f"window ({floor:.3g}, {ceiling:.3f}]: {verdict}" if ceiling is not None
                      else f"weak-start target {floor}")
        _log(cfg, f"student after {steps} SFT steps: probe F1 {probes[-1]['probe_f1']:.3f} ({target})")
        if verdict != "continue" or steps >= cfg.student_max_steps:
            break
        steps = next(n for n in schedule if n > steps)
    if cfg.student_plateau is None and ceiling is not None and verdict == "continue":
        raise WeakStartNotReached(
            f"the student's probe F1 stayed <= {floor:.3g} up to student_max_steps "
            f"{cfg.student_max_steps} (last {probes[-1]['probe_f1']:.3f}): rerun with a larger --student-max-steps "
            f"(its SFT resumes from {out / 'sft'}), or a deeper student")
    if verdict == "overshot":
        _log(cfg, f"warning: the student's probe F1 {probes[-1]['probe_f1']:.3f} overshot the window's ceiling "
                  f"{ceiling:.3f} between two probes: a stronger start than asked (student_probes finer there "
                  "would catch the window)")
    held, seen = _evaluate_both(lm, tok, cfg, out, "start")
    res = {"path": str(latest_checkpoint(out / "sft").resolve()), "steps": row.get("step"),
           "train_cpu_seconds": row.get("cpu_seconds"), "f1": float(held.f1.mean()), "em": float(held.em.mean()),
           "f1_se": standard_error(held.f1), "seen_f1": float(seen.f1.mean()), "seen_f1_se": standard_error(seen.f1),
           "parameters": sum(p.numel() for p in lm.parameters()), "probes": probes,
           **({"start_window": {"floor": floor, "ceiling": ceiling, "verdict": verdict}}
              if ceiling is not None and cfg.student_plateau is None else {}),
           **({"plateau": {"tolerance": cfg.student_plateau, "verdict": verdict}}
              if cfg.student_plateau is not None else {}),
           **asdict(replace(cfg.student, sft_steps=steps))}
    _write_json(out / "result.json", res)
    return res


def arm_config(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any], teacher: dict[str, Any],
               matched_from: Path | None = None):
    """The GRPO (``rl``) or MemOPD config of one arm; every arm shares the RL hyper-parameters and trains on the
    ``train`` question pool. A checkpoint after every update (the run resumes from the last one, exactly) of which
    those every ``curve_every`` updates are kept (the learning curve's points). The teacher-free control's constant
    comes from the same seed's MemOPD arm run, or from ``matched_from`` (a sweep run's folder)."""
    from agents.llm.training.ppo import PPOConfig
    from distill.trainer import MemOPDConfig

    curve_every = min(cfg.curve_every, cfg.updates)
    lr = cfg.rl_lr if arm == "rl" and cfg.rl_lr is not None else cfg.lr_by_arm.get(arm, cfg.lr)
    common = dict(algo="grpo", env_id=ENV_ID, env_kwargs=pool_env_kwargs(cfg, "train"), model=student["path"],
                  out_dir=str(Path(cfg.out) / "arms" / arm / f"seed{seed}"), seed=seed, updates=cfg.updates,
                  episodes_per_update=cfg.tasks_per_update * cfg.group_size, group_size=cfg.group_size,
                  lr=lr, kl_coef=cfg.kl_coef, temperature=cfg.temperature, epochs=2, num_minibatches=2,
                  eval_every=0, save_every=1, keep_checkpoints=1, keep_every=curve_every,
                  max_new_tokens=cfg.max_new_tokens, num_envs=cfg.num_envs, threads=cfg.threads,
                  progress=cfg.progress, resume=True,
                  **({"train_autocast": cfg.train_autocast} if cfg.train_autocast is not None else {}),
                            warmup_updates=cfg.warmup_updates, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha)
    fields = ARMS[arm][1]
    if fields is None:
        return PPOConfig(**common)
    if arm in SFT_ARMS:
        raise ValueError(f"{arm} is trained by SFT, not GRPO: distill.experiment.baselines.run_sft_arm runs it")
    # The actor keeps shared_prefix (in fp32 unless train_autocast says otherwise); the frozen teacher's scoring may
    # use another packing and dtype (ExperimentConfig.teacher_packing / teacher_dtype; unset: the trainer's defaults).
    teacher_kw = {k: getattr(cfg, k) for k in ("teacher_packing", "teacher_dtype") if getattr(cfg, k) is not None}
    if fields.get("distill_signal") == "constant":  # no teacher: MemOPD's mean distillation loss, same seed
        teacher_kw["constant_signal"] = matched_constant(cfg, seed, matched_from)
    return MemOPDConfig(**common, teacher=teacher["path"], distill_coef=cfg.distill_coef, packing="shared_prefix",
                        attention_backend=cfg.attention_backend, **teacher_kw, **fields)


def matched_constant(cfg: ExperimentConfig, seed: int, run: Path | None = None) -> float:
    """The teacher-free control's negative advantage for training seed ``seed``: the mean distillation loss per
    action token (over its updates) of the same seed's MemOPD run (or of the MemOPD run in folder ``run``), which
    must have finished first."""
    result = (run or Path(cfg.out) / "arms" / "memopd" / f"seed{seed}") / "result.json"
    if not result.exists():
        raise ValueError(f"the teacher-free control of seed {seed} is matched to MemOPD's run of that seed, which has "
                         f"not finished ({result} is missing): run the memopd arm first")
    value = read_stage_json(result, "MemOPD's run of that seed").get("distill_loss")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{result}: no mean distillation loss to match (distill_loss {value!r})")
    return float(value)


# Fields of an arm's trainer config that do not change what it learns (where it writes, how it shows progress, how
# often it checkpoints, how it computes the same values: the sampler's prefill, the fused LM head, the scoring passes
# an update saves): left out of the settings a cached or partial run is checked against.
_NOT_SETTINGS = ("out_dir", "progress", "threads", "resume", "save_every", "keep_checkpoints", "keep_every",
                 "generation", "fused_head", "old_logprobs_from_first_forward", "ref_logprobs_from_actor")


def _arm_settings(cfg: ExperimentConfig, run_cfg) -> dict[str, Any]:
    settings = {k: v for k, v in asdict(run_cfg).items() if k not in _NOT_SETTINGS}
    settings["evaluation"] = {k: getattr(cfg, k) for k in ("eval_episodes", "seen_eval_episodes", "curve_every",
                                                           "curve_episodes", "heldout_fraction")}
    if cfg.probe_curve:  # only when on: runs made before it existed keep their settings
        settings["evaluation"].update(probe_curve=True, probe_episodes=cfg.probe_episodes)
    return json.loads(json.dumps(settings, default=list))


# Trainer settings added after earlier runs were made, with the value those runs had: a cached run whose settings
# lack one was made with that value.
_ADDED_LATER = {"warmup_updates": 0, "lora_rank": 0, "lora_alpha": None, "distill_signal": "teacher",
                "constant_signal": 0.0,
                "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def _same_settings(old: dict[str, Any], settings: dict[str, Any]) -> bool:
    old = {**{k: v for k, v in _ADDED_LATER.items() if k in settings}, **old}
    return _portable({k: v for k, v in old.items() if k not in _NOT_SETTINGS}) == _portable(settings)


def _settings_mismatch(path: Path, old: dict[str, Any], settings: dict[str, Any], what: str) -> SettingsMismatchError:
    old, settings = _portable(old), _portable(settings)
    changed = sorted(k for k in (set(settings) | set(old)) - set(_NOT_SETTINGS) if old.get(k) != settings.get(k))
    return SettingsMismatchError(f"{path} {what} with other settings ({', '.join(changed)}): use another --out, "
                                 "or delete that folder to retrain it")


def run_arm(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any], teacher: dict[str, Any]) -> dict:
    """Train one arm from the student start for ``cfg.updates`` updates, then evaluate it: held-out and seen
    questions at the end, held-out curve points at each intermediate checkpoint (which are then removed).

    An interrupted run resumes from its last update's checkpoint and ends as the uninterrupted run would have
    (the trainer restores every RNG); ``OUT/arms/ARM/seedS/settings.json`` guards a resume against another
    configuration, as ``result.json`` does for a finished run."""
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.ppo import train_rl
    from agents.llm.training.common import checkpoints
    from distill.trainer import train_memopd

    if arm in SFT_ARMS:
        raise ValueError(f"{arm} is trained by SFT: distill.experiment.baselines.run_sft_arm runs it")
    out = Path(cfg.out) / "arms" / arm / f"seed{seed}"
    run_cfg = arm_config(cfg, arm, seed, student, teacher)
    settings = _arm_settings(cfg, run_cfg)
    if (res := _done(out)) is not None:
        if not _same_settings(res.get("settings", settings), settings):  # another configuration is not this arm
            raise _settings_mismatch(out / "result.json", res["settings"], settings, "was trained")
        return res
    started = out / "settings.json"
    if checkpoints(out):
        old = read_stage_json(started, "this arm's run from its start") if started.exists() else None
        if old is None:  # a partial run from before resumable arms (no settings kept): train it again from the start
            for path in checkpoints(out).values():
                shutil.rmtree(path)
        elif not _same_settings(old, settings):
            raise _settings_mismatch(started, old, settings, "began a run")
    _write_json(started, settings)
    lm, tok = load_pretrained(student["path"])
    if ARMS[arm][1] is None:
        train_rl(run_cfg, model=lm, tokenizer=tok)
    else:
        train_memopd(run_cfg, model=lm, tokenizer=tok)
    saved = checkpoints(out)
    lm, tok = load_pretrained(saved[cfg.updates])  # the trained weights, also when the run resumed from disk
    held, seen = _evaluate_both(lm, tok, cfg, out, "end")
    curve = [held.head(cfg.curve_episodes).assign(update=cfg.updates)]
    for update, path in sorted(saved.items()):
        if update < cfg.updates:
            mid_lm, mid_tok = load_pretrained(path)
            curve.append(evaluate_per_seed(mid_lm, mid_tok, cfg, pool="heldout", episodes=cfg.curve_episodes,
                                           cache=out / f"curve_update{update}_eval.csv").assign(update=update))
    curve_frame = pd.concat(curve).sort_values(["update", "seed"], kind="stable")[["update", "seed", "f1", "em"]]
    write_atomic(out / "curve.csv", lambda tmp: curve_frame.to_csv(tmp, index=False))
    if cfg.probe_curve:  # train-pool probe F1 at every curve point: a pilot's training length is read from it
        probe_seeds = range(PROBE_SEED_BASE, PROBE_SEED_BASE + cfg.probe_episodes)
        points = []
        for update, path in sorted(saved.items()):
            point_lm, point_tok = load_pretrained(path)
            rows = evaluate_per_seed(point_lm, point_tok, cfg, probe_seeds, pool="train",
                                     cache=out / f"probe_update{update}_eval.csv")
            points.append({"update": update, "probe_f1": float(rows.f1.mean())})
        write_atomic(out / "probe_curve.csv", lambda tmp: pd.DataFrame(points).to_csv(tmp, index=False))
    metrics = pd.read_csv(out / "metrics.csv")
    train_cpu = float(metrics["cpu_seconds"].iloc[-1])  # the trainer's clock, continued across resumes
    res = {"arm": arm, "seed": seed, "train_cpu_seconds": train_cpu, "f1": float(held.f1.mean()),
           "em": float(held.em.mean()), "seen_f1": float(seen.f1.mean()),
           "update_s": float(metrics["update_s"].mean()), "rollout_s": float(metrics["rollout_s"].mean()),
           "approx_kl_first": float(metrics["approx_kl"].iloc[0]) if "approx_kl" in metrics else math.nan,
           "clipfrac_first": float(metrics["clipfrac"].iloc[0]) if "clipfrac" in metrics else math.nan,
           **{k: float(metrics[k].mean()) for k in ("credit_share", "credit_mean", "flat_credited_tokens",
                                                    "zero_variance_groups", "distill_loss") if k in metrics},
           "settings": settings}
    _write_json(out / "result.json", res)
    for update, path in saved.items():  # intermediate checkpoints were kept only for their curve points
        if update < cfg.updates:
            shutil.rmtree(path)
    return res


def _sample_records(lm, tok, cfg: ExperimentConfig, episodes: int, seed: int = 123, first_task: int = 9 * 10**6):
    """One GRPO-shaped batch of training-temperature episodes (records for timing and diagnostics); task seeds
    from ``first_task`` on (another ``first_task`` and ``seed``: an independent batch)."""
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.rollouts import records_of, rollout

    env_fn = make_env_fn(cfg)
    group = cfg.group_size
    tasks = max(1, episodes // group)
    seeds = [first_task + t for t in range(tasks) for _ in range(group)]
    policy = LLMPolicy(lm, tok, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=seed)
    eps = rollout(policy, [env_fn() for _ in range(cfg.num_envs)], seeds,
                  groups=[t for t in range(tasks) for _ in range(group)])
    return records_of(eps)


def actor_timing(cfg: ExperimentConfig, student: dict[str, Any]) -> pd.DataFrame:
    """Actor forward+backward CPU seconds on one update's records of the start student, per reconstruction and
    layout: the naive padded baseline (record order, dense-mask sdpa: ``("padded", "auto")``), padded with
    ``sdpa_blocks``, length-sorted padded buckets under the same token budget with both attentions (the best
    padded baseline is the fastest of these four), shared-prefix packing (dense mask and the arms'
    ``attention_backend``) and the prefix tree. Every layout first runs once untimed (warm-up); then
    ``timing_rounds`` rounds run every layout, in an order rotated by one each round, at the arms' thread count
    (``threads``), and each figure is the median over the rounds. Also the longest scored sequence (peak tokens
    the actor and the teacher see per sequence), and each layout's ratio to both baselines."""
    import torch

    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import ActorCritic
    from distill.reconstruct import reconstruct
    from distill.teacher import ScoringLayout
    from distill.trainer import PackedActorForward

    path = Path(cfg.out) / "timing.csv"
    if path.exists():
        return pd.read_csv(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)  # the arms' threads (the SFT stages before may have set more)
    try:
        lm, tok = load_pretrained(student["path"])
        records = _sample_records(lm, tok, cfg, cfg.tasks_per_update * cfg.group_size)
        module = ActorCritic(lm)
        padded = [("padded", "auto"), ("padded", "sdpa_blocks"), ("sorted_padded", "auto"),
                  ("sorted_padded", "sdpa_blocks")]
        layouts = list(dict.fromkeys(padded + [("shared_prefix", "auto"), ("shared_prefix", cfg.attention_backend),
                                               ("prefix_tree", "sdpa_blocks")]))
        rows = []
        for reconstruction in ("aligned", "persistent"):
            peak = max(len(s) for s in reconstruct(records, reconstruction, tok))
            forwards = {key: PackedActorForward(ScoringLayout(reconstruction, key[0], 4096, key[1]), tok)
                        for key in layouts}
            times: dict[tuple[str, str], list[float]] = {key: [] for key in layouts}
            tokens = {}
            for round_ in range(cfg.timing_rounds + 1):  # round 0: warm-up, not timed
                shift = round_ % len(layouts)
                for key in layouts[shift:] + layouts[:shift]:
                    t0 = time.process_time()
                    out = forwards[key](module, records, temperature=cfg.temperature, entropy=True)
                    (out.logp.sum() + out.entropy.sum()).backward()
                    if round_:
                        times[key].append(time.process_time() - t0)
                    module.zero_grad(set_to_none=True)
                    tokens[key] = int(out.logp.numel())
            median = {key: float(np.median(v)) for key, v in times.items()}
            best = min(padded, key=median.__getitem__)
            for packing, backend in layouts:
                t = median[packing, backend]
                rows.append({"reconstruction": reconstruction, "packing": packing, "backend": backend,
                             "records": len(records), "action_tokens": tokens[packing, backend],
                             "peak_scored_tokens": peak, "actor_cpu_s": t,
                             "x_vs_naive_padded": median["padded", "auto"] / t,
                             "x_vs_best_padded": median[best] / t, "best_padded": f"{best[0]} {best[1]}",
                             "rounds": cfg.timing_rounds, "threads": torch.get_num_threads()})
    finally:
        torch.set_num_threads(threads)
    table = pd.DataFrame(rows)
    write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))
    return table


def persistent_diagnostics(cfg: ExperimentConfig) -> pd.DataFrame | None:
    """:func:`distill.diagnose.diagnose` (aligned vs persistent) on records sampled by the flattening arm's
    final student of the first seed (the model that sampled them, as diagnose requires): how far the flattened
    transcript moves the log-probs from the sampled ones (why that arm recomputes its old log-probs)."""
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import latest_checkpoint
    from distill.diagnose import diagnose

    path = Path(cfg.out) / "diagnostics.csv"
    if path.exists():
        return pd.read_csv(path)
    ckpt = latest_checkpoint(Path(cfg.out) / "arms" / "flattening" / "seed0")
    if ckpt is None:
        return None
    lm, tok = load_pretrained(ckpt)
    records = _sample_records(lm, tok, cfg, cfg.diagnose_episodes)
    table = diagnose(records, lm, tok, clip=0.2, methods=("aligned", "persistent"))
    write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))
    return table


__all__ = ["build_teacher", "build_student",
           "WeakStartNotReached", "weak_start_verdict", "plateau_verdict", "arm_config", "matched_constant",
           "run_arm", "actor_timing", "persistent_diagnostics"]
