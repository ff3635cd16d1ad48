"""The fair-evidence stages beside the GRPO arms: the equal-cost alternatives to on-policy distillation (SFT of the
start student for the CPU of the same seed's MemOPD run: :func:`run_sft_arm`) and GRPO alone's learning-rate sweep
on train-pool probe episodes (:func:`sweep_jobs`, :func:`run_sweep_point`, :func:`choose_rl_lr`). Each is cached
under ``OUT`` like the arms, with its settings guarded, and resumes."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memenv.files import write_atomic
from distill.experiment.config import ARMS, ExperimentConfig
from distill.experiment.evaluation import PROBE_SEED_BASE, evaluate_per_seed, make_env_fn
from distill.experiment.stages import (_arm_settings, _done, _evaluate_both, _portable, _same_settings,
                                       _settings_mismatch, _sft_config, _sft_finished, _write_json, arm_config)

#: Task seeds of the SFT arms' data (train-pool questions; disjoint from SFT, probe, evaluation and GRPO seeds):
#: training seed s of the oracle-demonstration arm plays base + s * SFT_ARM_SEED_STRIDE + i.
SFT_ARM_SEED_BASE = {"oracle": 5 * 10**7, "teacher": 6 * 10**7}
SFT_ARM_SEED_STRIDE = 10**5
#: Oracle demonstrations of the continued-SFT arm (each its own fact draw in the fresh world; the CPU budget, not
#: this count, ends its training: ~5 epochs at the fresh preset's budget).
SFT_ARM_DEMOS = 2000
#: Teacher episodes sampled per batch by the sequence-level distillation arm (until its sampling share is spent).
SEQKD_BATCH = 32


def _equal_cpu_budget(cfg: ExperimentConfig, arm: str, seed: int) -> float:
    ref = _done(Path(cfg.out) / "arms" / cfg.equal_cpu_arm / f"seed{seed}")
    if ref is None:
        raise RuntimeError(f"arm {arm} seed {seed} trains for the CPU time of {cfg.equal_cpu_arm} seed {seed}, "
                           "which has not run yet: run that arm first")
    return float(ref["train_cpu_seconds"])


def _teacher_episodes(cfg: ExperimentConfig, teacher: dict[str, Any], seed: int, cpu_budget: float,
                      path: Path) -> tuple[list, float, int]:
    """Sequence-level distillation's data: the teacher's greedy episodes (memory view) on new train-pool tasks,
    batch by batch until ``cpu_budget`` CPU seconds are spent; each invocation one :class:`Demonstration` (no
    filtering by reward: the teacher's mode, as in sequence-level KD). Cached in ``path`` with the CPU it cost."""
    from agents.llm.models.local import load_pretrained
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.records.invocation import memory_mask
    from agents.llm.records.rollouts import records_of, rollout
    from agents.llm.training.sft import Demonstration

    if path.exists():
        saved = json.loads(path.read_text())
        return [Demonstration(*d, None) for d in saved["demonstrations"]], float(saved["cpu_seconds"]), \
            int(saved["episodes"])
    start = time.process_time()
    lm, tok = load_pretrained(teacher["path"])
    policy = LLMPolicy(lm, tok, temperature=0.0, max_new_tokens=cfg.max_new_tokens)
    env_fn = make_env_fn(cfg, "train")
    envs = [env_fn() for _ in range(cfg.num_envs)]
    base = SFT_ARM_SEED_BASE["teacher"] + seed * SFT_ARM_SEED_STRIDE
    demos, episodes = [], 0
    while time.process_time() - start < cpu_budget:
        eps = rollout(policy, envs, range(base + episodes, base + episodes + SEQKD_BATCH))
        episodes += len(eps)
        demos += [Demonstration(list(r.prompt_ids), list(r.response_ids), memory_mask(r.response_ids, tok))
                  for r in records_of(eps)]
    for env in envs:
        env.close()
    spent = time.process_time() - start
    _write_json(path, {"cpu_seconds": spent, "episodes": episodes,
                       "demonstrations": [[d.prompt_ids, d.response_ids, d.memory_mask] for d in demos]})
    return demos, spent, episodes


def run_sft_arm(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any],
                teacher: dict[str, Any]) -> dict:
    """An equal-cost alternative to on-policy distillation (:data:`distill.experiment.config.SFT_ARMS`): SFT of the
    start student for the training CPU seconds of ``cfg.equal_cpu_arm``'s run of the same seed (data making
    included), on the oracle's demonstrations of new train-pool tasks (``sft_continued``) or on the teacher's own
    greedy episodes (``seqkd``: sampling them costs up to ``seqkd_sample_share`` of that CPU, training the rest);
    the student's SFT learning rate, warmed up over 50 steps (or the student's own SFT warm-up where it sets one)
    and cosine-annealed over the budget. Evaluated as the
    GRPO arms are (held-out and seen at the end; the curve has only its end point). Resumes like them."""
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.sft import expert_data, train_sft
    from agents.llm.training.common import latest_checkpoint

    out = Path(cfg.out) / "arms" / arm / f"seed{seed}"
    source = ARMS[arm][1]["sft_data"]
    budget = _equal_cpu_budget(cfg, arm, seed)
    settings = {"arm": arm, "sft_data": source, "budget_cpu_seconds": budget, "equal_cpu_arm": cfg.equal_cpu_arm,
                "lr": cfg.student.lr, "model": student["path"], "seed": seed,
                "seqkd_sample_share": cfg.seqkd_sample_share if source == "teacher" else None,
                "evaluation": {k: getattr(cfg, k) for k in ("eval_episodes", "seen_eval_episodes", "heldout_fraction")}}
    settings = json.loads(json.dumps(settings))
    if (res := _done(out)) is not None:
        if _portable(res.get("settings", settings)) != _portable(settings):
            raise _settings_mismatch(out / "result.json", res["settings"], settings, "was trained")
        return res
    started = out / "settings.json"
    if started.exists() and _portable(json.loads(started.read_text())) != _portable(settings):
        raise _settings_mismatch(started, json.loads(started.read_text()), settings, "began a run")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(started, settings)
    # warm-up: the student's own SFT warm-up where it sets one (a pretrained student's CPU budget buys tens of
    # steps, not the 50 of a tiny model's thousands), else 50 steps
    spec = replace(cfg.student, sft_steps=10**7, sft_minutes=budget / 60, sft_clock="cpu",
                   warmup=cfg.student.warmup if cfg.student.warmup is not None else 50, sft_episodes=SFT_ARM_DEMOS)
    sft_cfg = _sft_config(cfg, spec, out / "sft", model=student["path"], seed=seed, eval_every=0,
                          threads=cfg.threads, demo_seed_base=SFT_ARM_SEED_BASE["oracle"] + seed * SFT_ARM_SEED_STRIDE)
    made = out / "data_cpu.json"
    if source == "teacher":
        data, data_cpu, episodes = _teacher_episodes(cfg, teacher, seed, budget * cfg.seqkd_sample_share,
                                                     out / "teacher_episodes.json")
    else:  # the demonstrations are remade on a resume (deterministic); their first making's CPU counts once
        start = time.process_time()
        lm0, tok0 = load_pretrained(student["path"])
        from agents.llm.generation.policy import LLMPolicy

        data = expert_data(LLMPolicy(lm0, tok0, temperature=0.0), sft_cfg,
                           range(sft_cfg.demo_seed_base, sft_cfg.demo_seed_base + sft_cfg.episodes))
        episodes = sft_cfg.episodes
        if not made.exists():
            _write_json(made, {"cpu_seconds": time.process_time() - start})
        data_cpu = float(json.loads(made.read_text())["cpu_seconds"])
    sft_cfg = replace(sft_cfg, max_seconds=max(1.0, budget - data_cpu))
    row = _sft_finished(out / "sft", replace(spec, sft_minutes=sft_cfg.max_seconds / 60)) or train_sft(sft_cfg, data)
    lm, tok = load_pretrained(latest_checkpoint(out / "sft"))
    held, seen = _evaluate_both(lm, tok, cfg, out, "end")
    curve = held.head(cfg.curve_episodes).assign(update=cfg.updates)[["update", "seed", "f1", "em"]]
    write_atomic(out / "curve.csv", lambda tmp: curve.to_csv(tmp, index=False))
    res = {"arm": arm, "seed": seed, "train_cpu_seconds": float(row.get("cpu_seconds")) + data_cpu,
           "data_cpu_seconds": data_cpu, "budget_cpu_seconds": budget, "sft_steps": int(row.get("step")),
           "data_episodes": episodes, "data_examples": len(data), "f1": float(held.f1.mean()),
           "em": float(held.em.mean()), "seen_f1": float(seen.f1.mean()), "update_s": math.nan,
           "rollout_s": math.nan, "approx_kl_first": math.nan, "clipfrac_first": math.nan, "settings": settings}
    _write_json(out / "result.json", res)
    return res


