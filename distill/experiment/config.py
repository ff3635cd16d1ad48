"""The experiment's configuration: :class:`ExperimentConfig` (every knob), :class:`ModelSpec` (a model and its SFT),
the arms (:data:`ARMS`), the presets (:func:`quick_config`, :func:`pretrained_config`), the question pools' env
kwargs (:func:`pool_env_kwargs`) and the check that refuses a rerun on an output folder made with other
settings (:func:`check_settings`). Torch-free."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from distill import check_attention_backend

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
    # The teacher-free control (issue 61): MemOPD's update with the distillation term replaced by a fixed negative
    # advantage on every sampled action token, its size the same seed's MemOPD run's mean distillation loss per token
    "constant": ("teacher-free control (constant negative advantage, MemOPD's size)",
                 {"reconstruction": "aligned", "credit": "none", "distill_signal": "constant"}),
    "memopd_himpo": ("MemOPD + HiMPO", {"reconstruction": "aligned", "teacher_reconstruction": "aligned",
                                        "credit": "himpo"}),
    # Equal-cost alternatives to on-policy distillation: SFT of the start student for the training CPU time of the
    # same seed's MemOPD run (ExperimentConfig.equal_cpu_arm), on the oracle's demonstrations of new train-pool
    # episodes, or on the teacher's own greedy episodes (sequence-level distillation, its sampling CPU included).
    "sft_continued": ("continued SFT on oracle demonstrations (equal CPU)", {"sft_data": "oracle"}),
    "seqkd": ("sequence-level distillation: SFT on the teacher's episodes (equal CPU)", {"sft_data": "teacher"}),
}
#: Arms trained by SFT rather than by GRPO (:data:`ARMS` fields ``sft_data``).
SFT_ARMS = tuple(a for a, (_, f) in ARMS.items() if f is not None and "sft_data" in f)
DEFAULT_ARMS = ("rl", "memopd", "teacher_persistent", "flattening")
#: Settings a rerun on a cached ``--out`` may change: how the run is executed, and which arms and seeds it adds.
RERUN_MAY_CHANGE = ("out", "progress", "workers", "threads", "sft_threads", "arms", "seeds", "smoke")
#: Settings only the stages after the weak start read (the arms, the actor timing, the diagnostics): a rerun may
#: also change these while none of those stages has run in the output folder (size the arms once the teacher and
#: the weak start are measured); once one has, they are guarded like the rest.
ARM_SETTINGS = ("updates", "tasks_per_update", "group_size", "lr", "kl_coef", "temperature", "distill_coef",
                "attention_backend", "teacher_packing", "teacher_dtype", "train_autocast", "curve_every",
                "curve_episodes", "timing_rounds", "diagnose_episodes", "warmup_updates", "rl_lr", "rl_lr_sweep",
                "sweep_seeds", "swept_arms", "lr_by_arm", "sweep_extend", "probe_curve", "equal_cpu_arm", "seqkd_sample_share", "lora_rank", "lora_alpha")


#: Settings of where the weak start stops a rerun may change while that stage has no result and no arm has run: a
#: start below the window's floor at the cap is extended by a rerun with more steps (its SFT resumes), and the
#: window may be set once the teacher is measured.
STUDENT_LENGTH_SETTINGS = ("student_max_steps", "student_probes", "student_start_f1", "student_start_ratio",
                           "student_start_floor_ratio")
#: Settings only the student's stage reads (and the arms after it): a run that links only another run's teacher
#: (``--teacher-from``) may change them.
STUDENT_SETTINGS = ("student", "student_plateau", "probe_episodes") + STUDENT_LENGTH_SETTINGS


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
    curve_every: int = 0  # > 0: greedy F1 of the SFT model every this many steps on curve_episodes evaluation
    # episodes (train-pool questions on evaluation seeds), off the budget clock: the SFT learning curve
    curve_episodes: int = 50
    warmup: int | None = None  # SFT learning-rate warm-up steps (None: a tenth of sft_steps, at most 100)
    # How each demonstration episode is rendered (agents.llm.training.sft.SFTConfig.views): ("memory",) the memory state
    # the student acts in; ("memory", "persistent") also the flattened transcript the teacher-persistent control
    # scores in, so that the control changes only the state the teacher scores in, not its familiarity with it.
    sft_views: tuple[str, ...] = ("memory",)
    # Env kwargs of the demonstrations only (SFTConfig.demo_env_overrides), e.g. {"hops": (1, 2)}: two-hop
    # questions whose bridge entity may be a held-out subject, so copying any name into a search is trained
    # while no held-out subject is ever asked about.
    sft_env: dict[str, Any] = field(default_factory=dict)
    # With a pretrained base: of the ``layers`` kept, how many are the base's last decoder layers, the rest its
    # first ones (agents.llm.models.pretrained.shrink's keep_last; 0: the first ``layers``, as before issue 47).
    keep_last: int = 0
    # > 0: this share of the demonstrations loses one fact from memory (SFTConfig.demo_forget_rate): the memory
    # view's expert searches again, the persistent view's answers from the transcript (issue 61: a teacher whose
    # two views point to different actions where the memory lost what the transcript holds)
    sft_forget_rate: float = 0.0
    # MemQA's demonstrator (SFTConfig.demo_expert): "oracle" (whole document lines in memory) or "compact" (short
    # answer notes that fit a memory budget; each view's own expert: agents.scripted.strategies.compact_oracle)
    sft_demo_expert: str = "oracle"

    def __post_init__(self) -> None:
        self.sft_views = tuple(self.sft_views)
        if isinstance(self.sft_env.get("hops"), list):  # a JSON round trip
            self.sft_env = {**self.sft_env, "hops": tuple(self.sft_env["hops"])}

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
    # first ``student.layers`` layers (:func:`agents.llm.models.pretrained.shrink`), both on its tokenizer and with the
    # system prompt its folder carries. ``hidden``, ``heads``, ``vocab`` and ``tokenizer_episodes`` then do not
    # apply. None: tiny Qwen2 models trained from scratch. See :func:`pretrained_config` for sizes that fit a CPU.
    model: str | None = None
    # With ``model``: the system prompt the teacher and student are made with (saved with their checkpoints, so
    # every later stage samples with it); None: the base folder's own.
    system_prompt: str | None = None
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
    # The SFT step counts at which the weak start is probed (ascending; those past student_max_steps are dropped);
    # None: every student.sft_steps steps. A pretrained base learns the task in a few steps, between two probes
    # of a fixed round (SmolLM2: F1 0.06 after 20 steps, 0.56 after 25), so its preset probes step by step there.
    student_probes: tuple[int, ...] | None = None
    # With it, the weak start's stop rule is a window (issue 47): stop at the first probe whose F1 is
    # > student_start_f1 (the floor: learning must be visible) and <= student_start_ratio x the teacher's held-out
    # F1 (the ceiling: a weak start); a probe above the ceiling stops too, flagged as overshot (the window fell
    # between two probes: probe more finely); the cap reached below the floor is an error, with no start written.
    # None: stop at the first probe >= student_start_f1, as every run before issue 47.
    student_start_ratio: float | None = None
    # With it too, the floor is at least this x the teacher's held-out F1 (issue 61 item 4: a start at 0.3-0.5 of
    # the teacher's, strong enough that what both views agree on does not drown where they differ).
    student_start_floor_ratio: float | None = None
    # Issue 61's user question ("after SFT, is MemOPD worth its CPU?"): with this set, the start is SFT'd to its
    # plateau instead: the rounds go on until a probe's F1 exceeds the best earlier probe's by less than this
    # (continued SFT no longer improves it), or student_max_steps; the floor and ratio rules do not apply.
    student_plateau: float | None = None
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
    # The OPD arms' teacher scoring: its packing and weights' dtype (None: the trainer's defaults, the actor's
    # packing and fp32, as every tiny-model run was made). The real-model preset scores on a prefix tree with
    # teacher_dtype="native": bf16 where the device computes it fast (CUDA, a CPU with AMX; bf16 moves SmolLM2's
    # teacher log-probs by p99 0.26 against fp32, benchmarks/arm_update_cost.py --teacher-check), fp32 elsewhere:
    # on the dev machine's AVX512-BF16 CPU without AMX fp32 scoring measured 1.47x cheaper (docs/distill_speed.md).
    teacher_packing: str | None = None
    teacher_dtype: str | None = None
    # Every arm's training passes (PPOConfig.train_autocast; None: the trainer's default, fp32): the real-model
    # preset runs the actor's and the reference's forwards under bf16 autocast where the host computes bf16 fast
    # ("auto": CUDA, AMX; fp32 on AVX512-BF16 alone, 1.44x cheaper there for the actor): body and head matmuls
    # bf16, softmaxes, log-probs and losses fp32, old log-probs recomputed by that forward; sampling stays fp32.
    train_autocast: str | None = None
    # Learning-rate warm-up of every GRPO-trained arm: the lr rises linearly over the first warmup_updates updates
    # (0: none, as every run before the fair-evidence preset; Adam's first steps then move every weight by ~lr).
    warmup_updates: int = 0
    # Every GRPO-trained arm's actor trains low-rank adapters of this rank instead of its weights (PPOConfig.lora_rank,
    # agents.llm.training.lora; 0: no adapters, the full weights, as every run so far), scaled by lora_alpha / lora_rank
    # (None: 2 * rank); the reference is then the base with the adapters off.
    lora_rank: int = 0
    lora_alpha: float | None = None
    # GRPO alone's learning rate: rl_lr when set; else the best of rl_lr_sweep (greedy F1 on train-pool probe
    # episodes after the full run, sweep_seeds seeds each, never the evaluation episodes) if non-empty; else lr.
    rl_lr: float | None = None
    rl_lr_sweep: tuple[float, ...] = ()
    sweep_seeds: int = 1
    # Issue 61: the arms whose learning rate the sweep chooses, each on its own runs over rl_lr_sweep (GRPO alone's
    # lands in rl_lr, the others' in lr_by_arm; an arm given there is not swept); ("rl",): every run before it. A
    # choice on the grid's edge extends that arm's grid by a factor 3 past the edge, up to sweep_extend times. The
    # teacher-free control sweeps after MemOPD, matched to MemOPD's sweep runs at MemOPD's chosen rate.
    swept_arms: tuple[str, ...] = ("rl",)
    lr_by_arm: dict[str, float] = field(default_factory=dict)
    sweep_extend: int = 0
    # The SFT arms (SFT_ARMS) train for the training CPU seconds of this arm's run of the same seed.
    equal_cpu_arm: str = "memopd"
    # seqkd: at most this share of that CPU samples the teacher's episodes; the rest trains on them.
    seqkd_sample_share: float = 0.5
    eval_episodes: int = 400  # held-out questions, the same episodes at the start and the end of every arm
    seen_eval_episodes: int = 200  # train-pool questions on evaluation seeds
    curve_every: int = 40  # held-out F1 every this many updates (the learning curve)
    curve_episodes: int = 200  # episodes of the curve's points (the first of the held-out episodes)
    # Each arm run also scores the train-pool probe episodes at every curve point (OUT/arms/ARM/seedS/probe_curve.csv):
    # what a pilot's training length is chosen from (distill.experiment.length), never the evaluation episodes.
    probe_curve: bool = False
    max_new_tokens: int = 64
    num_envs: int = 16
    threads: int = 1  # torch threads per process of the arms (see workers)
    sft_threads: int = field(default_factory=lambda: os.cpu_count() or 1)  # teacher and student SFT run alone
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # arm runs in parallel processes
    timing_rounds: int = 3
    diagnose_episodes: int = 16
    progress: bool = True
    # A smoke run of the pipeline (--quick): tiny budgets, figures near 0 expected; the report does not judge the
    # targets (they are not expected to be met) and the run prints what it is.
    smoke: bool = False

    def __post_init__(self) -> None:
        self.arms = tuple(self.arms)
        self.rl_lr_sweep = tuple(self.rl_lr_sweep)
        for value in self.rl_lr_sweep:
            _finite("rl_lr_sweep value", value, 0, strict_low=True)
        if self.rl_lr is not None:
            _finite("rl_lr", self.rl_lr, 0, strict_low=True)
        self.swept_arms = tuple(self.swept_arms)
        bad = [a for a in self.swept_arms if a not in ARMS or a in SFT_ARMS]
        if bad:
            raise ValueError(f"swept_arms must name GRPO-trained arms of {', '.join(a for a in ARMS if a not in SFT_ARMS)}"
                             f"; got {', '.join(map(repr, bad))}")
        if "constant" in self.swept_arms and "constant" not in self.lr_by_arm and "memopd" not in self.swept_arms:
            raise ValueError("swept_arms: the teacher-free control's sweep is matched to MemOPD's sweep runs: sweep "
                             "memopd too")
        if not isinstance(self.lr_by_arm, dict) or any(a not in ARMS for a in self.lr_by_arm):
            raise ValueError(f"lr_by_arm must map arms of ARMS to learning rates, got {self.lr_by_arm!r}")
        for arm, value in self.lr_by_arm.items():
            _finite(f"lr_by_arm[{arm!r}]", value, 0, strict_low=True)
        if isinstance(self.sweep_extend, bool) or not isinstance(self.sweep_extend, int) or self.sweep_extend < 0:
            raise ValueError(f"sweep_extend must be an integer >= 0, got {self.sweep_extend!r}")
        if self.student_start_ratio is not None:
            _finite("student_start_ratio", self.student_start_ratio, 0, 1, strict_low=True)
        if self.student_start_floor_ratio is not None:
            _finite("student_start_floor_ratio (needs student_start_ratio, and at most it)",
                    self.student_start_floor_ratio, 0, self.student_start_ratio or 0, strict_low=True)
        if self.student_plateau is not None:
            _finite("student_plateau", self.student_plateau, 0, 1, strict_low=True)
        _finite("seqkd_sample_share", self.seqkd_sample_share, 0.05, 0.95)
        if isinstance(self.warmup_updates, bool) or not isinstance(self.warmup_updates, int) or self.warmup_updates < 0:
            raise ValueError(f"warmup_updates must be an integer >= 0, got {self.warmup_updates!r}")
        if self.student_probes is not None:
            probes = tuple(self.student_probes)
            if not probes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in probes) or \
                    list(probes) != sorted(set(probes)):
                raise ValueError("student_probes must be None or strictly ascending integers >= 1, got "
                                 f"{self.student_probes!r}")
            self.student_probes = probes
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {list(ARMS)}, got {list(self.arms)}")
        for name in ("seeds", "updates", "tasks_per_update", "eval_episodes", "max_new_tokens", "threads", "workers",
                     "sft_threads", "probe_episodes", "student_max_steps", "seen_eval_episodes", "curve_every",
                     "curve_episodes", "num_envs", "vocab", "tokenizer_episodes", "timing_rounds",
                     "diagnose_episodes", "sweep_seeds"):
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
        if self.system_prompt is not None and (not isinstance(self.system_prompt, str) or self.model is None):
            raise ValueError("system_prompt must be a string, and applies to a pretrained base (model) only; got "
                             f"{self.system_prompt!r} with model {self.model!r}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"lora_rank must be an integer >= 0 (0: no adapters), got {self.lora_rank!r}")
        if self.lora_alpha is not None:
            _finite("lora_alpha", self.lora_alpha, 0, strict_low=True)
        if self.train_autocast not in (None, "auto", "none", "bf16"):
            raise ValueError(f"train_autocast must be None, 'auto', 'none' or 'bf16', got {self.train_autocast!r}")
        if any(a in SFT_ARMS for a in self.arms) and self.equal_cpu_arm not in self.arms:
            raise ValueError(f"the SFT arms ({', '.join(a for a in self.arms if a in SFT_ARMS)}) train for the CPU of "
                             f"equal_cpu_arm={self.equal_cpu_arm!r}, which must be among the arms {list(self.arms)}")
        if self.equal_cpu_arm in SFT_ARMS or self.equal_cpu_arm not in ARMS:
            raise ValueError(f"equal_cpu_arm must be a GRPO-trained arm of {[a for a in ARMS if a not in SFT_ARMS]}, "
                             f"got {self.equal_cpu_arm!r}")
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
            if isinstance(spec.keep_last, bool) or not isinstance(spec.keep_last, int) or spec.keep_last < 0 or \
                    (spec.keep_last and (not self.model or spec.keep_last > spec.layers)):
                raise ValueError(f"{role} keep_last must be an integer in 0..layers ({spec.layers}; > 0 only with a "
                                 f"pretrained base and layers > 0), got {spec.keep_last!r}")
            if isinstance(spec.sft_worlds, bool) or not isinstance(spec.sft_worlds, int) or spec.sft_worlds < 0:
                raise ValueError(f"{role} sft_worlds must be an integer >= 0, got {spec.sft_worlds!r}")
            if spec.warmup is not None and (isinstance(spec.warmup, bool) or not isinstance(spec.warmup, int)
                                            or spec.warmup < 0):
                raise ValueError(f"{role} warmup must be an integer >= 0 or None, got {spec.warmup!r}")
            if not spec.sft_views or any(v not in ("memory", "persistent") for v in spec.sft_views) or \
                    len(set(spec.sft_views)) != len(spec.sft_views):
                raise ValueError(f"{role} sft_views must name 'memory' and/or 'persistent' once each, "
                                 f"got {spec.sft_views!r}")
            _finite(f"{role} sft_forget_rate", spec.sft_forget_rate, 0, 1)
            if spec.sft_demo_expert not in ("oracle", "compact"):
                raise ValueError(f"{role} sft_demo_expert must be 'oracle' or 'compact', got {spec.sft_demo_expert!r}")
            if spec.sft_demo_expert == "compact" and spec.sft_forget_rate:
                raise ValueError(f"{role} sft_forget_rate applies to sft_demo_expert 'oracle' only, got "
                                 f"{spec.sft_forget_rate!r} with 'compact'")
            if not isinstance(spec.sft_env, dict):
                raise ValueError(f"{role} sft_env must be a dict of env kwargs, got {spec.sft_env!r}")


#: ``--quick``'s arms: every GRPO-trained one (the SFT arms' pipeline is covered by tests/test_fair_experiment.py).
QUICK_ARMS = tuple(a for a in ARMS if a not in SFT_ARMS)


def quick_config(out: str, **overrides: Any) -> ExperimentConfig:
    """The ``--quick`` smoke run (its cost: ``memenv.costs.COSTS["quick"]``; more CPU time when other jobs share the cores):
    small models, 2 seeds, 4 updates, every arm, 100 held-out episodes. Its teacher learns little in 3 minutes
    (F1 ~0): it checks the pipeline, not the claims."""
    base = dict(out=out, teacher=ModelSpec(hidden=64, layers=2, heads=4, sft_steps=150, sft_minutes=3.0,
                                           sft_episodes=300), student_max_steps=400, probe_episodes=16,
                # 400 steps: the student's actions are mostly valid (memory writes that credit can score)
                student=ModelSpec(hidden=32, layers=2, heads=2, sft_steps=200, sft_minutes=None, sft_episodes=300),
                vocab=2048, tokenizer_episodes=60, arms=QUICK_ARMS, seeds=2, updates=4, tasks_per_update=2,
                eval_episodes=100, seen_eval_episodes=50, curve_every=2, curve_episodes=50, timing_rounds=1,
                diagnose_episodes=8, smoke=True)
    return ExperimentConfig(**{**base, **overrides})


#: ``--world``: the task worlds of the experiment. ``fixed``: one world (world 0) for every episode, whose facts a
#: tiny model can learn by heart (the memorising-teacher case of docs/results.md). ``fresh``: every episode draws the
#: world's facts afresh over world 0's inventory of names and values (MemQA's ``fresh_facts``), so only reading
#: answers; 400 documents (a smaller inventory: fewer names for a tiny model's tokenizer and embeddings to learn).
WORLDS = {"fixed": {}, "fresh": {"fresh_facts": True, "corpus_size": 400}}
#: The fresh world's teacher: the same d=128 x 4 Qwen2 and 70 CPU-min, on 6,000 demonstrations (each its own fact
#: draw, so repeated epochs cannot teach facts) and a 4,096-token vocabulary (the 400-document inventory's names are
#: whole tokens well within it, and the output layer costs half of 8,192's); greedy F1 every 500 steps on 50
#: episodes, off the budget clock (the SFT learning curve).
FRESH_TEACHER = dict(sft_episodes=6000, curve_every=500)
FRESH_OVERRIDES = dict(vocab=4096)


def world_config(cfg: ExperimentConfig, world: str, *, quick: bool = False) -> ExperimentConfig:
    """``cfg`` on the task world ``world`` (:data:`WORLDS`); ``fresh`` also takes the fresh world's teacher data
    and vocabulary (:data:`FRESH_TEACHER`, :data:`FRESH_OVERRIDES`), except on a ``quick`` preset or a pretrained
    base (whose sizes stay theirs)."""
    if world not in WORLDS:
        raise ValueError(f"world must be one of {list(WORLDS)}, got {world!r}")
    cfg = replace(cfg, env_kwargs={**cfg.env_kwargs, **WORLDS[world]})
    if world == "fresh" and cfg.model is None and not quick:
        cfg = replace(cfg, teacher=replace(cfg.teacher, **FRESH_TEACHER), **FRESH_OVERRIDES)
    return cfg


#: The fair-evidence preset's arms: the matched pair (MemOPD, the teacher-persistent control whose teacher now knows
#: the flattened view too), GRPO alone with a tuned learning rate, the flattening trainer, and the two equal-CPU SFT
#: alternatives.
FAIR_ARMS = ("rl", "memopd", "teacher_persistent", "flattening", "sft_continued", "seqkd")
#: Its teacher: the fresh world's, trained on both views of every demonstration (one model scores both the aligned
#: and the persistent arm), with two-hop demonstrations mixed in (their bridge entity, read in a document and then
#: searched, may be any name of the inventory, held-out subjects included: copying a name no training question asks
#: about is trained without asking about it), for 100 CPU-min (twice the sequences per demonstration).
FAIR_TEACHER = dict(sft_minutes=100.0, sft_views=("memory", "persistent"), sft_env={"hops": (1, 2)})


def fair_config(out: str, **overrides: Any) -> ExperimentConfig:
    """``memenv experiment memopd --fair``: the fresh world with the fair-evidence settings. The teacher is at home
    in both views (:data:`FAIR_TEACHER`; its greedy F1 acting in each is measured before any arm runs); every
    GRPO-trained arm warms its learning rate up over 10 updates; GRPO alone's learning rate is the best of 1e-4,
    3e-4 and 1e-3 on train-pool probe episodes (2 sweep seeds each); the equal-CPU SFT arms run beside; 10 training
    seeds (the unit of inference)."""
    cfg = world_config(ExperimentConfig(out=out), "fresh")
    cfg = replace(cfg, teacher=replace(cfg.teacher, **FAIR_TEACHER), arms=FAIR_ARMS, seeds=10, warmup_updates=10,
                  rl_lr_sweep=(1e-4, 3e-4, 1e-3), sweep_seeds=2)
    return replace(cfg, **overrides)


#: Issue 61's regime: the fair world under a memory budget that binds (4 words, 3 objectives, a turn limit of 10:
#: the one setting whose between-view cosine reached <= 0.9 with the fair teacher, docs/results.md), a teacher
#: trained on both views of compact-notes demonstrations (agents.scripted.strategies.compact_oracle: notes that fit the
#: budget; the memory view's expert acts on its memory and the result in front of it, the transcript's reads the
#: transcript, so their targets differ where the budget cut what the transcript keeps), a stronger start (its
#: probe F1 in 0.3-0.5 of the teacher's held-out F1, so what both views agree on does not drown where they differ), the
#: teacher-free control beside the matched one, and the seeds of a power analysis (16 at least; docs/results.md
#: holds the pre-registration). Before 2026-12-07's budget table it was the turn limit alone with forgetful
#: oracle demonstrations (sft_forget_rate 0.5; results/memopd_powered_teacher): superseded, its views at 0.988.
POWERED_ENV = {"max_turns": 10, "memory_budget": 4, "objectives": 3}
POWERED_TEACHER = dict(FAIR_TEACHER, sft_demo_expert="compact")
POWERED_ARMS = ("rl", "memopd", "teacher_persistent", "constant")
POWERED_STUDENT_PROBES = (250, 500, 750, 1000, 1250, 1500, 2000, 2500, 3000, 4000, 5000, 6000)


def powered_config(out: str, **overrides: Any) -> ExperimentConfig:
    """``memenv experiment memopd --powered``: issue 61's regime (:data:`POWERED_ENV`, :data:`POWERED_TEACHER`,
    :data:`POWERED_ARMS`) on :func:`fair_config`'s design; 16 training seeds."""
    cfg = fair_config(out)
    cfg = replace(cfg, env_kwargs={**cfg.env_kwargs, **POWERED_ENV}, teacher=replace(cfg.teacher, **POWERED_TEACHER),
                  arms=POWERED_ARMS, seeds=16, student_start_f1=0.05, student_start_floor_ratio=0.3,
                  student_start_ratio=0.5, student_max_steps=6000,
                  student_probes=POWERED_STUDENT_PROBES, swept_arms=POWERED_ARMS, sweep_extend=2)
    return replace(cfg, **overrides)


