"""``memenv experiment memopd``: the MemOPD claims reproduced in miniature, with paired statistics, on a CPU.

    memenv experiment memopd --out runs/memopd            # the full run (teacher cached under OUT/teacher)
    memenv experiment memopd --out runs/memopd_quick --quick

Task: MemQA-v0 with 2 objectives (the paper's Q2), single-hop questions, no comparisons and one document per
search (a tiny teacher trained for 70 CPU-minutes reaches held-out F1 ~0.9 there; see README "Results").

Stages, each cached under ``OUT`` and skipped on a rerun when its ``result.json`` exists (resume):

1. ``teacher/``: a tiny Qwen2 (d=128, 4 layers) SFT'd on oracle trajectories (:func:`agents.llm.sft.train_sft`);
2. ``student/``: a smaller model (d=64, 2 layers) with the *teacher's tokenizer*, from a weak SFT (rounds until
   a probe F1 reaches ``student_start_f1``);
   its greedy held-out F1/EM per evaluation seed is the common start of every arm;
3. ``arms/ARM/seedS/``: from that start, the same number of GRPO updates with the same hyper-parameters:
   ``rl`` (GRPO alone), ``opd_persistent`` (GRPO + on-policy distillation scored on the persistent-history
   reconstruction: the matched control), ``memopd`` (aligned reconstruction) and ``memopd_himpo`` (aligned +
   HiMPO memory credit); at the end, greedy held-out evaluation on the same seeds as the start;
4. ``timing.csv``: actor forward+backward CPU seconds per update, padded (record order, and length-sorted
   buckets: the best padded baseline) vs shared-prefix and prefix-tree packing, on one update's records;
   ``diagnostics.csv``: :func:`distill.diagnose.diagnose` of the persistent arm's final student (p99
   |d log-prob|, false-clip share);
5. ``results.csv`` / ``results.md`` (tables, targets) and ``learning_curves.png``, written atomically.

Statistics: the start and the end of an arm are evaluated on the same held-out seeds, so a gain is a *paired*
difference: ``d_j = F1_end(j) - F1_start(j)``; with several training seeds, ``d_j`` is first averaged over them;
the gain is ``mean_j d_j`` and its standard error ``sd_j(d_j) / sqrt(n)`` (``sd`` with ``ddof=1``). The spread
over training seeds is reported apart (``std`` over the seeds' gains).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from agents.files import write_atomic, write_text_atomic
from distill import check_attention_backend
from memenv.cli import HelpFormatter, positive_int

ENV_ID = "MemQA-v0"
# One document per search (top_k=1; the oracle searches by exact title, so its evidence is always the top hit):
# a turn's context stays ~3x shorter than with top_k=3, so a CPU trains ~1.6x more SFT steps per CPU-second and
# the tiny teacher learns the task within its budget. Memory still matters: the first answer must be kept while
# the second is looked up.
ENV_KWARGS = {"objectives": 2, "hops": 1, "comparison_rate": 0.0, "top_k": 1}
ARMS = {  # name -> (label, MemOPD fields; None: GRPO alone)
    "rl": ("GRPO alone", None),
    "opd_persistent": ("GRPO + OPD, persistent history", {"reconstruction": "persistent", "credit": "none"}),
    "memopd": ("MemOPD (GRPO + OPD, aligned)", {"reconstruction": "aligned", "credit": "none"}),
    "memopd_himpo": ("MemOPD + HiMPO", {"reconstruction": "aligned", "credit": "himpo"}),
}


@dataclass
class ModelSpec:
    """A tiny Qwen2 model and the SFT that trains it."""

    hidden: int = 128
    layers: int = 4
    heads: int = 8
    sft_steps: int = 100000  # the budget (minutes) usually ends the teacher's SFT first
    sft_minutes: float | None = 70.0
    sft_clock: str = "cpu"  # budget clock: "cpu" (process CPU time, all threads) or "wall"
    sft_episodes: int = 2000  # oracle demonstrations
    lr: float = 3e-3


@dataclass
class ExperimentConfig:
    """Every knob of the experiment; :func:`quick_config` is the smoke-run preset."""

    out: str = "runs/memopd"
    env_kwargs: dict[str, Any] = field(default_factory=lambda: dict(ENV_KWARGS))
    teacher: ModelSpec = field(default_factory=ModelSpec)
    student: ModelSpec = field(default_factory=lambda: ModelSpec(hidden=64, layers=2, heads=4, sft_steps=150,
                                                                 sft_minutes=None))
    # The weak start: the student's SFT runs in rounds of student.sft_steps until greedy F1 on probe seeds
    # (neither training nor held-out seeds) reaches student_start_f1, or student_max_steps are spent. A start
    # with no reward at all gives GRPO nothing to learn from (every group has zero variance).
    student_start_f1: float = 0.15
    student_max_steps: int = 3000
    probe_episodes: int = 100
    vocab: int = 8192
    tokenizer_episodes: int = 200
    arms: tuple[str, ...] = tuple(ARMS)
    seeds: int = 3
    updates: int = 50
    tasks_per_update: int = 4
    group_size: int = 4
    lr: float = 3e-4  # 1e-3 made the KL to the start policy explode in a 6-update probe
    kl_coef: float = 0.02
    temperature: float = 0.7
    distill_coef: float = 1.0
    # Attention of the packed (shared-prefix) forwards of the OPD arms: sdpa_blocks is exact (tested against the
    # dense mask) and avoids the dense [L, L] mask, which cost more than the shared prefix saved on CPU.
    attention_backend: str = "sdpa_blocks"
    eval_episodes: int = 400
    max_new_tokens: int = 64
    num_envs: int = 16
    threads: int = 1  # torch threads per process of the arms (see workers)
    sft_threads: int = field(default_factory=lambda: os.cpu_count() or 1)  # teacher and student SFT run alone
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # arm runs in parallel processes
    timing_rounds: int = 3
    diagnose_episodes: int = 16
    progress: bool = True

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {list(ARMS)}, got {list(self.arms)}")
        for name in ("seeds", "updates", "tasks_per_update", "eval_episodes", "max_new_tokens", "threads", "workers",
                     "sft_threads", "probe_episodes", "student_max_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_attention_backend(self.attention_backend)
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.distill_coef >= 0:
            raise ValueError(f"distill_coef must be >= 0, got {self.distill_coef}")
        if not 0 <= self.student_start_f1 <= 1:
            raise ValueError(f"student_start_f1 must be in [0, 1], got {self.student_start_f1}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO), got {self.group_size}")
        for spec in (self.teacher, self.student):
            if spec.sft_clock not in ("cpu", "wall"):
                raise ValueError(f"sft clock must be 'cpu' or 'wall', got {spec.sft_clock!r}")


def quick_config(out: str, **overrides: Any) -> ExperimentConfig:
    """The ``--quick`` smoke run (<= 10 CPU-minutes): small models, 2 seeds, 3 updates, 100 held-out episodes."""
    base = dict(out=out, teacher=ModelSpec(hidden=64, layers=2, heads=4, sft_steps=150, sft_minutes=3.0,
                                           sft_episodes=300), student_max_steps=30, probe_episodes=16,
                student=ModelSpec(hidden=32, layers=2, heads=2, sft_steps=30, sft_minutes=None, sft_episodes=300),
                vocab=2048, tokenizer_episodes=60, seeds=2, updates=3, tasks_per_update=2, eval_episodes=100,
                timing_rounds=1, diagnose_episodes=8)
    return ExperimentConfig(**{**base, **overrides})


# ---------------------------------------------------------------------- statistics (pure)
def paired_stats(start: Sequence[float], end: Sequence[float]) -> dict[str, float]:
    """Mean paired difference ``end - start`` over the same seeds, its standard error ``sd(ddof=1)/sqrt(n)``
    and ``z = mean / se`` (``se`` 0 -> ``z`` inf or nan)."""
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    if start.shape != end.shape or start.ndim != 1 or len(start) < 2:
        raise ValueError(f"paired_stats needs two equal-length 1-D series of >= 2 values, got {start.shape} and "
                         f"{end.shape}")
    d = end - start
    se = float(d.std(ddof=1) / math.sqrt(len(d)))
    mean = float(d.mean())
    return {"mean": mean, "se": se, "z": mean / se if se > 0 else (math.inf if mean else math.nan), "n": len(d)}


def arm_summary(start: pd.DataFrame, ends: Sequence[pd.DataFrame]) -> dict[str, float]:
    """Start vs end of one arm over its training seeds. Every frame has ``seed, f1, em`` rows on the same
    held-out seeds (checked): the gain is paired per held-out seed after averaging the end over training seeds."""
    out: dict[str, float] = {}
    for end in ends:
        if list(end["seed"]) != list(start["seed"]):
            raise ValueError("start and end evaluations are not on the same held-out seeds")
    for metric in ("f1", "em"):
        per_seed_end = np.stack([e[metric].to_numpy(float) for e in ends])  # [training seeds, eval seeds]
        stats = paired_stats(start[metric].to_numpy(float), per_seed_end.mean(axis=0))
        gains = per_seed_end.mean(axis=1) - start[metric].mean()
        out.update({f"start_{metric}": float(start[metric].mean()), f"end_{metric}": float(per_seed_end.mean()),
                    f"end_{metric}_std": float(per_seed_end.mean(axis=1).std(ddof=1)) if len(ends) > 1 else 0.0,
                    f"gain_{metric}": stats["mean"], f"gain_{metric}_se": stats["se"],
                    f"gain_{metric}_z": stats["z"],
                    f"gain_{metric}_seed_std": float(gains.std(ddof=1)) if len(ends) > 1 else 0.0})
    return out


def compare_arms(a: Sequence[pd.DataFrame], b: Sequence[pd.DataFrame], metric: str = "f1") -> dict[str, float]:
    """End of arm ``a`` minus end of arm ``b`` (each averaged over its training seeds), paired on held-out seeds."""
    ea = np.stack([e[metric].to_numpy(float) for e in a]).mean(axis=0)
    eb = np.stack([e[metric].to_numpy(float) for e in b]).mean(axis=0)
    return paired_stats(eb, ea)


# ---------------------------------------------------------------------- helpers
def _log(cfg: ExperimentConfig, text: str) -> None:
    if cfg.progress:
        print(text, flush=True)


def _done(path: Path) -> dict[str, Any] | None:
    f = path / "result.json"
    return json.loads(f.read_text()) if f.exists() else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=float))


def make_env_fn(cfg: ExperimentConfig):
    import gymnasium as gym

    import memenv  # noqa: F401 - registers the environments

    return lambda: gym.make(ENV_ID, **cfg.env_kwargs)


#: Seeds of the student's weak-start probe: neither SFT seeds (0..episodes-1) nor held-out seeds (10**7 + i).
PROBE_SEED_BASE = 2 * 10**7


def evaluate_per_seed(lm, tokenizer, cfg: ExperimentConfig, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """Greedy episodes on ``seeds`` (default: the held-out seeds :func:`agents.llm.training.eval_seeds`, never
    trained on): one row per seed with ``f1, em, peak_context_tokens, turns``."""
    from agents.llm.policy import LLMPolicy
    from agents.llm.rollouts import rollout
    from agents.llm.training import eval_seeds

    env_fn = make_env_fn(cfg)
    envs = [env_fn() for _ in range(cfg.num_envs)]
    seeds = eval_seeds(cfg.eval_episodes) if seeds is None else list(seeds)
    episodes = rollout(LLMPolicy(lm, tokenizer, temperature=0.0, max_new_tokens=cfg.max_new_tokens), envs, seeds,
                       progress=cfg.progress)
    for env in envs:
        env.close()
    return pd.DataFrame({"seed": seeds, "f1": [ep.f1 for ep in episodes],
                         "em": [float(ep.info.get("em", 0.0)) for ep in episodes],
                         "peak_context_tokens": [ep.info.get("peak_context_tokens", 0) for ep in episodes],
                         "turns": [ep.turns for ep in episodes]})


def _sft_config(cfg: ExperimentConfig, spec: ModelSpec, out: Path, model: str | None = None, **overrides: Any):
    from agents.llm.sft import SFTConfig

    return SFTConfig(env_id=ENV_ID, env_kwargs=dict(cfg.env_kwargs), out_dir=str(out), model=model, seed=0,
                     episodes=spec.sft_episodes, steps=spec.sft_steps, batch_size=16, lr=spec.lr,
                     warmup=min(100, max(1, spec.sft_steps // 10)), autocast="auto", bucket=8,
                     schedule_by="budget" if spec.sft_minutes else "steps", tiny_split_spaces="suffix",
                     tiny_vocab=cfg.vocab, tiny_min_frequency=1, tiny_tokenizer_episodes=cfg.tokenizer_episodes,
                     prompt_loss_weight=1.0, prompt_loss_fraction=0.3, eval_every=0, save_every=250,
                     keep_checkpoints=1, max_seconds=spec.sft_minutes * 60 if spec.sft_minutes else None,
                     budget_clock=spec.sft_clock, threads=cfg.sft_threads, tiny_hidden=spec.hidden,
                     tiny_layers=spec.layers, tiny_heads=spec.heads, max_new_tokens=cfg.max_new_tokens,
                     num_envs=cfg.num_envs, resume=True, progress=cfg.progress, **overrides)


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


def build_teacher(cfg: ExperimentConfig) -> dict[str, Any]:
    """SFT the teacher (resumes a partial run), then evaluate it; cached in ``OUT/teacher/result.json``."""
    from agents.llm.sft import train_sft
    from agents.llm.training import Timer, latest_checkpoint

    out = Path(cfg.out) / "teacher"
    if (res := _done(out)) is not None:
        return res
    timer = Timer()
    row = _sft_finished(out, cfg.teacher) or train_sft(_sft_config(cfg, cfg.teacher, out))
    lm, tok = _trained(out)
    ev = evaluate_per_seed(lm, tok, cfg)
    res = {"path": str(latest_checkpoint(out).resolve()), "steps": int(row.get("step")),
           "train_cpu_seconds": row.get("cpu_seconds"), "train_wall_seconds": row.get("seconds"),
           "f1": float(ev.f1.mean()), "em": float(ev.em.mean()),
           "f1_se": float(ev.f1.std(ddof=1) / math.sqrt(len(ev))), "stage_cpu_seconds": timer.cpu(),
           "parameters": sum(p.numel() for p in lm.parameters()), **asdict(cfg.teacher)}
    _write_json(out / "result.json", res)
    return res


def build_student(cfg: ExperimentConfig, teacher: dict[str, Any]) -> dict[str, Any]:
    """A smaller model on the teacher's tokenizer, weakly SFT'd; its per-seed start evaluation is saved."""
    from agents.llm.models import build_tiny_model, load_tokenizer, save_pretrained
    from agents.llm.sft import train_sft
    from agents.llm.training import latest_checkpoint, load_trainer_state

    out = Path(cfg.out) / "student"
    if (res := _done(out)) is not None:
        return res
    tok = load_tokenizer(teacher["path"])
    init = out / "init"
    if not (init / "config.json").exists():
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
        if not probes or probes[-1]["steps"] != steps:
            probes.append({"steps": steps, "probe_f1": float(evaluate_per_seed(lm, tok, cfg, probe_seeds).f1.mean())})
            write_text_atomic(probes_path, json.dumps(probes))
        _log(cfg, f"student after {steps} SFT steps: probe F1 {probes[-1]['probe_f1']:.3f} (weak-start target "
                  f"{cfg.student_start_f1})")
        if probes[-1]["probe_f1"] >= cfg.student_start_f1 or steps >= cfg.student_max_steps:
            break
        steps = min(steps + round_steps, cfg.student_max_steps)
    ev = evaluate_per_seed(lm, tok, cfg)
    write_atomic(out / "start_eval.csv", lambda tmp: ev.to_csv(tmp, index=False))
    res = {"path": str(latest_checkpoint(out / "sft").resolve()), "steps": row.get("step"),
           "train_cpu_seconds": row.get("cpu_seconds"), "f1": float(ev.f1.mean()), "em": float(ev.em.mean()),
           "f1_se": float(ev.f1.std(ddof=1) / math.sqrt(len(ev))),
           "parameters": sum(p.numel() for p in lm.parameters()), "probes": probes,
           **asdict(replace(cfg.student, sft_steps=steps))}
    _write_json(out / "result.json", res)
    return res


def arm_config(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any], teacher: dict[str, Any]):
    """The GRPO (``rl``) or MemOPD config of one arm; every arm shares the RL hyper-parameters."""
    from agents.llm.ppo import PPOConfig
    from distill.trainer import MemOPDConfig

    common = dict(algo="grpo", env_id=ENV_ID, env_kwargs=dict(cfg.env_kwargs), model=student["path"],
                  out_dir=str(Path(cfg.out) / "arms" / arm / f"seed{seed}"), seed=seed, updates=cfg.updates,
                  episodes_per_update=cfg.tasks_per_update * cfg.group_size, group_size=cfg.group_size,
                  lr=cfg.lr, kl_coef=cfg.kl_coef, temperature=cfg.temperature, epochs=2, num_minibatches=2,
                  eval_every=0, save_every=cfg.updates, keep_checkpoints=1, max_new_tokens=cfg.max_new_tokens,
                  num_envs=cfg.num_envs, threads=cfg.threads, progress=cfg.progress, resume=False)
    fields = ARMS[arm][1]
    if fields is None:
        return PPOConfig(**common)
    return MemOPDConfig(**common, teacher=teacher["path"], distill_coef=cfg.distill_coef, packing="shared_prefix",
                        attention_backend=cfg.attention_backend, **fields)


def run_arm(cfg: ExperimentConfig, arm: str, seed: int, student: dict[str, Any], teacher: dict[str, Any]) -> dict:
    """Train one arm from the student start for ``cfg.updates`` updates, then evaluate it on the held-out seeds."""
    from agents.llm.models import load_pretrained
    from agents.llm.ppo import train_rl
    from agents.llm.training import Timer
    from distill.trainer import train_memopd

    out = Path(cfg.out) / "arms" / arm / f"seed{seed}"
    run_cfg = arm_config(cfg, arm, seed, student, teacher)
    settings = {k: v for k, v in asdict(run_cfg).items() if k not in ("out_dir", "progress", "threads", "resume")}
    if (res := _done(out)) is not None:
        if res.get("settings", settings) != settings:  # a cached run of another configuration is not this arm
            changed = sorted(k for k in settings if res["settings"].get(k) != settings[k])
            raise ValueError(f"{out / 'result.json'} was trained with other settings ({', '.join(changed)}): "
                             "use another --out, or delete that folder to retrain it")
        return res
    lm, tok = load_pretrained(student["path"])
    timer = Timer()
    if ARMS[arm][1] is None:
        train_rl(run_cfg, model=lm, tokenizer=tok)
    else:
        train_memopd(run_cfg, model=lm, tokenizer=tok)
    train_cpu = timer.cpu()
    ev = evaluate_per_seed(lm, tok, cfg)  # lm was trained in place
    write_atomic(out / "end_eval.csv", lambda tmp: ev.to_csv(tmp, index=False))
    metrics = pd.read_csv(out / "metrics.csv")
    res = {"arm": arm, "seed": seed, "train_cpu_seconds": train_cpu, "f1": float(ev.f1.mean()),
           "em": float(ev.em.mean()), "update_s": float(metrics["update_s"].mean()),
           "rollout_s": float(metrics["rollout_s"].mean()), "settings": settings}
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
    """:func:`distill.diagnose.diagnose` (aligned vs persistent) on records sampled by the persistent arm's
    final student of the first seed (the model that sampled them, as diagnose requires)."""
    from agents.llm.models import load_pretrained
    from agents.llm.training import latest_checkpoint
    from distill.diagnose import diagnose

    path = Path(cfg.out) / "diagnostics.csv"
    if path.exists():
        return pd.read_csv(path)
    ckpt = latest_checkpoint(Path(cfg.out) / "arms" / "opd_persistent" / "seed0")
    if ckpt is None:
        return None
    lm, tok = load_pretrained(ckpt)
    records = _sample_records(lm, tok, cfg, cfg.diagnose_episodes)
    table = diagnose(records, lm, tok, clip=0.2, methods=("aligned", "persistent"))
    write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))
    return table


# ---------------------------------------------------------------------- report
RESULT_COLUMNS = ["arm", "label", "seeds", "updates", "eval_episodes", "start_f1", "end_f1", "end_f1_std",
                  "gain_f1", "gain_f1_se", "gain_f1_z", "gain_f1_seed_std", "start_em", "end_em", "end_em_std",
                  "gain_em", "gain_em_se", "gain_em_z", "gain_em_seed_std", "peak_context_tokens",
                  "peak_scored_tokens", "actor_s_padded", "actor_s_packed", "update_s", "train_cpu_min"]


def results_table(cfg: ExperimentConfig, start: pd.DataFrame, ends: dict[str, list[pd.DataFrame]],
                  runs: dict[str, list[dict]], timing: pd.DataFrame) -> pd.DataFrame:
    """One row per arm (columns :data:`RESULT_COLUMNS`)."""
    rows = []
    for arm, arm_ends in ends.items():
        fields = ARMS[arm][1]
        reconstruction = fields["reconstruction"] if fields else "aligned"
        t = timing[timing.reconstruction == reconstruction].set_index(["packing", "backend"])
        rows.append({"arm": arm, "label": ARMS[arm][0], "seeds": len(arm_ends), "updates": cfg.updates,
                     "eval_episodes": len(start), **arm_summary(start, arm_ends),
                     "peak_context_tokens": float(np.mean([e.peak_context_tokens.max() for e in arm_ends])),
                     "peak_scored_tokens": int(t["peak_scored_tokens"].iloc[0]),
                     "actor_s_padded": float(t.loc[("padded", "auto"), "actor_cpu_s"]),
                     "actor_s_packed": (float(t.loc[("shared_prefix", cfg.attention_backend), "actor_cpu_s"])
                                        if fields else math.nan),
                     "update_s": float(np.mean([r["update_s"] for r in runs[arm]])),
                     "train_cpu_min": float(np.mean([r["train_cpu_seconds"] for r in runs[arm]]) / 60)})
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def targets(table: pd.DataFrame, ends: dict[str, list[pd.DataFrame]], teacher: dict | None = None,
            student: dict | None = None) -> list[dict[str, Any]]:
    """The set-up conditions and the paper's three targets, measured (``met`` a bool, ``value`` the figure).
    A gain counts only when it exceeds 3 standard errors; a ratio to a gain that is not positive is undefined."""
    by = table.set_index("arm")
    out = []
    if teacher is not None:
        out.append({"target": "teacher held-out F1 >= 0.6", "value": teacher["f1"], "met": teacher["f1"] >= 0.6,
                    "detail": f"± {teacher['f1_se']:.3f}"})
    if student is not None:
        out.append({"target": "student start F1 <= 0.3", "value": student["f1"], "met": student["f1"] <= 0.3,
                    "detail": f"± {student['f1_se']:.3f}"})
    if {"memopd", "opd_persistent"} <= set(by.index):
        ratio = by.loc["memopd", "end_f1"] / max(1e-9, by.loc["opd_persistent", "end_f1"])
        diff = compare_arms(ends["memopd"], ends["opd_persistent"])
        out.append({"target": "aligned F1 >= 1.07x persistent F1", "value": ratio, "met": bool(ratio >= 1.07),
                    "detail": f"end F1 difference {diff['mean']:+.3f} ± {diff['se']:.3f} (paired SE, z {diff['z']:.1f})"})
    if {"memopd", "rl"} <= set(by.index):
        g_m, g_r = by.loc["memopd", "gain_f1"], by.loc["rl", "gain_f1"]
        significant = bool(by.loc["memopd", "gain_f1_z"] > 3)
        ratio = g_m / g_r if g_r > 0 else math.nan
        out.append({"target": "MemOPD gain >= 2x RL-alone gain", "value": ratio,
                    "met": significant and (g_r <= 0 or ratio >= 2),
                    "detail": f"gains {g_m:+.3f} ± {by.loc['memopd', 'gain_f1_se']:.3f} vs {g_r:+.3f} ± "
                              f"{by.loc['rl', 'gain_f1_se']:.3f}" + ("" if g_r > 0 else "; RL-alone gain not positive: "
                                                                    "ratio undefined")
                              + ("" if significant else "; MemOPD gain not > 3 SE")})
    for arm, row in by.iterrows():
        if row["gain_f1"] > 0:
            out.append({"target": f"{arm}: gain > 3 SE", "value": row["gain_f1_z"], "met": bool(row["gain_f1_z"] > 3),
                        "detail": f"{row['gain_f1']:+.3f} ± {row['gain_f1_se']:.3f}"})
    return out


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A pipe table of ``frame`` (floats formatted with ``floatfmt``); no tabulate dependency."""
    def cell(v: Any) -> str:
        return format(v, floatfmt) if isinstance(v, (float, np.floating)) else str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def format_markdown(cfg: ExperimentConfig, table: pd.DataFrame, teacher: dict, student: dict, timing: pd.DataFrame,
                    diagnostics: pd.DataFrame | None, host: str, goals: list[dict]) -> str:
    """results.md: setup, the arm table, timing, diagnostics and the targets."""
    lines = [f"# MemOPD experiment ({ENV_ID} {cfg.env_kwargs})", "", host, "",
             f"teacher: d={teacher['hidden']} x {teacher['layers']} layers ({teacher['parameters']:,} parameters), "
             f"{teacher['steps']} SFT steps, held-out F1 {teacher['f1']:.3f} ± {teacher['f1_se']:.3f}, "
             f"EM {teacher['em']:.3f}",
             f"student start: d={student['hidden']} x {student['layers']} layers ({student['parameters']:,} "
             f"parameters, teacher's tokenizer), {student['steps']} SFT steps, held-out F1 {student['f1']:.3f} ± "
             f"{student['f1_se']:.3f}, EM {student['em']:.3f}",
             f"arms: {cfg.updates} GRPO updates x {cfg.tasks_per_update * cfg.group_size} episodes "
             f"({cfg.tasks_per_update} tasks x {cfg.group_size}), lr {cfg.lr}, KL {cfg.kl_coef}, temperature "
             f"{cfg.temperature}, lambda {cfg.distill_coef}; {int(table.seeds.max())} training seeds; held-out: "
             f"{int(table.eval_episodes.max())} episodes (greedy), the same seeds at start and end", "",
             "| arm | F1 start | F1 end (mean ± std over seeds) | F1 gain ± SE (paired) | z | EM end | EM gain ± SE | "
             "peak context | peak scored seq | actor s padded / packed | s/update | CPU-min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table.itertuples():
        packed = "—" if math.isnan(r.actor_s_packed) else f"{r.actor_s_packed:.2f}"
        lines.append(f"| {r.label} | {r.start_f1:.3f} | {r.end_f1:.3f} ± {r.end_f1_std:.3f} | {r.gain_f1:+.3f} ± "
                     f"{r.gain_f1_se:.3f} | {r.gain_f1_z:.1f} | {r.end_em:.3f} ± {r.end_em_std:.3f} | {r.gain_em:+.3f} ± "
                     f"{r.gain_em_se:.3f} | {r.peak_context_tokens:.0f} | {r.peak_scored_tokens} | "
                     f"{r.actor_s_padded:.2f} / {packed} | {r.update_s:.1f} | {r.train_cpu_min:.1f} |")
    lines += ["", "Actor forward+backward CPU seconds on one update's records (start student):", "",
              markdown_table(timing, ".3f")]
    if diagnostics is not None:
        lines += ["", "Misalignment of the persistent arm's final student (diagnose; |d log-prob| vs the sampled "
                      "log-probs; clip_share: tokens whose PPO ratio leaves [0.8, 1.2] before any update):", "",
                  markdown_table(diagnostics[["method", "max_abs_dlogp", "p99_abs_dlogp", "clip_share",
                                              "action_tokens", "tokens"]], ".4f")]
    lines += ["", "Targets:", ""] + [f"- {g['target']}: {g['value']:.2f} — {'met' if g['met'] else 'MISSED'} "
                                    f"({g['detail']})" for g in goals]
    return "\n".join(lines) + "\n"


def plot_curves(cfg: ExperimentConfig, path: Path) -> None:
    """Training-batch F1 per update (mean over seeds, band = ±1 std) and the distillation loss, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm in cfg.arms:
        color = f"C{list(ARMS).index(arm)}"  # one colour per arm in both panels
        frames = [pd.read_csv(p) for p in sorted((Path(cfg.out) / "arms" / arm).glob("seed*/metrics.csv"))]
        frames = [f[f["update"] > 0] for f in frames]
        if not frames:
            continue
        n = min(len(f) for f in frames)
        f1 = np.stack([f["f1"].to_numpy(float)[:n] for f in frames])
        x = frames[0]["update"].to_numpy()[:n]
        axes[0].plot(x, f1.mean(0), label=ARMS[arm][0], color=color)
        axes[0].fill_between(x, f1.mean(0) - f1.std(0), f1.mean(0) + f1.std(0), alpha=0.2, color=color)
        if "distill_loss" in frames[0]:
            dl = np.stack([f["distill_loss"].to_numpy(float)[:n] for f in frames])
            axes[1].plot(x, dl.mean(0), label=ARMS[arm][0], color=color)
    axes[0].set(xlabel="update", ylabel="training-batch F1 (sampled)", title="reward")
    axes[1].set(xlabel="update", ylabel="reverse KL to the teacher",
                title="on-policy distillation loss (each arm on its own reconstruction)")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
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


def run_experiment(cfg: ExperimentConfig) -> pd.DataFrame:
    """All stages (cached, resumable); returns the results table and writes the outputs under ``cfg.out``."""
    import torch

    from agents.llm.precision import host_line, resolve_autocast

    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    host = host_line(resolve_autocast("auto")) + " (SFT: autocast as shown; RL and distillation: fp32)"
    _log(cfg, host)
    write_text_atomic(out / "experiment.json", json.dumps(asdict(cfg), indent=2, default=list))
    teacher = build_teacher(cfg)
    _log(cfg, f"teacher: held-out F1 {teacher['f1']:.3f} (EM {teacher['em']:.3f})")
    student = build_student(cfg, teacher)
    _log(cfg, f"student start: held-out F1 {student['f1']:.3f} (EM {student['em']:.3f})")
    start = pd.read_csv(out / "student" / "start_eval.csv")
    timing = actor_timing(cfg, student)
    jobs = [(arm, s) for arm in cfg.arms for s in range(cfg.seeds)]
    results = _run_arms(cfg, jobs, student, teacher)
    runs = {arm: [results[(arm, s)] for s in range(cfg.seeds)] for arm in cfg.arms}
    ends = {arm: [pd.read_csv(out / "arms" / arm / f"seed{s}" / "end_eval.csv") for s in range(cfg.seeds)]
            for arm in cfg.arms}
    diagnostics = persistent_diagnostics(cfg) if "opd_persistent" in cfg.arms else None
    table = results_table(cfg, start, ends, runs, timing)
    goals = targets(table, ends, teacher, student)
    write_atomic(out / "results.csv", lambda tmp: table.to_csv(tmp, index=False))
    write_text_atomic(out / "results.md", format_markdown(cfg, table, teacher, student, timing, diagnostics, host,
                                                          goals))
    plot_curves(cfg, out / "learning_curves.png")
    return table


# ---------------------------------------------------------------------- CLI
def _run(args: argparse.Namespace) -> int:
    from memenv.cli import user_input

    overrides: dict[str, Any] = {k: getattr(args, k) for k in ("seeds", "updates", "eval_episodes", "threads",
                                                               "workers", "student_start_f1", "student_max_steps",
                                                               "lr",
                                                               "distill_coef")
                                 if getattr(args, k) is not None}
    overrides["progress"] = not args.quiet
    if args.arms:
        overrides["arms"] = tuple(args.arms)
    with user_input():
        cfg = quick_config(args.out, **overrides) if args.quick else ExperimentConfig(out=args.out, **overrides)
        if args.teacher_minutes is not None or args.teacher_clock is not None:
            cfg.teacher = replace(cfg.teacher, **({"sft_minutes": args.teacher_minutes}
                                                  if args.teacher_minutes is not None else {}),
                                  **({"sft_clock": args.teacher_clock} if args.teacher_clock else {}))
        if args.student_steps is not None:
            cfg.student = replace(cfg.student, sft_steps=args.student_steps)
        cfg.__post_init__()
    t0 = time.perf_counter()
    table = run_experiment(cfg)
    print((Path(cfg.out) / "results.md").read_text())
    print(f"wrote {Path(cfg.out) / 'results.csv'}, results.md, learning_curves.png "
          f"({(time.perf_counter() - t0) / 60:.1f} wall-min this call)")
    return 0 if len(table) else 1


def register_cli(subparsers) -> None:
    """Adds ``memenv experiment memopd`` (entry point ``memenv.commands``)."""
    p = subparsers.add_parser("experiment", help="reproducible experiments (memopd)", description=__doc__,
                              formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="experiment", metavar="{memopd}", required=True)
    m = sub.add_parser("memopd", help="teacher, weak student, 4 arms x seeds, paired held-out statistics",
                       description=__doc__, formatter_class=HelpFormatter)
    m.add_argument("--out", required=True, help="output folder (stages cached there; a rerun resumes)")
    m.add_argument("--quick", action="store_true", help="smoke run (<= 10 CPU-minutes): small models, few updates")
    m.add_argument("--seeds", type=positive_int, default=None, help="training seeds per arm (default 3; quick 2)")
    m.add_argument("--updates", type=positive_int, default=None, help="GRPO updates per arm (default 50; quick 3)")
    m.add_argument("--eval-episodes", dest="eval_episodes", type=positive_int, default=None,
                   help="held-out episodes, the same seeds at start and end (default 400; quick 100)")
    m.add_argument("--arms", nargs="+", choices=list(ARMS), default=None, help="default: all four")
    m.add_argument("--threads", type=positive_int, default=None, help="torch threads per process (default 1)")
    m.add_argument("--workers", type=positive_int, default=None,
                   help="arm runs in parallel processes (default: one per core)")
    m.add_argument("--teacher-minutes", dest="teacher_minutes", type=float, default=None,
                   help="teacher SFT budget in minutes (default 70; quick 3)")
    m.add_argument("--teacher-clock", dest="teacher_clock", choices=["cpu", "wall"], default=None,
                   help="clock of that budget (default cpu: process CPU time, all threads)")
    m.add_argument("--student-steps", dest="student_steps", type=positive_int, default=None,
                   help="student SFT steps per weak-start round (default 150; quick 30)")
    m.add_argument("--student-max-steps", dest="student_max_steps", type=positive_int, default=None,
                   help="at most this many student SFT steps in all (default 3000; quick 30)")
    m.add_argument("--student-start-f1", dest="student_start_f1", type=float, default=None,
                   help="probe F1 that ends the student's weak-start SFT rounds (default 0.15)")
    m.add_argument("--lr", type=float, default=None, help="learning rate of every arm (default 3e-4)")
    m.add_argument("--distill-coef", dest="distill_coef", type=float, default=None,
                   help="lambda of the distillation loss in the OPD arms (default 1.0)")
    m.add_argument("--quiet", action="store_true", help="no progress bars")
    m.set_defaults(func=_run)


__all__ = ["ExperimentConfig", "ModelSpec", "ARMS", "quick_config", "paired_stats", "arm_summary", "compare_arms",
           "run_experiment", "register_cli"]
