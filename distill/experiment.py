"""``memenv experiment memopd``: the MemOPD claims reproduced in miniature, with seed-level statistics, on a CPU.

    memenv experiment memopd --out runs/memopd            # the full run (teacher cached under OUT/teacher)
    memenv experiment memopd --out runs/memopd_quick --quick

Task: MemQA-v0 with 2 objectives (MemOPD's Q2 setting), single-hop questions, no comparisons and one document per
search (a tiny teacher trained for 70 CPU-minutes reaches F1 0.90 on seen questions there, 0.31 on held-out ones; see
docs/results.md).

Held-out questions: the world (world_seed 0, 1,200 documents) is fixed, and its questions are split before any
training by the entity they ask about (``question_split``, :func:`tasks.world.question_pool`): a quarter of the
entities (``heldout_fraction``) are held out. Every SFT demonstration, tokenizer text, weak-start probe and GRPO
episode draws from the ``train`` pool; the headline evaluation draws from the ``heldout`` pool only, so no
evaluated question (nor any other question about its entity) was ever trained on. F1 on ``train``-pool
("seen") questions, on evaluation seeds, is reported beside it.

Stages, each cached under ``OUT`` and skipped on a rerun when its ``result.json`` exists (resume; a rerun with
other settings is refused, naming them; ``--until teacher`` or ``--until student`` stops after that stage, so
the teacher's and the weak start's F1 can be read before the arms are paid for):

1. ``teacher/``: a tiny Qwen2 (d=128, 4 layers) SFT'd on oracle trajectories (:func:`agents.llm.sft.train_sft`);
2. ``student/``: a smaller model (d=64, 2 layers) with the *teacher's tokenizer*, from a weak SFT (rounds until
   a probe F1 reaches ``student_start_f1``); its greedy F1/EM per evaluation episode is the common start of
   every arm;
3. ``arms/ARM/seedS/``: from that start, the same number of GRPO updates with the same hyper-parameters
   (:data:`ARMS`): ``rl`` (GRPO alone), ``memopd`` (GRPO + on-policy distillation, actor and teacher on the
   aligned reconstruction), ``teacher_persistent`` (the matched control: the student's update is MemOPD's, only
   the teacher scores each action after the flattened episode), ``flattening`` (actor and teacher on the
   flattened episode, old log-probs recomputed on it, as flattening multi-turn trainers do) and, on request,
   ``memopd_himpo`` (MemOPD + HiMPO memory credit); held-out F1 at ``curve_every`` updates and at the end, seen
   F1 at the end;
4. ``timing.csv``: actor forward+backward CPU seconds per update, padded (record order, and length-sorted
   buckets: the best padded baseline) vs shared-prefix and prefix-tree packing, on one update's records;
   ``diagnostics.csv``: :func:`distill.diagnose.diagnose` of the flattening arm's final student (how far the
   flattened transcript moves the log-probs from the sampled ones);
5. ``results.csv`` (one row per arm), ``comparisons.csv`` (arm pairs), ``results.md`` and ``learning_curves.png``
   (held-out F1 per arm over updates, mean ± SE across training seeds), written atomically.

Statistics (:mod:`distill.stats`): the start and every arm's end are evaluated on the same episodes, and each
arm is trained from ``seeds`` training seeds. Per training seed, the gain is the paired mean
``g_s = mean_e(F1_end(s, e) - F1_start(e))``; the headline is ``mean_s g_s`` with the standard error across
seeds and t on ``seeds - 1`` degrees of freedom (p, 95% CI); a two-level bootstrap over seeds and episodes
gives a second interval that also carries the evaluation set's sampling error. Comparisons between arms are
paired by training seed (seed s of two arms shares its rollout seeds and its start) and by episode.

Defaults, sized for ~3 CPU-hours on a 2-core CPU (2 arm processes of 1 thread), and measured at that: the
teacher's SFT 71 CPU-min, the student's 4.5 CPU-min plus probes, the 20 arm runs 96 CPU-min of training
(4.3-5.4 CPU-min each) plus their evaluations, 59 wall-min for the arms in 2 processes (docs/results.md). 5
training seeds are the fewest that give a seed-level t 4 degrees of freedom; 120 updates, not 50: in earlier runs
no gain exceeded its error at 50 updates and MemOPD's grew with updates. The HiMPO arm is not in the default set
(``--arms ... memopd_himpo`` adds it, ~+25 CPU-min): the matched control and GRPO alone are what the claims need.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from agents.files import write_atomic, write_text_atomic
from distill import check_attention_backend
from distill.stats import INFERENCE, episode_level_se, paired_difference, paired_gain, two_level_bootstrap
from memenv.cli import HelpFormatter, positive_int

ENV_ID = "MemQA-v0"
# One document per search (top_k=1; the oracle searches by exact title, so its evidence is always the top hit):
# a turn's context stays ~3x shorter than with top_k=3, so a CPU trains ~1.6x more SFT steps per CPU-second and
# the tiny teacher learns the task within its budget. Memory still matters: the first answer must be kept while
# the second is looked up.
ENV_KWARGS = {"objectives": 2, "hops": 1, "comparison_rate": 0.0, "top_k": 1}
#: name -> (label, MemOPD fields; None: GRPO alone)
ARMS = {
    "rl": ("GRPO alone", None),
    "memopd": ("MemOPD (GRPO + OPD, aligned)", {"reconstruction": "aligned", "teacher_reconstruction": "aligned",
                                                "credit": "none"}),
    "teacher_persistent": ("teacher-persistent control (MemOPD's update, teacher on the flattened history)",
                           {"reconstruction": "aligned", "teacher_reconstruction": "persistent", "credit": "none"}),
    "flattening": ("flattening trainer (actor and teacher on the flattened history)",
                   {"reconstruction": "persistent", "teacher_reconstruction": "persistent", "credit": "none",
                    "recompute_old_logprobs": True}),
    "memopd_himpo": ("MemOPD + HiMPO", {"reconstruction": "aligned", "teacher_reconstruction": "aligned",
                                        "credit": "himpo"}),
}
DEFAULT_ARMS = ("rl", "memopd", "teacher_persistent", "flattening")
#: Settings a rerun on a cached ``--out`` may change: how the run is executed, and which arms and seeds it adds.
RERUN_MAY_CHANGE = ("out", "progress", "workers", "threads", "sft_threads", "arms", "seeds")


class SettingsMismatchError(ValueError):
    """A rerun on an output folder whose cached stages were made with other settings."""


@dataclass
class ModelSpec:
    """A tiny Qwen2 model and the SFT that trains it (with ``ExperimentConfig.model``: how many of the pretrained
    base's decoder layers it keeps, 0 = all, and its SFT; ``hidden`` and ``heads`` then do not apply)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 8
    sft_steps: int = 100000  # the budget (minutes) usually ends the teacher's SFT first
    sft_minutes: float | None = 70.0
    sft_clock: str = "cpu"  # budget clock: "cpu" (process CPU time, all threads) or "wall"
    sft_episodes: int = 2000  # oracle demonstrations
    lr: float = 3e-3
    sft_worlds: int = 0  # 0: demonstrations in the experiment's world (world 0, train-pool questions); N > 0:
    # spread over N other worlds of the same generator (SFTConfig.demo_worlds), so that SFT cannot teach world 0's
    # facts and the model must read its search results to answer


def _finite(name: str, value: Any, low: float | None = None, high: float | None = None,
            strict_low: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low is None or (value > low if strict_low else value >= low)) and (high is None or value <= high)
    if not ok:
        rule = " and ".join(r for r in ((f"> {low}" if strict_low else f">= {low}") if low is not None else "",
                                        f"<= {high}" if high is not None else "") if r)
        raise ValueError(f"{name} must be a finite number{' ' + rule if rule else ''}, got {value!r}")


@dataclass
class ExperimentConfig:
    """Every knob of the experiment; :func:`quick_config` is the smoke-run preset."""

    out: str = "runs/memopd"
    # A pretrained base (a registered name such as ``smollm2-135m-instruct``, or a checkpoint folder): the teacher
    # is its SFT (its first ``teacher.layers`` decoder layers; all when that is 0 or >= its depth) and the student its
    # first ``student.layers`` layers (:func:`agents.llm.pretrained.shrink`), both on its tokenizer and with the
    # system prompt its folder carries. ``hidden``, ``heads``, ``vocab`` and ``tokenizer_episodes`` then do not
    # apply. None: tiny Qwen2 models trained from scratch. See :func:`pretrained_config` for sizes that fit a CPU.
    model: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=lambda: dict(ENV_KWARGS))
    heldout_fraction: float = 0.25  # share of the world's entities whose questions are held out
    teacher: ModelSpec = field(default_factory=ModelSpec)
    student: ModelSpec = field(default_factory=lambda: ModelSpec(hidden=64, layers=2, heads=4, sft_steps=150,
                                                                 sft_minutes=None))
    # The weak start: the student's SFT runs in rounds of student.sft_steps until greedy F1 on probe seeds
    # (train-pool questions; neither SFT nor evaluation seeds) reaches student_start_f1, or student_max_steps
    # are spent. A start with no reward at all gives GRPO nothing to learn from.
    student_start_f1: float = 0.15
    student_max_steps: int = 3000
    probe_episodes: int = 100
    vocab: int = 8192
    tokenizer_episodes: int = 200
    arms: tuple[str, ...] = DEFAULT_ARMS
    seeds: int = 5
    updates: int = 120
    tasks_per_update: int = 4
    group_size: int = 4
    lr: float = 3e-4  # 1e-3 made the KL to the start policy explode in a 6-update probe
    kl_coef: float = 0.02
    temperature: float = 0.7
    distill_coef: float = 1.0
    # Attention of the packed (shared-prefix) forwards of the OPD arms: sdpa_blocks is exact (tested against the
    # dense mask) and avoids the dense [L, L] mask, which cost more than the shared prefix saved on CPU.
    attention_backend: str = "sdpa_blocks"
    eval_episodes: int = 400  # held-out questions, the same episodes at the start and the end of every arm
    seen_eval_episodes: int = 200  # train-pool questions on evaluation seeds
    curve_every: int = 40  # held-out F1 every this many updates (the learning curve)
    curve_episodes: int = 200  # episodes of the curve's points (the first of the held-out episodes)
    max_new_tokens: int = 64
    num_envs: int = 16
    threads: int = 1  # torch threads per process of the arms (see workers)
    sft_threads: int = field(default_factory=lambda: os.cpu_count() or 1)  # teacher and student SFT run alone
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # arm runs in parallel processes
    timing_rounds: int = 3
    diagnose_episodes: int = 16
    progress: bool = True

    def __post_init__(self) -> None:
        self.arms = tuple(self.arms)
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {list(ARMS)}, got {list(self.arms)}")
        for name in ("seeds", "updates", "tasks_per_update", "eval_episodes", "max_new_tokens", "threads", "workers",
                     "sft_threads", "probe_episodes", "student_max_steps", "seen_eval_episodes", "curve_every",
                     "curve_episodes", "num_envs", "vocab", "tokenizer_episodes", "timing_rounds",
                     "diagnose_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_attention_backend(self.attention_backend)
        _finite("lr", self.lr, 0, strict_low=True)
        _finite("distill_coef", self.distill_coef, 0)
        _finite("kl_coef", self.kl_coef, 0)
        _finite("temperature", self.temperature, 0, strict_low=True)
        _finite("student_start_f1", self.student_start_f1, 0, 1)
        _finite("heldout_fraction", self.heldout_fraction, 0.01, 0.99)
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO), got {self.group_size}")
        for role, spec in (("teacher", self.teacher), ("student", self.student)):
            if spec.sft_clock not in ("cpu", "wall"):
                raise ValueError(f"{role} sft clock must be 'cpu' or 'wall', got {spec.sft_clock!r}")
            if spec.sft_minutes is not None:
                _finite(f"{role} sft_minutes", spec.sft_minutes, 0, strict_low=True)
            _finite(f"{role} lr", spec.lr, 0, strict_low=True)
            if int(spec.sft_steps) < 1:
                raise ValueError(f"{role} sft_steps must be >= 1, got {spec.sft_steps}")
            if isinstance(spec.layers, bool) or not isinstance(spec.layers, int) or \
                    spec.layers < (0 if self.model else 1):
                raise ValueError(f"{role} layers must be an integer >= {0 if self.model else 1}"
                                 f"{' (0: all of the base model)' if self.model else ''}, got {spec.layers!r}")
            if isinstance(spec.sft_worlds, bool) or not isinstance(spec.sft_worlds, int) or spec.sft_worlds < 0:
                raise ValueError(f"{role} sft_worlds must be an integer >= 0, got {spec.sft_worlds!r}")