#: Issue 61's second question, asked of its regime: from a start SFT'd to its plateau, is MemOPD worth its CPU
#: against continued SFT at equal CPU? (a probe gaining < 0.01 F1 on the best earlier one ends the SFT)
PLATEAU_ARMS = ("memopd", "sft_continued")


def plateau_config(out: str, **overrides: Any) -> ExperimentConfig:
    """``memenv experiment memopd --powered --plateau``: :func:`powered_config`'s regime and teacher (link it with
    ``--teacher-from``), its start SFT'd to the plateau (``student_plateau`` 0.01), MemOPD (its rate swept) against
    continued SFT on oracle demonstrations for the same CPU."""
    cfg = replace(powered_config(out), student_plateau=0.01, arms=PLATEAU_ARMS, swept_arms=("memopd",))
    return replace(cfg, **overrides)


#: ``--quick --model``: the pretrained pipeline on cuts of the base (4-layer teacher, 2-layer student), a few steps.
PRETRAINED_QUICK = dict(teacher=ModelSpec(layers=4, sft_steps=20, sft_minutes=None, sft_episodes=40, lr=1e-4),
                        student=ModelSpec(layers=2, sft_steps=10, sft_minutes=None, sft_episodes=40, lr=1e-4),
                        student_max_steps=10, probe_episodes=4, seeds=2, updates=2, eval_episodes=8,
                        seen_eval_episodes=4, curve_every=1, curve_episodes=4, diagnose_episodes=2, num_envs=4,
                        smoke=True)