#: Training seeds of the GRPO learning-rate sweep (not the arms' seeds 0..seeds-1).
SWEEP_SEED_BASE = 1000


def sweep_dir(cfg: ExperimentConfig, arm: str, lr: float, seed: int) -> Path:
    """Where one sweep run of ``arm`` lives: ``OUT/sweep/lrLR/seedS`` for GRPO alone (as every run before issue 61
    cached it), ``OUT/sweep/ARM/lrLR/seedS`` for the others."""
    base = Path(cfg.out) / "sweep" if arm == "rl" else Path(cfg.out) / "sweep" / arm
    return base / f"lr{lr:g}" / f"seed{seed}"


def with_lr(cfg: ExperimentConfig, arm: str, lr: float) -> ExperimentConfig:
    """``cfg`` with ``arm`` trained at ``lr`` (GRPO alone's in ``rl_lr``, the others' in ``lr_by_arm``)."""
    return replace(cfg, rl_lr=lr) if arm == "rl" else replace(cfg, lr_by_arm={**cfg.lr_by_arm, arm: lr})


def swept(cfg: ExperimentConfig) -> list[str]:
    """The arms of this run whose learning rate the sweep still has to choose (``swept_arms`` that ran, with no
    rate given), in :data:`ARMS` order."""
    given = lambda arm: cfg.rl_lr is not None if arm == "rl" else arm in cfg.lr_by_arm  # noqa: E731
    if not cfg.rl_lr_sweep:
        return []
    return [a for a in ARMS if a in cfg.arms and a in cfg.swept_arms and not given(a)]