def quick_config(out: str, **overrides: Any) -> ExperimentConfig:
    """The ``--quick`` smoke run (~8 CPU-minutes alone on 2 cores; more CPU time when other jobs share them):
    small models, 2 seeds, 4 updates, every arm, 100 held-out episodes. Its teacher learns little in 3 minutes
    (F1 ~0): it checks the pipeline, not the claims."""
    base = dict(out=out, teacher=ModelSpec(hidden=64, layers=2, heads=4, sft_steps=150, sft_minutes=3.0,
                                           sft_episodes=300), student_max_steps=400, probe_episodes=16,
                # 400 steps: the student's actions are mostly valid (memory writes that credit can score)
                student=ModelSpec(hidden=32, layers=2, heads=2, sft_steps=200, sft_minutes=None, sft_episodes=300),
                vocab=2048, tokenizer_episodes=60, arms=tuple(ARMS), seeds=2, updates=4, tasks_per_update=2,
                eval_episodes=100, seen_eval_episodes=50, curve_every=2, curve_episodes=50, timing_rounds=1,
                diagnose_episodes=8)
    return ExperimentConfig(**{**base, **overrides})


#: ``--quick --model``: the pretrained pipeline on cuts of the base (4-layer teacher, 2-layer student), a few steps.
PRETRAINED_QUICK = dict(teacher=ModelSpec(layers=4, sft_steps=20, sft_minutes=None, sft_episodes=40, lr=1e-4),
                        student=ModelSpec(layers=2, sft_steps=10, sft_minutes=None, sft_episodes=40, lr=1e-4),
                        student_max_steps=10, probe_episodes=4, seeds=2, updates=2, eval_episodes=8,
                        seen_eval_episodes=4, curve_every=1, curve_episodes=4, diagnose_episodes=2, num_envs=4)


def pretrained_config(out: str, model: str = "smollm2-135m-instruct", **overrides: Any) -> ExperimentConfig:
    """The experiment on a pretrained base (``--model``): the teacher is the whole model after SFT, the student
    its first 6 decoder layers (SmolLM2-135M: 30 layers, 134.5M parameters -> ~50M, 28M of them the tied
    embedding), learning rates for fine-tuning rather than training from scratch, 64-token actions (a protocol
    action in SmolLM2's BPE is 25-60 tokens) and the three arms the claims need (GRPO alone, MemOPD, the matched
    teacher-persistent control) x 5 seeds x 30 updates of 2 tasks x 4, 100 held-out episodes. Sized for a GPU,
    not for a 2-core CPU: there ``--quick --model`` (a 2-layer student) took ~90 CPU-s per GRPO update (rollouts
    ~50 s of it, every action at the 64-token cap). Measured at this preset (docs/results.md, ``--until
    student``): the teacher's 60 CPU-min buy 63 SFT steps (held-out F1 0.335, seen 0.260), the student's 400
    steps 73 CPU-min (start F1 0.000), and one arm update ~125 CPU-s, so the 450 updates would be ~16 CPU-hours
    of training."""
    base = dict(out=out, model=model,
                teacher=ModelSpec(layers=0, sft_steps=400, sft_minutes=60.0, sft_episodes=600, lr=5e-5),
                student=ModelSpec(layers=6, sft_steps=40, sft_minutes=None, sft_episodes=600, lr=2e-4),
                student_max_steps=400, probe_episodes=24, arms=("rl", "memopd", "teacher_persistent"), seeds=5,
                updates=30, tasks_per_update=2, lr=1e-5, kl_coef=0.02, eval_episodes=100,
                seen_eval_episodes=50, curve_every=10, curve_episodes=50, num_envs=8, timing_rounds=1,
                diagnose_episodes=4)
    return ExperimentConfig(**{**base, **overrides})


# ---------------------------------------------------------------------- statistics (pure)
def paired_stats(start: Sequence[float], end: Sequence[float]) -> dict[str, float]:
    """Mean paired difference ``end - start`` over the same episodes, its standard error ``sd(ddof=1)/sqrt(n)``
    and ``z = mean / se`` (``se`` 0 -> ``z`` inf or nan). One model against another on one evaluation set (the
    teacher's or the start's F1 and its sampling error); claims about training use :mod:`distill.stats`."""
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    if start.shape != end.shape or start.ndim != 1 or len(start) < 2:
        raise ValueError(f"paired_stats needs two equal-length 1-D series of >= 2 values, got {start.shape} and "
                         f"{end.shape}")
    d = end - start
    se = float(d.std(ddof=1) / math.sqrt(len(d)))
    mean = float(d.mean())
    return {"mean": mean, "se": se, "z": mean / se if se > 0 else (math.inf if mean else math.nan), "n": len(d)}