#: The real-model preset's system prompt: the protocol in one line. The base folder's (a worked example, ~200 of
#: SmolLM2's tokens) teaches the format zero-shot; after SFT it only lengthens every invocation (~430 -> ~260
#: tokens), and an SFT step's cost, which pays every token of every invocation, with it.
SHORT_SYSTEM_PROMPT = ("You control a search engine with tags. Reply with one <memory> block, then one <search> or "
                       "<answer> block, nothing else.")


def pretrained_config(out: str, model: str = "smollm2-135m-instruct", **overrides: Any) -> ExperimentConfig:
    """The experiment on a pretrained base (``--model``), sized for a 2-core CPU in parts: the teacher is the whole
    model after SFT; the student is the same model after a *short* SFT, stopped at the first probe F1 >= 0.15 of
    those at steps 20-25, 30, 35 and 40 (``student_probes``: it learns the task between steps 20 and 25); learning
    rates for fine-tuning rather than training from scratch, and the three arms the claims need (GRPO alone,
    MemOPD, the matched teacher-persistent control) x 5 seeds x 4 updates of 2 tasks x 4, on 50 held-out episodes
    (the seed is the statistical unit).

    Why a same-size student: a cut of the base (its first 6 layers, ~50M parameters) did not learn the task in the
    SFT a CPU affords (probe F1 0.014 after 280 steps, ~70 CPU-min, docs/results.md), so GRPO would see no reward
    and every arm would stay at 0. The whole model learns it in tens of steps (greedy F1 0.0 at step 20, ~0.3 at
    25, ~0.85 at 50), so a student a few SFT steps in is a weak start (<= 0.4 of the teacher) that still reads and
    writes the protocol; the gap to the teacher is training, not capacity. An arm update then costs ~340 CPU-s at 1
    thread (the 30-layer actor's forward and backward ~200 of them), hence few updates at a fine-tuning learning
    rate of 3e-5 (the arm settings may still change before any arm has run: :data:`ARM_SETTINGS`).

    Actions may be 96 tokens: in SmolLM2's BPE the oracle's final action (a memory holding both facts, then both
    answers) reaches 85 tokens, and at the earlier 64-token cap 18% of the demonstrations' actions (about half of
    the final answers) were cut before their answer, which capped the teacher's F1 (docs/results.md). SFT warms up
    over 10 steps (a CPU budget buys ~60-140 of them) and checkpoints every 10 steps (a run stopped mid-way resumes
    from there); the teacher's greedy F1 is measured every 25 steps on 24 episodes (off the budget clock). The
    arms' training passes run under bf16 autocast where the host computes bf16 fast (``train_autocast="auto"``:
    CUDA, AMX; fp32 elsewhere; sampling fp32)."""
    base = dict(out=out, model=model, system_prompt=SHORT_SYSTEM_PROMPT,
                teacher=ModelSpec(layers=0, sft_steps=400, sft_minutes=90.0, sft_episodes=600, lr=2e-4, warmup=10,
                                  curve_every=25, curve_episodes=24),
                student=ModelSpec(layers=0, sft_steps=5, sft_minutes=None, sft_episodes=600, lr=2e-4, warmup=10),
                student_max_steps=40, student_probes=(20, 21, 22, 23, 24, 25, 30, 35, 40), probe_episodes=24,
                arms=("rl", "memopd", "teacher_persistent"), seeds=5,
                teacher_packing="prefix_tree", teacher_dtype="native", train_autocast="auto", max_new_tokens=96,
                updates=4, tasks_per_update=2, lr=3e-5, kl_coef=0.02, eval_episodes=50,
                seen_eval_episodes=16, curve_every=4, curve_episodes=16, num_envs=8, timing_rounds=1,
                diagnose_episodes=4,
                # One arm process at a time: a run of the 30-layer pair peaks at 10-13.4 GB resident; two fit a
                # 24 GB machine only with nothing else on it (1.4 GB left at worst in issue 33's run; --workers 2).
                workers=1)
    return ExperimentConfig(**{**base, **overrides})