def sweep_jobs(cfg: ExperimentConfig, grids: dict[str, tuple[float, ...]] | None = None
               ) -> list[tuple[str, float, int]]:
    """The (arm, learning rate, sweep seed) runs of the learning-rate sweep: every arm of :func:`swept` on its grid
    (``grids[arm]``, default ``cfg.rl_lr_sweep``), ``cfg.sweep_seeds`` seeds each, seed-major."""
    grids = grids or {}
    return [(arm, lr, SWEEP_SEED_BASE + s) for s in range(cfg.sweep_seeds) for arm in swept(cfg)
            for lr in grids.get(arm, cfg.rl_lr_sweep)]


def run_sweep_point(cfg: ExperimentConfig, arm: str, lr: float, seed: int, student: dict[str, Any],
                    teacher: dict[str, Any] | None = None, matched_from: Path | None = None) -> dict:
    """One run of the learning-rate sweep: ``arm``'s settings at ``lr`` (warm-up included), scored by greedy F1 on
    the train-pool probe episodes (neither evaluation nor SFT seeds: the choice never sees the evaluation
    episodes). Cached in :func:`sweep_dir`'s ``result.json``; resumes like an arm. The teacher-free control takes
    its constant from ``matched_from`` (MemOPD's sweep run of the same seed)."""
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.ppo import train_rl
    from agents.llm.training.common import checkpoints
    from distill.trainer import train_memopd

    out = sweep_dir(cfg, arm, lr, seed)
    run_cfg = replace(arm_config(with_lr(cfg, arm, lr), arm, seed, student, teacher or {}, matched_from=matched_from),
                      out_dir=str(out), keep_every=0)
    settings = {**_arm_settings(cfg, run_cfg), "probe_episodes": cfg.probe_episodes}
    if (res := _done(out)) is not None:
        if not _same_settings(res.get("settings", settings), settings):
            raise _settings_mismatch(out / "result.json", res["settings"], settings, "was trained")
        return res
    started = out / "settings.json"
    if started.exists() and not _same_settings(json.loads(started.read_text()), settings):
        raise _settings_mismatch(started, json.loads(started.read_text()), settings, "began a run")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(started, settings)
    lm, tok = load_pretrained(student["path"])
    (train_rl if ARMS[arm][1] is None else train_memopd)(run_cfg, model=lm, tokenizer=tok)
    lm, tok = load_pretrained(checkpoints(out)[cfg.updates])
    probe = evaluate_per_seed(lm, tok, cfg, range(PROBE_SEED_BASE, PROBE_SEED_BASE + cfg.probe_episodes), pool="train")
    metrics = pd.read_csv(out / "metrics.csv")
    res = {"arm": arm, "lr": lr, "seed": seed, "f1": float(probe.f1.mean()), "em": float(probe.em.mean()),
           "seen_f1": math.nan, "probe_episodes": cfg.probe_episodes,
           "train_cpu_seconds": float(metrics["cpu_seconds"].iloc[-1]),
           "approx_kl_first": float(metrics["approx_kl"].iloc[0]) if "approx_kl" in metrics else math.nan,
           **({"distill_loss": float(metrics["distill_loss"].mean())} if "distill_loss" in metrics else {}),
           "settings": settings}
    _write_json(out / "result.json", res)
    return res