def _scores(frames: Sequence[pd.DataFrame], metric: str, seeds: Sequence[int]) -> np.ndarray:
    for f in frames:
        if list(f["seed"]) != list(seeds):
            raise ValueError("start and end evaluations are not on the same evaluation episodes")
    return np.stack([f[metric].to_numpy(float) for f in frames])  # [training seeds, episodes]


def arm_summary(start: pd.DataFrame, ends: Sequence[pd.DataFrame], prefix: str = "") -> dict[str, float]:
    """Start vs end of one arm, with seed-level inference (:mod:`distill.stats`). Every frame has ``seed, f1,
    em`` rows on the same evaluation episodes (checked). Keys ``{prefix}gain_f1``, ``..._se`` (across training
    seeds), ``_t``, ``_df``, ``_p``, ``_ci_low/high`` (t), ``_boot_low/high`` (two-level bootstrap),
    ``_episode_se`` (seeds averaged first: what that leaves out), ``end_f1_seed_sd`` ..."""
    out: dict[str, float] = {}
    for metric in ("f1", "em"):
        s0 = start[metric].to_numpy(float)
        ends_m = _scores(ends, metric, list(start["seed"]))
        g = paired_gain(s0, ends_m)
        boot = two_level_bootstrap(ends_m - s0[None, :])
        out.update({f"{prefix}start_{metric}": float(s0.mean()), f"{prefix}end_{metric}": float(ends_m.mean()),
                    f"{prefix}end_{metric}_seed_sd": float(ends_m.mean(axis=1).std(ddof=1)) if len(ends) > 1
                    else math.nan,
                    f"{prefix}gain_{metric}": g["mean"], f"{prefix}gain_{metric}_se": g["se"],
                    f"{prefix}gain_{metric}_t": g["t"], f"{prefix}gain_{metric}_df": g["df"],
                    f"{prefix}gain_{metric}_p": g["p"], f"{prefix}gain_{metric}_ci_low": g["ci_low"],
                    f"{prefix}gain_{metric}_ci_high": g["ci_high"], f"{prefix}gain_{metric}_boot_low": boot["boot_low"],
                    f"{prefix}gain_{metric}_boot_high": boot["boot_high"],
                    f"{prefix}gain_{metric}_episode_se": episode_level_se(s0, ends_m)})
    return out


def compare_arms(a: Sequence[pd.DataFrame], b: Sequence[pd.DataFrame], metric: str = "f1") -> dict[str, float]:
    """End of arm ``a`` minus end of arm ``b``, paired by training seed (the i-th frame of each) and episode;
    seed-level inference (:func:`distill.stats.paired_difference`) and the two-level bootstrap."""
    if len(a) != len(b):
        raise ValueError(f"arms to compare need the same training seeds, got {len(a)} and {len(b)}")
    seeds = list(a[0]["seed"])
    ea, eb = _scores(a, metric, seeds), _scores(b, metric, seeds)
    return {**paired_difference(ea, eb), **two_level_bootstrap(ea - eb),
            "ratio": float(ea.mean() / eb.mean()) if eb.mean() > 0 else math.nan}

# ---------------------------------------------------------------------- helpers
def _log(cfg: ExperimentConfig, text: str) -> None:
    if cfg.progress:
        print(text, flush=True)


def _done(path: Path) -> dict[str, Any] | None:
    """A stage's cached result, or None. One without the scores every stage records was made by another version
    of the experiment: refused (:class:`SettingsMismatchError`) rather than failing later on a missing key."""
    f = path / "result.json"
    if not f.exists():
        return None
    res = json.loads(f.read_text())
    missing = [key for key in ("f1", "em", "seen_f1") if not isinstance(res, dict) or key not in res]
    if missing:
        raise SettingsMismatchError(f"{f} was made by another version of the experiment (no {', '.join(missing)}); "
                                    f"use another --out, or delete {path} to make that stage again")
    return res


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=float))


def pool_env_kwargs(cfg: ExperimentConfig, pool: str = "train") -> dict[str, Any]:
    """The env kwargs of one question pool: ``train`` (demonstrations, probes, GRPO episodes, "seen"
    evaluation) or ``heldout`` (the headline evaluation)."""
    return {**cfg.env_kwargs, "question_split": pool, "heldout_fraction": cfg.heldout_fraction}


def make_env_fn(cfg: ExperimentConfig, pool: str = "train"):
    import gymnasium as gym

    import memenv  # noqa: F401 - registers the environments

    kwargs = pool_env_kwargs(cfg, pool)
    return lambda: gym.make(ENV_ID, **kwargs)


#: Seeds of the student's weak-start probe: neither SFT seeds (0..episodes-1) nor evaluation seeds (10**7 + i).
PROBE_SEED_BASE = 2 * 10**7


def evaluate_per_seed(lm, tokenizer, cfg: ExperimentConfig, seeds: Sequence[int] | None = None,
                      pool: str = "heldout", episodes: int | None = None) -> pd.DataFrame:
    """Greedy episodes of ``pool``'s questions on ``seeds`` (default: the first ``episodes`` (default
    ``cfg.eval_episodes``) evaluation seeds :func:`agents.llm.training.eval_seeds`, never trained on): one row
    per seed with ``seed, f1, em, peak_context_tokens, turns, questions`` (the episode's question texts)."""
    from agents.llm.policy import LLMPolicy
    from agents.llm.rollouts import rollout
    from agents.llm.training import eval_seeds

    env_fn = make_env_fn(cfg, pool)
    envs = [env_fn() for _ in range(cfg.num_envs)]
    seeds = eval_seeds(episodes or cfg.eval_episodes) if seeds is None else list(seeds)
    eps = rollout(LLMPolicy(lm, tokenizer, temperature=0.0, max_new_tokens=cfg.max_new_tokens), envs, seeds,
                  progress=cfg.progress)
    for env in envs:
        env.close()
    return pd.DataFrame({"seed": seeds, "f1": [ep.f1 for ep in eps],
                         "em": [float(ep.info.get("em", 0.0)) for ep in eps],
                         "peak_context_tokens": [ep.info.get("peak_context_tokens", 0) for ep in eps],
                         "turns": [ep.turns for ep in eps],
                         "questions": [" | ".join(ep.info.get("questions", []) or []) for ep in eps]})