#: The real-model fair preset's arms (issue 47): GRPO alone (lr swept), MemOPD, the fair teacher-persistent control
#: and continued SFT at MemOPD's CPU.
REAL_FAIR_ARMS = ("rl", "memopd", "teacher_persistent", "sft_continued")
#: Its student: 15 of the base's decoder layers (the issue's deepest cut), its first 5 and its last 10 (the
#: selection whose zero-shot action NLL is lowest of those measured; see :func:`real_fair_config`).
REAL_FAIR_STUDENT_LAYERS = 15
REAL_FAIR_KEEP_LAST = 10


def real_fair_config(out: str, model: str = "smollm2-135m-instruct", **overrides: Any) -> ExperimentConfig:
    """``memenv experiment memopd --fair --model smollm2-135m-instruct``: the fair-evidence design (issue 45) on a
    real pair where the student is genuinely smaller than the teacher (issue 47), on the fresh world.

    The teacher is the whole base (30 layers), SFT'd as the fair preset's teacher (:data:`FAIR_TEACHER`): every
    demonstration rendered in both views (the memory state and the flattened transcript the teacher-persistent
    control scores in) with two-hop demonstrations mixed in; its greedy F1 acting in each view is measured on the
    held-out questions before any arm runs. 180 CPU-min: at 90 (the budget in which the memory-only SmolLM2 teacher of
    issue 33 reached held-out 0.93-0.95, greedy F1 0.96-0.98 from step 75 of its ~140) this teacher made ~60 steps
    (two views and two-hop demonstrations cost ~75-95 CPU-s per step in fp32 against that teacher's 39 in bf16, and
    each view gets half the steps) and its greedy F1 was 0.375 at step 50 (24 train-pool episodes): twice the
    budget buys about the memory-view steps issue 33's teacher had at step 60-75. Its curve every 50 steps.
    The two-hop demonstrations' actions reach 168 of SmolLM2's tokens (10% of them over the 96-token cap; 150
    oracle episodes): SFT trains them whole, and they are training data only, as the task itself is single-hop
    (its actions <= 85 tokens), so the cap binds nowhere the teacher or the student acts.

    The student is 15 of the base's 30 layers (:data:`REAL_FAIR_STUDENT_LAYERS`: ~81M parameters against 134.5M,
    28.3M of both the tied embedding), the deepest cut the issue allows: its first 5 and its last 10
    (:data:`REAL_FAIR_KEEP_LAST`, :func:`agents.llm.models.pretrained.shrink`'s ``keep_last``). Why that deep: a 6-layer
    cut did not learn the task in the SFT a CPU affords (probe F1 0.014 after 280 steps, ~70 CPU-min;
    docs/results.md), and 15 layers keep half the body at ~0.55x the whole model's cost per update and per SFT step
    (:mod:`distill.experiment.estimate`; measured: a forward over 36 invocations 21.5 CPU-s against 39.2). Why
    those 15: every cut starts far from the base, but the last layers (whose output the final norm and head were
    trained on) bring it closer. Zero-shot action NLL on the oracle's actions (36 invocations of 12 train-pool
    episodes, memory view, the preset's prompt; the whole model 1.11 nats per token): first 15 layers 21.7, first
    14 + last 1 20.4, first 12 + last 3 13.8, first 10 + last 5 13.2, first 8 + last 7 9.4, **first 5 + last 10
    7.6**, first 2 + last 13 13.0, every other layer 14.5-16.4. The 6-layer cuts pointed the same way: after 30 SFT
    steps the first 3 + last 3 had a loss of 3.5 against the first 6's 4.8. How fast the chosen cut learns the task
    in SFT is not measured yet (``--until student`` measures it first; ``keep_last=0`` in the student's spec is
    the first-15 cut).

    Its weak start: SFT (the teacher's lr 2e-4, warm-up 10 steps, memory view) probed every 10 steps on 24
    train-pool episodes, stopped at the first probe in (0.05, 0.4 x the teacher's held-out F1]
    (``student_start_f1`` = 0.05, ``student_start_ratio`` = 0.4: learning visible, the start weak); up to 150
    steps (~55 CPU-min), after which a start still at <= 0.05 stops the run with a message (a rerun with a larger
    ``--student-max-steps`` resumes the SFT).

    The arms (:data:`REAL_FAIR_ARMS`): GRPO alone at the best of 1e-5, 3e-5 and 1e-4 (1 sweep seed each, on
    train-pool probes), MemOPD and the teacher-persistent control at 3e-5 (issue 33's fine-tuning rate), continued
    SFT on oracle demonstrations at MemOPD's CPU of the same seed; every GRPO-trained arm warms its lr up over 3
    updates; 12 updates; 5 training seeds; held-out F1 at the start, after update 6 (16 episodes) and at the end
    (50 held-out and 16 seen episodes); one arm process at a time (issue 33's pair of two 30-layer models peaked at
    10-13 GB per process).

    Its expected CPU time (:func:`distill.experiment.estimate.estimate_cpu`, printed before the run) is priced from
    issue 47's own run of this preset (``MEASURED["run"]``) and issue 62 item 3's speed-up: ~13.9 CPU-hours at 1 thread
    on the 2-core dev machine (~16.3 before item 3), the student's SFT priced to its 150-step cap, over the issue's
    ~10 (a weak student's greedy episodes cost about as much as its updates; docs/real_models.md). Before that run the estimate, from issue 33's figures, said ~8.2,
    and at 2 tasks x 4 episodes per update ~10.9 (now ~19.3): **the knob cut then is the tasks per update, 2 -> 1**
    (one GRPO group of 4 episodes per update; ``tasks_per_update=2`` restores it where CPU allows, e.g. on a GPU).
    Why that knob: it is the only one that cuts cost without dropping something the issue asks for (4 arms, 5
    seeds, >= 12 updates, a >= 3-value sweep, the both-view teacher, the curve); every arm loses the same half of
    its data per update (the SFT arm's CPU follows MemOPD's), so the comparisons stay paired and fair and only their
    power falls.
    Also kept small: one sweep seed per value (the tiny fair run: 2) and 50 held-out evaluation episodes (its 400);
    the sequence-level distillation and flattening arms are left out.

    Device-agnostic as :func:`pretrained_config` is: bf16 where the device computes it fast
    (``teacher_dtype="native"``, ``train_autocast="auto"``, SFT ``autocast="auto"``), fp32 sampling; ``threads``
    and ``sft_threads`` set torch's CPU threads only; the trainers take a CUDA device when there is one (the stages'
    greedy evaluations still load their models on the CPU, as every preset's do)."""
    cfg = world_config(pretrained_config(out, model), "fresh")
    teacher = replace(cfg.teacher, **{**FAIR_TEACHER, "sft_minutes": 180.0}, curve_every=50)
    student = replace(cfg.student, layers=REAL_FAIR_STUDENT_LAYERS, keep_last=REAL_FAIR_KEEP_LAST, sft_steps=10)
    cfg = replace(cfg, teacher=teacher, student=student, student_start_f1=0.05, student_start_ratio=0.4,
                  student_max_steps=150, student_probes=tuple(range(10, 151, 10)), arms=REAL_FAIR_ARMS, seeds=5,
                  updates=12, tasks_per_update=1, warmup_updates=3, rl_lr_sweep=(1e-5, 3e-5, 1e-4), sweep_seeds=1,
                  curve_every=6, smoke=False)
    return replace(cfg, **overrides)