def choose_lr(cfg: ExperimentConfig, arm: str, runs: dict[tuple[float, int], dict],
              grid: tuple[float, ...] | None = None) -> dict[str, Any]:
    """One arm's sweep table (mean probe F1 per learning rate of ``grid``, default ``cfg.rl_lr_sweep``, over its
    seeds) and its choice, the highest mean (the smaller learning rate on a tie), with ``on_edge`` (the choice is
    the grid's smallest or largest rate: the grid may be too narrow); written to the arm's sweep folder
    (``OUT/sweep/result.json`` for GRPO alone)."""
    grid = tuple(sorted(grid or cfg.rl_lr_sweep))
    table = [{"lr": lr, "probe_f1": float(np.mean([r["f1"] for (l2, _), r in runs.items() if l2 == lr])),
              "per_seed": [r["f1"] for (l2, _), r in sorted(runs.items()) if l2 == lr]}
             for lr in grid]
    best = max(table, key=lambda row: (row["probe_f1"], -row["lr"]))
    res = {"arm": arm, "chosen_lr": best["lr"], "table": table, "seeds": cfg.sweep_seeds,
           "probe_episodes": cfg.probe_episodes, "on_edge": len(grid) > 1 and best["lr"] in (grid[0], grid[-1]),
           "train_cpu_seconds": float(sum(r["train_cpu_seconds"] for (l2, _), r in runs.items() if l2 in grid))}
    _write_json(sweep_dir(cfg, arm, 0, 0).parent.parent / "result.json", res)
    return res


def choose_rl_lr(cfg: ExperimentConfig, runs: dict[tuple[float, int], dict]) -> dict[str, Any]:
    """GRPO alone's :func:`choose_lr` (the sweep before issue 61)."""
    return choose_lr(cfg, "rl", runs)


def extended(grid: tuple[float, ...], chosen: float, factor: float = 3.0) -> tuple[float, ...]:
    """``grid`` with one more rate past the edge ``chosen`` sits on (``factor`` beyond it)."""
    grid = tuple(sorted(grid))
    new = chosen * factor if chosen == grid[-1] else chosen / factor
    return tuple(sorted({*grid, float(f"{new:.3g}")}))


__all__ = ["SFT_ARM_SEED_BASE", "SFT_ARM_SEED_STRIDE", "SFT_ARM_DEMOS", "SEQKD_BATCH", "run_sft_arm",
           "SWEEP_SEED_BASE", "sweep_dir", "with_lr", "swept", "sweep_jobs", "run_sweep_point", "choose_lr",
           "choose_rl_lr", "extended"]