def _sft_config(cfg: ExperimentConfig, spec: ModelSpec, out: Path, model: str | None = None, **overrides: Any):
    from agents.llm.sft import SFTConfig

    return SFTConfig(env_id=ENV_ID, env_kwargs=pool_env_kwargs(cfg, "train"), out_dir=str(out), model=model, seed=0,
                     episodes=spec.sft_episodes, demo_worlds=spec.sft_worlds, steps=spec.sft_steps, batch_size=16,
                     lr=spec.lr, warmup=min(100, max(1, spec.sft_steps // 10)), autocast="auto", bucket=8,
                     schedule_by="budget" if spec.sft_minutes else "steps", tiny_split_spaces="suffix",
                     tiny_vocab=cfg.vocab, tiny_min_frequency=1, tiny_tokenizer_episodes=cfg.tokenizer_episodes,
                     # A model from scratch also learns the task text (an LM loss on 30% of the observation tokens);
                     # a pretrained base needs no such pretraining.
                     prompt_loss_weight=0.0 if cfg.model else 1.0, prompt_loss_fraction=0.3, eval_every=0,
                     save_every=250,
                     keep_checkpoints=1, max_seconds=spec.sft_minutes * 60 if spec.sft_minutes else None,
                     budget_clock=spec.sft_clock, threads=cfg.sft_threads, tiny_hidden=spec.hidden,
                     tiny_layers=spec.layers, tiny_heads=spec.heads, max_new_tokens=cfg.max_new_tokens,
                     num_envs=cfg.num_envs, resume=True, progress=cfg.progress,
                     # a pretrained base's activations at 16 long invocations outgrow a 24 GiB machine (SmolLM2's 30
                     # layers: OOM at ~24 GB), so they are recomputed in the backward
                     gradient_checkpointing=bool(cfg.model), **overrides)


def _trained(out: Path):
    from agents.llm.models import load_pretrained
    from agents.llm.training import latest_checkpoint

    return load_pretrained(latest_checkpoint(out))


def _sft_finished(out: Path, spec: ModelSpec) -> dict[str, Any] | None:
    """The last metrics row of an SFT run whose latest checkpoint already spent its steps or time budget (a
    resume would rebuild the demonstrations only to take one more step), else None."""
    from agents.llm.training import latest_checkpoint, load_trainer_state

    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return None
    state = load_trainer_state(ckpt)
    spent = state.get("elapsed", (0.0, 0.0))[0 if spec.sft_clock == "wall" else 1]
    if int(state["step"]) < spec.sft_steps and not (spec.sft_minutes and spent >= spec.sft_minutes * 60):
        return None
    rows = pd.read_csv(out / "metrics.csv")
    return rows[rows["step"] <= int(state["step"])].iloc[-1].to_dict()


def _se(values: pd.Series) -> float:
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def _evaluate_both(lm, tok, cfg: ExperimentConfig, out: Path, name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Held-out and seen evaluations of ``lm``, written to ``out/{name}_eval.csv`` and ``{name}_eval_seen.csv``."""
    held = evaluate_per_seed(lm, tok, cfg, pool="heldout")
    seen = evaluate_per_seed(lm, tok, cfg, pool="train", episodes=cfg.seen_eval_episodes)
    write_atomic(out / f"{name}_eval.csv", lambda tmp: held.to_csv(tmp, index=False))
    write_atomic(out / f"{name}_eval_seen.csv", lambda tmp: seen.to_csv(tmp, index=False))
    return held, seen


def _pretrained_init(cfg: ExperimentConfig, layers: int, folder: Path) -> str:
    """The starting weights of a model made from ``cfg.model``: the base folder itself when ``layers`` is 0 or
    keeps every decoder layer, else its first ``layers`` layers saved (once) to ``folder``, tokenizer and prompt
    settings included."""
    from agents.llm.models import load_pretrained, save_pretrained
    from agents.llm.pretrained import resolve, shrink

    base = resolve(cfg.model)
    depth = json.loads((base / "config.json").read_text()).get("num_hidden_layers")
    if depth is None or layers == 0 or layers >= int(depth):
        return str(base)
    if not (folder / "config.json").exists():
        lm, tok = load_pretrained(base)
        save_pretrained(shrink(lm, int(layers)), tok, folder)
    return str(folder)


def build_teacher(cfg: ExperimentConfig) -> dict[str, Any]:
    """SFT the teacher (resumes a partial run), then evaluate it; cached in ``OUT/teacher/result.json``."""
    from agents.llm.sft import train_sft
    from agents.llm.training import Timer, latest_checkpoint

    out = Path(cfg.out) / "teacher"
    if (res := _done(out)) is not None:
        return res
    timer = Timer()
    base = _pretrained_init(cfg, cfg.teacher.layers, out / "init") if cfg.model else None
    row = _sft_finished(out, cfg.teacher) or train_sft(_sft_config(cfg, cfg.teacher, out, model=base))
    lm, tok = _trained(out)
    held, seen = _evaluate_both(lm, tok, cfg, out, "teacher")
    res = {"path": str(latest_checkpoint(out).resolve()), "steps": int(row.get("step")),
           "train_cpu_seconds": row.get("cpu_seconds"), "train_wall_seconds": row.get("seconds"),
           "f1": float(held.f1.mean()), "em": float(held.em.mean()), "f1_se": _se(held.f1),
           "seen_f1": float(seen.f1.mean()), "seen_f1_se": _se(seen.f1), "stage_cpu_seconds": timer.cpu(),
           "parameters": sum(p.numel() for p in lm.parameters()), **asdict(cfg.teacher)}
    _write_json(out / "result.json", res)
    return res


def build_student(cfg: ExperimentConfig, teacher: dict[str, Any]) -> dict[str, Any]:
    """A smaller model on the teacher's tokenizer, weakly SFT'd; its per-episode start evaluations are saved."""
    from agents.llm.models import build_tiny_model, load_tokenizer, save_pretrained
    from agents.llm.sft import train_sft
    from agents.llm.training import latest_checkpoint, load_trainer_state

    out = Path(cfg.out) / "student"
    if (res := _done(out)) is not None:
        return res
    tok = load_tokenizer(teacher["path"])
    init = out / "init"
    if cfg.model:
        init = Path(_pretrained_init(cfg, cfg.student.layers, init))
    elif not (init / "config.json").exists():
        save_pretrained(build_tiny_model(tok, seed=1, hidden_size=cfg.student.hidden, layers=cfg.student.layers,
                                         heads=cfg.student.heads), tok, init)
    probe_seeds = range(PROBE_SEED_BASE, PROBE_SEED_BASE + cfg.probe_episodes)
    probes_path = out / "probes.json"
    probes = json.loads(probes_path.read_text()) if probes_path.exists() else []
    round_steps = cfg.student.sft_steps
    done = latest_checkpoint(out / "sft")
    done_steps = int(load_trainer_state(done)["step"]) if done is not None else 0
    # A resumed run continues at the first round boundary at or after its last checkpoint.
    steps = min(max(round_steps, -(-done_steps // round_steps) * round_steps), cfg.student_max_steps)
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
        _log(cfg, f"student after {steps} SFT steps: probe F1 {probes[-1]['probe_f1']:.3f} (weak-start target "
                  f"{cfg.student_start_f1})")
        if probes[-1]["probe_f1"] >= cfg.student_start_f1 or steps >= cfg.student_max_steps:
            break
        steps = min(steps + round_steps, cfg.student_max_steps)
    held, seen = _evaluate_both(lm, tok, cfg, out, "start")
    res = {"path": str(latest_checkpoint(out / "sft").resolve()), "steps": row.get("step"),
           "train_cpu_seconds": row.get("cpu_seconds"), "f1": float(held.f1.mean()), "em": float(held.em.mean()),
           "f1_se": _se(held.f1), "seen_f1": float(seen.f1.mean()), "seen_f1_se": _se(seen.f1),
           "parameters": sum(p.numel() for p in lm.parameters()), "probes": probes,
           **asdict(replace(cfg.student, sft_steps=steps))}
    _write_json(out / "result.json", res)
    return res


def arm_config(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any], teacher: dict[str, Any]):
    """The GRPO (``rl``) or MemOPD config of one arm; every arm shares the RL hyper-parameters and trains on the
    ``train`` question pool. Checkpoints every ``curve_every`` updates (the learning curve's points)."""
    from agents.llm.ppo import PPOConfig
    from distill.trainer import MemOPDConfig

    curve_every = min(cfg.curve_every, cfg.updates)
    common = dict(algo="grpo", env_id=ENV_ID, env_kwargs=pool_env_kwargs(cfg, "train"), model=student["path"],
                  out_dir=str(Path(cfg.out) / "arms" / arm / f"seed{seed}"), seed=seed, updates=cfg.updates,
                  episodes_per_update=cfg.tasks_per_update * cfg.group_size, group_size=cfg.group_size,
                  lr=cfg.lr, kl_coef=cfg.kl_coef, temperature=cfg.temperature, epochs=2, num_minibatches=2,
                  eval_every=0, save_every=curve_every, keep_checkpoints=cfg.updates // curve_every + 1,
                  max_new_tokens=cfg.max_new_tokens, num_envs=cfg.num_envs, threads=cfg.threads,
                  progress=cfg.progress, resume=False)
    fields = ARMS[arm][1]
    if fields is None:
        return PPOConfig(**common)
    return MemOPDConfig(**common, teacher=teacher["path"], distill_coef=cfg.distill_coef, packing="shared_prefix",
                        attention_backend=cfg.attention_backend, **fields)


def _arm_settings(cfg: ExperimentConfig, run_cfg) -> dict[str, Any]:
    settings = {k: v for k, v in asdict(run_cfg).items() if k not in ("out_dir", "progress", "threads", "resume")}
    settings["evaluation"] = {k: getattr(cfg, k) for k in ("eval_episodes", "seen_eval_episodes", "curve_every",
                                                           "curve_episodes", "heldout_fraction")}
    return json.loads(json.dumps(settings, default=list))


def _checkpoints(out: Path) -> dict[int, Path]:
    found = {}
    for p in out.glob("checkpoint-*"):
        tail = p.name.rsplit("-", 1)[-1]
        if p.is_dir() and tail.isdigit():
            found[int(tail)] = p
    return found


def run_arm(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any], teacher: dict[str, Any]) -> dict:
    """Train one arm from the student start for ``cfg.updates`` updates, then evaluate it: held-out and seen
    questions at the end, held-out curve points at each intermediate checkpoint (which are then removed)."""
    from agents.llm.models import load_pretrained
    from agents.llm.ppo import train_rl
    from agents.llm.training import Timer
    from distill.trainer import train_memopd

    out = Path(cfg.out) / "arms" / arm / f"seed{seed}"
    run_cfg = arm_config(cfg, arm, seed, student, teacher)
    settings = _arm_settings(cfg, run_cfg)
    if (res := _done(out)) is not None:
        if res.get("settings", settings) != settings:  # a cached run of another configuration is not this arm
            old = res["settings"]
            changed = sorted(k for k in set(settings) | set(old) if old.get(k) != settings.get(k))
            raise SettingsMismatchError(f"{out / 'result.json'} was trained with other settings "
                                        f"({', '.join(changed)}): use another --out, or delete that folder to "
                                        "retrain it")
        return res
    lm, tok = load_pretrained(student["path"])
    timer = Timer()
    if ARMS[arm][1] is None:
        train_rl(run_cfg, model=lm, tokenizer=tok)
    else:
        train_memopd(run_cfg, model=lm, tokenizer=tok)
    train_cpu = timer.cpu()
    held, seen = _evaluate_both(lm, tok, cfg, out, "end")  # lm was trained in place
    curve = [held.head(cfg.curve_episodes).assign(update=cfg.updates)]
    for update, path in sorted(_checkpoints(out).items()):
        if update < cfg.updates:
            mid_lm, mid_tok = load_pretrained(path)
            curve.append(evaluate_per_seed(mid_lm, mid_tok, cfg, pool="heldout", episodes=cfg.curve_episodes)
                         .assign(update=update))
            shutil.rmtree(path)  # an intermediate checkpoint of this run, kept only for its curve point
    curve_frame = pd.concat(curve).sort_values(["update", "seed"], kind="stable")[["update", "seed", "f1", "em"]]
    write_atomic(out / "curve.csv", lambda tmp: curve_frame.to_csv(tmp, index=False))
    metrics = pd.read_csv(out / "metrics.csv")
    res = {"arm": arm, "seed": seed, "train_cpu_seconds": train_cpu, "f1": float(held.f1.mean()),
           "em": float(held.em.mean()), "seen_f1": float(seen.f1.mean()),
           "update_s": float(metrics["update_s"].mean()), "rollout_s": float(metrics["rollout_s"].mean()),
           "approx_kl_first": float(metrics["approx_kl"].iloc[0]) if "approx_kl" in metrics else math.nan,
           "clipfrac_first": float(metrics["clipfrac"].iloc[0]) if "clipfrac" in metrics else math.nan,
           **{k: float(metrics[k].mean()) for k in ("credit_share", "credit_mean", "flat_credited_tokens",
                                                    "zero_variance_groups", "distill_loss") if k in metrics},
           "settings": settings}
    _write_json(out / "result.json", res)
    return res


def _sample_records(lm, tok, cfg: ExperimentConfig, episodes: int, seed: int = 123):
    """One GRPO-shaped batch of training-temperature episodes (records for timing and diagnostics)."""
    from agents.llm.policy import LLMPolicy
    from agents.llm.rollouts import records_of, rollout

    env_fn = make_env_fn(cfg)
    group = cfg.group_size
    tasks = max(1, episodes // group)
    seeds = [9 * 10**6 + t for t in range(tasks) for _ in range(group)]
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

    from agents.llm.models import load_pretrained
    from agents.llm.training import ActorCritic
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
    from agents.llm.models import load_pretrained
    from agents.llm.training import latest_checkpoint
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


# ---------------------------------------------------------------------- report
_GAIN = ["gain_f1", "gain_f1_se", "gain_f1_t", "gain_f1_df", "gain_f1_p", "gain_f1_ci_low", "gain_f1_ci_high",
         "gain_f1_boot_low", "gain_f1_boot_high", "gain_f1_episode_se"]
RESULT_COLUMNS = (["arm", "label", "seeds", "updates", "eval_episodes", "seen_eval_episodes", "inference",
                   "start_f1", "end_f1", "end_f1_seed_sd", *_GAIN,
                   "seen_start_f1", "seen_end_f1", "seen_gain_f1", "seen_gain_f1_se", "seen_gain_f1_t",
                   "start_em", "end_em", "gain_em", "gain_em_se", "gain_em_t",
                   "peak_context_tokens", "peak_scored_tokens", "approx_kl_first", "clipfrac_first",
                   "credit_share", "flat_credited_tokens", "distill_loss", "update_s", "train_cpu_min"])
COMPARISON_COLUMNS = ["a", "b", "seeds", "diff", "se", "t", "df", "p", "ci_low", "ci_high", "boot_low",
                      "boot_high", "ratio", "seen_diff", "seen_se", "seen_t"]
#: (a, b) pairs compared when both arms ran: the matched control first
COMPARISONS = [("memopd", "teacher_persistent"), ("memopd", "rl"), ("memopd", "flattening"),
               ("teacher_persistent", "rl"), ("flattening", "rl"), ("memopd_himpo", "memopd")]


def _peak_scored(timing: pd.DataFrame, reconstructions: set[str]) -> float:
    """The longest scored sequence of the timing records under these reconstructions (nan if not measured)."""
    if not {"reconstruction", "peak_scored_tokens"} <= set(timing.columns):
        return math.nan
    rows = timing[timing.reconstruction.isin(reconstructions)]
    return float(rows.peak_scored_tokens.max()) if len(rows) else math.nan


def _mean_of(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if key in r and r[key] is not None and not math.isnan(r[key])]
    return float(np.mean(values)) if values else math.nan


def results_table(cfg: ExperimentConfig, start: pd.DataFrame, ends: dict[str, list[pd.DataFrame]],
                  runs: dict[str, list[dict]], timing: pd.DataFrame, start_seen: pd.DataFrame | None = None,
                  ends_seen: dict[str, list[pd.DataFrame]] | None = None) -> pd.DataFrame:
    """One row per arm (columns :data:`RESULT_COLUMNS`): held-out F1 (the headline) and EM, seen F1."""
    rows = []
    for arm, arm_ends in ends.items():
        fields = ARMS[arm][1] or {}
        layouts = {fields.get("reconstruction", "aligned"), fields.get("teacher_reconstruction") or "aligned"}
        row = {"arm": arm, "label": ARMS[arm][0], "seeds": len(arm_ends), "updates": cfg.updates,
               "eval_episodes": len(start), "inference": "seed-level t",
               **arm_summary(start, arm_ends),
               "peak_context_tokens": float(np.mean([e.peak_context_tokens.max() for e in arm_ends])),
               "peak_scored_tokens": _peak_scored(timing, layouts if fields else {"aligned"}),
               "update_s": _mean_of(runs[arm], "update_s"),
               "train_cpu_min": _mean_of(runs[arm], "train_cpu_seconds") / 60,
               **{k: _mean_of(runs[arm], k) for k in ("approx_kl_first", "clipfrac_first", "credit_share",
                                                      "flat_credited_tokens", "distill_loss")}}
        if start_seen is not None and ends_seen is not None:
            row.update(arm_summary(start_seen, ends_seen[arm], prefix="seen_"))
            row["seen_eval_episodes"] = len(start_seen)
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS)


def comparisons_table(ends: dict[str, list[pd.DataFrame]],
                      ends_seen: dict[str, list[pd.DataFrame]] | None = None) -> pd.DataFrame:
    """Every pair of :data:`COMPARISONS` whose arms both ran: end F1 of ``a`` minus ``b`` on held-out questions,
    paired by training seed and episode (columns :data:`COMPARISON_COLUMNS`)."""
    rows = []
    for a, b in COMPARISONS:
        if a in ends and b in ends:
            c = compare_arms(ends[a], ends[b])
            row = {"a": a, "b": b, "seeds": c["n_seeds"], "diff": c["mean"], "se": c["se"], "t": c["t"],
                   "df": c["df"], "p": c["p"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                   "boot_low": c["boot_low"], "boot_high": c["boot_high"], "ratio": c["ratio"]}
            if ends_seen is not None:
                s = compare_arms(ends_seen[a], ends_seen[b])
                row.update(seen_diff=s["mean"], seen_se=s["se"], seen_t=s["t"])
            rows.append(row)
    return pd.DataFrame(rows).reindex(columns=COMPARISON_COLUMNS)


def _seen_detail(row, value: str, se: str, who: str = "") -> str:
    """``; seen questions{who}: +x ± se (t t)``: the same figure on seen questions, beside the headline."""
    v, e = row.get(value, math.nan), row.get(se, math.nan)
    if v is None or e is None or not (math.isfinite(v) and math.isfinite(e)):
        return ""
    t = v / e if e > 0 else math.nan
    return f"; seen questions{who}: {v:+.3f} ± {e:.3f} (t {t:.1f})"


def targets(table: pd.DataFrame, comparisons: pd.DataFrame, teacher: dict | None = None,
            student: dict | None = None) -> list[dict[str, Any]]:
    """The set-up conditions and MemOPD's claims as targets, measured on held-out questions (``met`` a bool, ``value``
    the figure). A gain or a difference counts only beyond 3 seed-level standard errors (|t| > 3); a ratio to a
    gain that is not positive is undefined."""
    by = table.set_index("arm")
    pairs = comparisons.set_index(["a", "b"]) if len(comparisons) else None
    out = []
    if teacher is not None:
        out.append({"target": "teacher held-out F1 >= 0.6", "value": teacher["f1"], "met": teacher["f1"] >= 0.6,
                    "detail": f"± {teacher['f1_se']:.3f} (episodes); seen questions "
                              f"{teacher.get('seen_f1', math.nan):.3f}"})
    if student is not None:
        out.append({"target": "student start held-out F1 <= 0.3", "value": student["f1"],
                    "met": student["f1"] <= 0.3, "detail": f"± {student['f1_se']:.3f} (episodes)"})
    if pairs is not None and ("memopd", "teacher_persistent") in pairs.index:
        c = pairs.loc[("memopd", "teacher_persistent")]
        sign = "aligned above" if c["diff"] > 0 else ("aligned below" if c["diff"] < 0 else "no difference")
        out.append({"target": "MemOPD vs teacher-persistent control separated beyond 3 seed-level SE",
                    "value": c["t"], "met": bool(abs(c["t"]) > 3),
                    "detail": f"{sign}: end F1 difference {c['diff']:+.3f} ± {c['se']:.3f} (t {c['t']:.1f}, "
                              f"df {int(c['df'])}, p {c['p']:.3g})" + _seen_detail(c, "seen_diff", "seen_se")})
        out.append({"target": "aligned end F1 >= 1.07x teacher-persistent, beyond 3 SE", "value": c["ratio"],
                    "met": bool(c["ratio"] >= 1.07 and c["t"] > 3),
                    "detail": f"ratio {c['ratio']:.3f}, t {c['t']:.1f}"})
    if {"memopd", "rl"} <= set(by.index):
        g_m, g_r = by.loc["memopd", "gain_f1"], by.loc["rl", "gain_f1"]
        significant = bool(by.loc["memopd", "gain_f1_t"] > 3)
        ratio = g_m / g_r if g_r > 0 else math.nan
        out.append({"target": "MemOPD gain > 3 SE and >= 2x GRPO alone's gain", "value": ratio,
                    "met": significant and (g_r <= 0 or ratio >= 2),
                    "detail": f"gains {g_m:+.3f} ± {by.loc['memopd', 'gain_f1_se']:.3f} vs {g_r:+.3f} ± "
                              f"{by.loc['rl', 'gain_f1_se']:.3f} (seed-level SE)"
                              + ("" if g_r > 0 else "; GRPO alone's gain not positive: ratio undefined")
                              + ("" if significant else "; MemOPD gain not > 3 SE")
                              + _seen_detail(by.loc["memopd"], "seen_gain_f1", "seen_gain_f1_se", " MemOPD")
                              + _seen_detail(by.loc["rl"], "seen_gain_f1", "seen_gain_f1_se", " GRPO alone")})
    for arm, row in by.iterrows():
        if row["gain_f1"] > 0:
            out.append({"target": f"{arm}: gain > 3 SE", "value": row["gain_f1_t"],
                        "met": bool(row["gain_f1_t"] > 3),
                        "detail": f"{row['gain_f1']:+.3f} ± {row['gain_f1_se']:.3f}, t {row['gain_f1_t']:.1f} "
                                  f"(df {int(row['gain_f1_df'])})"})
    return out


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A pipe table of ``frame`` (floats formatted with ``floatfmt``); no tabulate dependency."""
    def cell(v: Any) -> str:
        return format(v, floatfmt) if isinstance(v, (float, np.floating)) else str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _f(v: float, fmt: str = ".3f", signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return format(v, ("+" if signed else "") + fmt)


def format_markdown(cfg: ExperimentConfig, table: pd.DataFrame, comparisons: pd.DataFrame, teacher: dict,
                    student: dict, timing: pd.DataFrame, diagnostics: pd.DataFrame | None, host: str,
                    goals: list[dict]) -> str:
    """results.md: setup, the arm table, the comparisons, timing, diagnostics and the targets."""
    seeds = int(table.seeds.max())
    lines = [f"# MemOPD experiment ({ENV_ID} {cfg.env_kwargs})", "", host, "",
             f"questions: the world's entities split before training, {cfg.heldout_fraction:.0%} held out: "
             "SFT, probes and GRPO episodes draw train-pool questions only; **held-out** = questions about "
             "held-out entities (never trained on), **seen** = train-pool questions on evaluation seeds",
             f"teacher: d={teacher['hidden']} x {teacher['layers']} layers ({teacher['parameters']:,} parameters), "
             f"{teacher['steps']} SFT steps, held-out F1 {teacher['f1']:.3f} ± {teacher['f1_se']:.3f}, "
             f"EM {teacher['em']:.3f}; seen F1 {teacher.get('seen_f1', math.nan):.3f}",
             f"student start: d={student['hidden']} x {student['layers']} layers ({student['parameters']:,} "
             f"parameters, teacher's tokenizer), {student['steps']} SFT steps, held-out F1 {student['f1']:.3f} ± "
             f"{student['f1_se']:.3f}, EM {student['em']:.3f}; seen F1 {student.get('seen_f1', math.nan):.3f}",
             f"arms: {cfg.updates} GRPO updates x {cfg.tasks_per_update * cfg.group_size} episodes "
             f"({cfg.tasks_per_update} tasks x {cfg.group_size}), lr {cfg.lr}, KL {cfg.kl_coef}, temperature "
             f"{cfg.temperature}, lambda {cfg.distill_coef}; {seeds} training seeds; evaluation: "
             f"{int(table.eval_episodes.max())} held-out and {cfg.seen_eval_episodes} seen episodes (greedy), the "
             "same episodes at the start and the end", "",
             f"Inference: {INFERENCE} (df = {seeds - 1}); the 95% CI is the t interval, the bootstrap interval a "
             "two-level bootstrap over training seeds and evaluation episodes; 'episode SE' averages the seeds "
             "first and is shown only to compare (it leaves out the training-seed variance).", "",
             "| arm | held-out F1 start | end (± sd over seeds) | gain ± SE (seeds) | t | p | 95% CI (t) | "
             "95% CI (bootstrap) | episode SE | seen F1 end | seen gain ± SE | EM gain ± SE | approx-KL update 1 | "
             "credit share / tokens credited in flat groups | s/update | CPU-min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table.itertuples():
        lines.append(
            f"| {r.label} | {r.start_f1:.3f} | {r.end_f1:.3f} ± {_f(r.end_f1_seed_sd)} | "
            f"{_f(r.gain_f1, signed=True)} ± {_f(r.gain_f1_se)} | {_f(r.gain_f1_t, '.1f')} | "
            f"{_f(r.gain_f1_p, '.3g')} | "
            f"[{_f(r.gain_f1_ci_low, '+.3f')}, {_f(r.gain_f1_ci_high, '+.3f')}] | "
            f"[{_f(r.gain_f1_boot_low, '+.3f')}, {_f(r.gain_f1_boot_high, '+.3f')}] | "
            f"{_f(r.gain_f1_episode_se)} | {_f(r.seen_end_f1)} | {_f(r.seen_gain_f1, signed=True)} ± "
            f"{_f(r.seen_gain_f1_se)} | {_f(r.gain_em, signed=True)} ± {_f(r.gain_em_se)} | "
            f"{_f(r.approx_kl_first, '.4f')} | {_f(r.credit_share, '.2f')} / {_f(r.flat_credited_tokens, '.0f')} | "
            f"{_f(r.update_s, '.1f')} | "
            f"{_f(r.train_cpu_min, '.1f')} |")
    if len(comparisons):
        lines += ["", "Comparisons (held-out end F1 of a minus b, paired by training seed and episode; seed-level "
                      "SE, t on df; ratio = end F1 a / b):", "",
                  "| a | b | difference ± SE | t | df | p | 95% CI (t) | 95% CI (bootstrap) | ratio | "
                  "seen difference ± SE |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in comparisons.itertuples():
            lines.append(f"| {c.a} | {c.b} | {_f(c.diff, signed=True)} ± {_f(c.se)} | {_f(c.t, '.1f')} | "
                         f"{int(c.df)} | {_f(c.p, '.3g')} | [{_f(c.ci_low, '+.3f')}, {_f(c.ci_high, '+.3f')}] | "
                         f"[{_f(c.boot_low, '+.3f')}, {_f(c.boot_high, '+.3f')}] | {_f(c.ratio)} | "
                         f"{_f(c.seen_diff, signed=True)} ± {_f(c.seen_se)} |")
    lines += ["", "Actor timing on one update's records (start student; see timing.csv):", "",
              markdown_table(timing, ".3f")]
    if diagnostics is not None:
        cols = [c for c in ("method", "max_abs_dlogp", "p99_abs_dlogp", "clip_share", "action_tokens", "tokens")
                if c in diagnostics.columns]
        lines += ["", "Misalignment of the flattened transcript, on records of the flattening arm's final student "
                      "(|d log-prob| vs the sampled log-probs; clip_share: tokens whose ratio against the sampled "
                      "log-probs leaves [0.8, 1.2]; that arm recomputes its old log-probs, so its own ratio starts "
                      "at 1):", "", markdown_table(diagnostics[cols], ".4f")]
    lines += ["", "Targets:", ""] + [f"- {g['target']}: {_f(g['value'], '.2f')} — {'met' if g['met'] else 'MISSED'} "
                                    f"({g['detail']})" for g in goals]
    return "\n".join(lines) + "\n"


def curve_frame(cfg: ExperimentConfig, arm: str, start: pd.DataFrame) -> pd.DataFrame:
    """Held-out F1 per (update, training seed) of one arm on the curve's episodes (update 0: the start)."""
    frames = []
    for s in range(cfg.seeds):
        path = Path(cfg.out) / "arms" / arm / f"seed{s}" / "curve.csv"
        if path.exists():
            c = pd.read_csv(path)
            first = start.head(cfg.curve_episodes)
            frames.append(pd.concat([first.assign(update=0)[["update", "seed", "f1"]], c[["update", "seed", "f1"]]])
                          .groupby("update", as_index=False)["f1"].mean().assign(training_seed=s))
    return pd.concat(frames) if frames else pd.DataFrame(columns=["update", "f1", "training_seed"])


def plot_curves(cfg: ExperimentConfig, path: Path, start: pd.DataFrame | None = None) -> None:
    """Left: held-out F1 per arm over updates (mean over training seeds, band ± 1 SE across seeds). Right: the
    distillation loss per update (each OPD arm against its own teacher layout; mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if start is None:
        start = pd.read_csv(Path(cfg.out) / "student" / "start_eval.csv")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for arm in cfg.arms:
        color = f"C{list(ARMS).index(arm)}"  # one colour per arm in both panels
        label = ARMS[arm][0]
        short = label if len(label) <= 40 else label.split(" (")[0]
        c = curve_frame(cfg, arm, start)
        if len(c):
            per = c.pivot(index="update", columns="training_seed", values="f1").sort_index()
            mean = per.mean(axis=1).to_numpy()
            n = per.notna().sum(axis=1).to_numpy()
            se = (per.std(axis=1, ddof=1).to_numpy() / np.sqrt(np.maximum(n, 1))) if per.shape[1] > 1 \
                else np.zeros_like(mean)
            x = per.index.to_numpy()
            axes[0].plot(x, mean, marker="o", label=f"{short} (n={per.shape[1]})", color=color)
            axes[0].fill_between(x, mean - np.nan_to_num(se), mean + np.nan_to_num(se), alpha=0.2, color=color)
        frames = [pd.read_csv(p) for p in sorted((Path(cfg.out) / "arms" / arm).glob("seed*/metrics.csv"))]
        frames = [f[f["update"] > 0] for f in frames if "distill_loss" in f]
        if frames:
            n_up = min(len(f) for f in frames)
            dl = np.stack([f["distill_loss"].to_numpy(float)[:n_up] for f in frames]).mean(0)
            axes[1].plot(frames[0]["update"].to_numpy()[:n_up], dl, label=short, color=color)
    from matplotlib.ticker import MaxNLocator

    axes[0].set_ylim(0, max(0.05, axes[0].get_ylim()[1]))
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set(xlabel="GRPO update", ylabel="F1 on held-out questions (greedy)",
                title=f"held-out F1, mean ± SE over {cfg.seeds} training seeds")
    axes[1].set(xlabel="GRPO update", ylabel="reverse KL to the teacher (nats/token)",
                title="distillation loss (each arm's teacher layout)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def _exit_with_parent(parent_pid: int, poll_seconds: float = 1.0) -> None:
    """Worker initializer: end this worker when the experiment's process is gone (killed rather than
    interrupted), instead of training the queued arms on as an orphan."""
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_arms(cfg: ExperimentConfig, jobs: list[tuple[str, int]], student: dict, teacher: dict) -> dict:
    """Every (arm, seed) run; ``cfg.workers`` > 1 runs them in that many processes (one torch thread each by
    default). Why processes, not threads: on a shared 2-core machine a 2-thread tiny-model step was several
    times *slower* than a 1-thread one (every op waits for the thread that lost its core), while two 1-thread
    processes each keep their own pace."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing

    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc="arms x seeds", unit="run", disable=not cfg.progress)
    results = {}
    todo = [j for j in jobs if _done(Path(cfg.out) / "arms" / j[0] / f"seed{j[1]}") is None]
    for job in jobs:
        if job not in todo:
            results[job] = run_arm(cfg, *job, student, teacher)  # cached: reads result.json
            bar.update(1)
    if cfg.workers == 1 or len(todo) <= 1:
        for job in todo:
            results[job] = run_arm(cfg, *job, student, teacher)
            bar.update(1)
    else:
        quiet = replace(cfg, progress=False)  # one bar (this one), not one per worker
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that already ran torch threads
        with ProcessPoolExecutor(max_workers=min(cfg.workers, len(todo)), mp_context=ctx,
                                 initializer=_exit_with_parent, initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(run_arm, quiet, *job, student, teacher): job for job in todo}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.update(1)
    bar.close()
    return results


def _config_record(cfg: ExperimentConfig) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(cfg), default=list))