def pool_env_kwargs(cfg: ExperimentConfig, pool: str = "train") -> dict[str, Any]:
    """The env kwargs of one question pool: ``train`` (demonstrations, probes, GRPO episodes, "seen"
    evaluation) or ``heldout`` (the headline evaluation)."""
    return {**cfg.env_kwargs, "question_split": pool, "heldout_fraction": cfg.heldout_fraction}


def _config_record(cfg: ExperimentConfig) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(cfg), default=list))


def check_settings(cfg: ExperimentConfig) -> None:
    """Refuse (:class:`SettingsMismatchError`, naming the settings) a rerun on an output folder whose
    ``experiment.json`` records other settings than ``cfg``, except those of :data:`RERUN_MAY_CHANGE` (and of
    :data:`ARM_SETTINGS` while no arm, timing or diagnostics exists there): its cached stages were made with
    them."""
    path = Path(cfg.out) / "experiment.json"
    if not path.exists() and not path.is_symlink():
        return
    try:  # an unreadable one is refused even without stages: the run would overwrite another run's record
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        detail = f"{type(err).__name__}: {getattr(err, 'strerror', None) or err}".splitlines()[0]
        raise SettingsMismatchError(f"{path} cannot be read as the settings of an earlier run ({detail}); not "
                                    "overwritten: move it away, or use another --out") from None
    if not isinstance(old, dict):
        raise SettingsMismatchError(f"{path} is not the settings of an earlier run (a JSON {type(old).__name__}, "
                                    "not an object); not overwritten: move it away, or use another --out")
    if not any((Path(cfg.out) / stage).exists() for stage in ("teacher", "student", "arms")):
        return  # no stage made with those settings (a run that failed first): nothing to protect
    later = any((Path(cfg.out) / name).exists() for name in ("arms", "timing.csv", "diagnostics.csv"))
    started = (Path(cfg.out) / "student" / "result.json").exists()
    free = RERUN_MAY_CHANGE + (() if later else ARM_SETTINGS) + (() if later or started else STUDENT_LENGTH_SETTINGS)
    changed = changed_settings(old, cfg, free)
    if changed:
        raise SettingsMismatchError(f"{cfg.out} holds a run with other settings: {changed}; use another "
                                    "--out (or the earlier settings) to keep its cached stages")


def changed_settings(old: dict[str, Any], cfg: ExperimentConfig, free: tuple[str, ...]) -> str:
    """The settings outside ``free`` in which ``cfg`` differs from a run's recorded ``experiment.json`` (``old``),
    as ``name old -> new`` items (the first six, then a count); empty where none does. A setting added after
    that run was made is read as its default (what that run did)."""
    new = _config_record(cfg)
    default = _config_record(replace(ExperimentConfig(), teacher=ModelSpec(), student=ModelSpec()))
    old = {**{k: v for k, v in default.items() if k not in ("teacher", "student")}, **old}
    for role in ("teacher", "student"):  # and inside the model specs
        if isinstance(old.get(role), dict):
            old[role] = {**default[role], **old[role]}
    changed = []
    for key in sorted(k for k in set(old) | set(new) if k not in free and old.get(k) != new.get(k)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):  # a model spec: the fields that differ, by name
            changed += [(f"{key}.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            changed.append((key, a, b))
    detail = ", ".join(f"{k} {json.dumps(a)} -> {json.dumps(b)}" for k, a, b in changed[:6])
    return detail + (f" (+{len(changed) - 6} more)" if len(changed) > 6 else "")


__all__ = ["ENV_ID", "ENV_KWARGS", "ARMS", "DEFAULT_ARMS", "RERUN_MAY_CHANGE", "ARM_SETTINGS", "STUDENT_LENGTH_SETTINGS",
           "STUDENT_SETTINGS",
           "SettingsMismatchError", "ModelSpec",
           "ExperimentConfig", "quick_config", "PRETRAINED_QUICK", "WORLDS", "world_config", "pretrained_config", "pool_env_kwargs",
           "check_settings", "changed_settings", "SHORT_SYSTEM_PROMPT", "SFT_ARMS", "FAIR_ARMS", "FAIR_TEACHER",
           "fair_config", "POWERED_ENV", "POWERED_TEACHER", "POWERED_ARMS", "POWERED_STUDENT_PROBES",
           "powered_config", "PLATEAU_ARMS", "plateau_config", "REAL_FAIR_ARMS", "REAL_FAIR_STUDENT_LAYERS", "REAL_FAIR_KEEP_LAST",
           "real_fair_config"]