def check_settings(cfg: ExperimentConfig) -> None:
    """Refuse (:class:`SettingsMismatchError`, naming the settings) a rerun on an output folder whose
    ``experiment.json`` records other settings than ``cfg``, except those of :data:`RERUN_MAY_CHANGE`: its
    cached teacher, student and arms were made with them."""
    path = Path(cfg.out) / "experiment.json"
    if not path.exists() or not any((Path(cfg.out) / stage).exists() for stage in ("teacher", "student", "arms")):
        return  # no stage made with those settings (a run that failed first): nothing to protect
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SettingsMismatchError(f"{path}: cannot be read as the settings of an earlier run ({err})") from None
    new = _config_record(cfg)
    # A setting added after that run was made is read as its default (what that run did): fill it in, at the
    # top level and inside the model specs, before comparing.
    default = _config_record(replace(ExperimentConfig(), teacher=ModelSpec(), student=ModelSpec()))
    old = {**{k: v for k, v in default.items() if k not in ("teacher", "student")}, **old}
    for role in ("teacher", "student"):
        if isinstance(old.get(role), dict):
            old[role] = {**default[role], **old[role]}
    changed = sorted(k for k in set(old) | set(new) if k not in RERUN_MAY_CHANGE and old.get(k) != new.get(k))
    if changed:
        detail = ", ".join(f"{k} {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in changed[:6])
        more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
        raise SettingsMismatchError(f"{cfg.out} holds a run with other settings: {detail}{more}; use another "
                                    "--out (or the earlier settings) to keep its cached stages")


#: Where ``run_experiment(until=...)`` / ``--until`` may stop: after the teacher's or the student's stage.
STAGES = ("teacher", "student")


def run_experiment(cfg: ExperimentConfig, until: str | None = None) -> pd.DataFrame:
    """All stages (cached, resumable); returns the results table and writes the outputs under ``cfg.out``.

    ``until`` (``"teacher"`` or ``"student"``) stops after that stage, its result cached as a full run would
    leave it (a later call without ``until`` resumes from it), and returns that stage's one-row summary instead
    of the results table: the teacher's and the weak start's F1 can be measured before the arms are paid for."""
    if until is not None and until not in STAGES:
        raise ValueError(f"until must be one of {list(STAGES)} or None, got {until!r}")
    import torch

    from agents.llm.precision import host_line, resolve_autocast

    check_settings(cfg)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    host = host_line(resolve_autocast("auto")) + " (SFT: autocast as shown; RL and distillation: fp32)"
    _log(cfg, host)
    write_text_atomic(out / "experiment.json", json.dumps(_config_record(cfg), indent=2))
    teacher = build_teacher(cfg)
    _log(cfg, f"teacher: held-out F1 {teacher['f1']:.3f} (EM {teacher['em']:.3f}), seen {teacher['seen_f1']:.3f}")
    if until == "teacher":
        return stage_summary({"teacher": teacher})
    student = build_student(cfg, teacher)
    _log(cfg, f"student start: held-out F1 {student['f1']:.3f} (EM {student['em']:.3f}), seen "
              f"{student['seen_f1']:.3f}")
    if until == "student":
        return stage_summary({"teacher": teacher, "student": student})
    start = pd.read_csv(out / "student" / "start_eval.csv")
    start_seen = pd.read_csv(out / "student" / "start_eval_seen.csv")
    timing = actor_timing(cfg, student)
    jobs = [(arm, s) for arm in cfg.arms for s in range(cfg.seeds)]
    results = _run_arms(cfg, jobs, student, teacher)
    runs = {arm: [results[(arm, s)] for s in range(cfg.seeds)] for arm in cfg.arms}
    read = lambda arm, name: [pd.read_csv(out / "arms" / arm / f"seed{s}" / name)  # noqa: E731
                              for s in range(cfg.seeds)]
    ends = {arm: read(arm, "end_eval.csv") for arm in cfg.arms}
    ends_seen = {arm: read(arm, "end_eval_seen.csv") for arm in cfg.arms}
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


# ---------------------------------------------------------------------- CLI
def _run(args: argparse.Namespace) -> int:
    from memenv.cli import CommandError, check_out_dir, user_input

    check_out_dir(args.out)  # a file, or a folder that cannot be made: one line, before any work
    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("seeds", "updates", "eval_episodes", "threads",
                                                               "workers", "student_start_f1", "student_max_steps",
                                                               "lr", "distill_coef", "seen_eval_episodes",
                                                               "curve_every", "curve_episodes")
                                 if getattr(args, k) is not None}
    overrides["progress"] = not args.quiet
    if args.arms:
        overrides["arms"] = tuple(dict.fromkeys(args.arms))
    with user_input():
        if args.model:
            cfg = pretrained_config(args.out, args.model, **{**(PRETRAINED_QUICK if args.quick else {}), **overrides})
        else:
            cfg = quick_config(args.out, **overrides) if args.quick else ExperimentConfig(out=args.out, **overrides)
        if args.teacher_minutes is not None or args.teacher_clock is not None:
            cfg.teacher = replace(cfg.teacher, **({"sft_minutes": args.teacher_minutes}
                                                  if args.teacher_minutes is not None else {}),
                                  **({"sft_clock": args.teacher_clock} if args.teacher_clock else {}))
        if args.student_steps is not None:
            cfg.student = replace(cfg.student, sft_steps=args.student_steps)
        if args.sft_worlds is not None:
            cfg.teacher = replace(cfg.teacher, sft_worlds=args.sft_worlds)
            cfg.student = replace(cfg.student, sft_worlds=args.sft_worlds)
        cfg.__post_init__()
        if cfg.model:  # a missing or damaged folder, or a registered model not installed: one line, before any work
            from agents.llm.cli import check_checkpoint

            check_checkpoint(cfg.model, "--model")
        check_settings(cfg)
    t0 = time.perf_counter()
    try:
        table = run_experiment(cfg, until=args.until)
    except SettingsMismatchError as err:  # a cached arm of another configuration
        raise CommandError(str(err)) from None
    if args.until:
        print(table.drop(columns=["path"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"stopped after the {args.until} stage, cached under {cfg.out} (a run without --until resumes "
              f"from it; {(time.perf_counter() - t0) / 60:.1f} wall-min this call)")
        return 0
    print((Path(cfg.out) / "results.md").read_text())
    print(f"wrote {Path(cfg.out) / 'results.csv'}, comparisons.csv, results.md, learning_curves.png "
          f"({(time.perf_counter() - t0) / 60:.1f} wall-min this call)")
    return 0 if len(table) else 1


def register_cli(subparsers) -> None:
    """Adds ``memenv experiment memopd`` (entry point ``memenv.commands``)."""
    from memenv.cli import non_negative_float, non_negative_int, positive_float, unit_float

    p = subparsers.add_parser("experiment", help="reproducible experiments (memopd)", description=__doc__,
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="experiment", metavar="{memopd}", required=True)
    m = sub.add_parser("memopd", help="teacher, weak student, arms x training seeds, seed-level held-out statistics",
                       description=__doc__, formatter_class=HelpFormatter)
    m.add_argument("--out", required=True, help="output folder (stages cached there; a rerun resumes)")
    m.add_argument("--quick", action="store_true",
                   help="smoke run (~8 CPU-minutes): small models, few updates; checks the pipeline, not the claims")
    m.add_argument("--model", default=None,
                   help="a pretrained base (registered name, e.g. smollm2-135m-instruct, or a checkpoint folder): "
                        "teacher = its SFT, student = its first layers (sizes: distill.experiment.pretrained_config; "
                        "with --quick: 4- and 2-layer cuts, a few steps)")
    m.add_argument("--seeds", type=positive_int, default=None, help="training seeds per arm (default 5; quick 2)")
    m.add_argument("--updates", type=positive_int, default=None, help="GRPO updates per arm (default 120; quick 4)")
    m.add_argument("--eval-episodes", dest="eval_episodes", type=positive_int, default=None,
                   help="held-out episodes, the same at start and end (default 400; quick 100)")
    m.add_argument("--seen-eval-episodes", dest="seen_eval_episodes", type=positive_int, default=None,
                   help="train-pool (seen) question episodes at start and end (default 200; quick 50)")
    m.add_argument("--curve-every", dest="curve_every", type=positive_int, default=None,
                   help="held-out learning-curve point every this many updates (default 40; quick 2)")
    m.add_argument("--curve-episodes", dest="curve_episodes", type=positive_int, default=None,
                   help="held-out episodes per learning-curve point (default 200; quick 50)")
    m.add_argument("--arms", nargs="+", choices=list(ARMS), default=None,
                   help=f"default: {' '.join(DEFAULT_ARMS)} (quick: all)")
    m.add_argument("--threads", type=positive_int, default=None, help="torch threads per process (default 1)")
    m.add_argument("--workers", type=positive_int, default=None,
                   help="arm runs in parallel processes (default: one per core)")
    m.add_argument("--teacher-minutes", dest="teacher_minutes", type=positive_float, default=None,
                   help="teacher SFT budget in minutes (default 70; quick 3)")
    m.add_argument("--teacher-clock", dest="teacher_clock", choices=["cpu", "wall"], default=None,
                   help="clock of that budget (default cpu: process CPU time, all threads)")
    m.add_argument("--student-steps", dest="student_steps", type=positive_int, default=None,
                   help="student SFT steps per weak-start round (default 150; quick 200)")
    m.add_argument("--student-max-steps", dest="student_max_steps", type=positive_int, default=None,
                   help="at most this many student SFT steps in all (default 3000; quick 400)")
    m.add_argument("--student-start-f1", dest="student_start_f1", type=unit_float, default=None,
                   help="probe F1 that ends the student's weak-start SFT rounds (default 0.15)")
    m.add_argument("--sft-worlds", dest="sft_worlds", type=non_negative_int, default=None,
                   help="teacher and student SFT demonstrations spread over this many other worlds of the "
                        "generator, not world 0 (default 0: world 0's train-pool questions)")
    m.add_argument("--lr", type=positive_float, default=None, help="learning rate of every arm (default 3e-4)")
    m.add_argument("--distill-coef", dest="distill_coef", type=non_negative_float, default=None,
                   help="lambda of the distillation loss in the OPD arms (default 1.0)")
    m.add_argument("--until", choices=list(STAGES), default=None,
                   help="stop after this stage (cached; a later run without --until resumes): measure the "
                        "teacher or the weak start before paying for the arms")
    m.add_argument("--quiet", action="store_true", help="no progress bars")
    m.set_defaults(func=_run)


__all__ = ["ExperimentConfig", "ModelSpec", "ARMS", "DEFAULT_ARMS", "quick_config", "pretrained_config", "paired_stats",
           "arm_summary", "compare_arms", "comparisons_table", "run_experiment", "register_cli", "SettingsMismatchError",
           "check_settings", "pool_env_kwargs"]
