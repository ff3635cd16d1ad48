"""What the SFT and PPO/GRPO trainers share: the actor(-critic) module, batching of invocations, distributed
set-up (``torchrun``), atomic checkpoints with resume, ``metrics.csv`` and the learning-curve PNG.

Batching: one invocation per sequence (already memory-aligned, see docs/design.md), right-padded; the model sees
``prompt_ids + response_ids`` at positions ``0..n-1``; log-probs, entropies and values are computed only at
the response (action) positions: the logits of response token t come from the hidden state at position
``len(prompt) + t - 1``. Observation tokens never get loss.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import random
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from memenv.files import write_atomic
from agents.llm.models.local import (NonFiniteWeightsError, check_finite_weights, load_pretrained, make_tiny,
                                     save_pretrained)
from agents.llm.records.rollouts import rollout

# ---------------------------------------------------------------------- seeds
TOKENIZER_SEED_BASE = 10**6  # agents.llm.models.local.make_tiny builds the tokenizer from these seeds
EVAL_SEED_BASE = 10**7  # held-out evaluation episodes: seeds EVAL_SEED_BASE + i


# ---------------------------------------------------------------------- configs
@dataclass
class RunConfig:
    """Fields every trainer shares (see the CLI ``memenv train --help``)."""

    env_id: str = "MemQA-v0"
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"objectives": 1, "hops": 2})
    model: str | None = None  # local checkpoint path; None: build a tiny model (tiny_* fields)
    out_dir: str = "runs/train"
    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_episodes: int = 64
    save_every: int = 100
    keep_checkpoints: int = 2
    keep_every: int = 0  # checkpoints at multiples of this step are never pruned (0: none); e.g. learning-curve points
    resume: bool = False
    max_new_tokens: int = 96
    num_envs: int = 16
    threads: int | None = None
    progress: bool = True
    tiny_vocab: int = 4096
    tiny_hidden: int = 128
    tiny_layers: int = 4
    tiny_heads: int = 4
    tiny_arch: str = "qwen2"
    tiny_tokenizer_episodes: int = 200
    tiny_min_frequency: int = 2  # BPE merges need this many occurrences (1: every corpus word can become a token)
    tiny_split_spaces: bool | str = True  # True/'isolated', False/'prefix' (GPT-2) or 'suffix' (build_tokenizer)
    max_seconds: float | None = None  # stop (and checkpoint) once this budget is spent
    budget_clock: str = "wall"  # "wall" or "cpu" (process CPU time: fair on a shared machine)
    budget_counts_eval: bool = False  # held-out evaluations count on the clocks and the budget (default: they
    # are excluded and logged as eval_seconds / eval_cpu_seconds)
    dtype: str = "float32"  # weights: float32 | bfloat16 | float16 | auto (bf16 on a CUDA device that has it)
    attn_implementation: str = "sdpa"  # sdpa | eager | flex_attention | flash_attention_2 (CUDA, bf16/fp16)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# ---------------------------------------------------------------------- distributed
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def mean(self, values: dict[str, float]) -> dict[str, float]:
        """The mean over ranks of each value (identical on every rank)."""
        if not self.enabled or not values:
            return dict(values)
        keys = sorted(values)
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, keys)
        if any(g != keys for g in gathered):  # else the all-reduce below mixes values (or aborts)
            raise RuntimeError(f"Dist.mean: the ranks report different metrics: {gathered}")
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return {k: float(v) / self.world for k, v in zip(keys, t.tolist())}

    def sum(self, values: Sequence[float]) -> list[float]:
        if not self.enabled:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return t.tolist()


def init_distributed() -> Dist:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1): init the process group (gloo on CPU, nccl on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local_rank, device)


def unwrap_ddp(module):
    """The model inside a :class:`torch.nn.parallel.DistributedDataParallel` wrapper (``module`` itself when not
    wrapped): what a trainer reads the LM head or the memory credit from."""
    return module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module


def enable_activation_checkpointing(lm) -> None:
    """Recompute ``lm``'s decoder activations in the backward instead of keeping them (transformers >= 5 names
    it activation checkpointing, earlier versions gradient checkpointing): the body's memory becomes its layer
    inputs, for ~1/3 more compute. Non-reentrant, so parameters of a frozen part need no ``requires_grad`` input."""
    enable = getattr(lm, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------- model wrapper
class ActorCritic(nn.Module):
    """A causal LM plus an optional scalar value head, evaluated at action positions only.

    ``forward`` takes a :class:`Batch` and returns log-probs (temperature-scaled, fp32), entropies and
    values of the action tokens, flattened in batch order. Wrapping this module in DDP synchronises the
    gradients of both the LM and the value head.
    """

    def __init__(self, lm: nn.Module, value_head: bool = False, detach_value: bool = False,
                 autocast: str = "none") -> None:
        super().__init__()
        self.lm = lm
        self.detach_value = detach_value
        # "bf16": the forwards run under bf16 autocast: the matrix products (the body's and the LM head's) in bf16,
        # softmaxes, log-probs and losses in fp32 (autocast's fp32 ops; the residual stream stays fp32). "none": fp32.
        if autocast not in ("none", "bf16"):
            raise ValueError(f"autocast must be 'none' or 'bf16' (resolve 'auto' first), got {autocast!r}")
        self.autocast = autocast
        hidden = lm.config.hidden_size
        self.value_head = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.normal_(self.value_head.weight, std=1.0 / hidden)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, rows=None, cols=None, targets=None,
                temperature: float = 1.0, entropy: bool = False, return_hidden: bool = False, *, call=None,
                **call_kwargs):
        """``(logp, entropy, values)``, plus the ``[N, d]`` states that predict the action tokens when
        ``return_hidden`` (for extra loss terms on the same forward, e.g. distillation).

        ``call``: another forward, ``call(self, temperature=, entropy=, **call_kwargs)``, run as this module's
        forward, so that a DDP wrapper of this module sees it (gradients all-reduced): e.g.
        :mod:`distill.trainer`'s packed forward."""
        if call is not None:
            return call(self, temperature=temperature, entropy=entropy, **call_kwargs)
        with self.autocast_context():
            return self._forward(input_ids, attention_mask, position_ids, rows, cols, targets, temperature, entropy,
                                 return_hidden)

    def _forward(self, input_ids, attention_mask, position_ids, rows, cols, targets, temperature, entropy,
                 return_hidden):
        base = self.lm.base_model
        hidden = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      use_cache=False).last_hidden_state
        h = hidden[rows, cols]  # (N, H): states that predict each action token
        logits = self.lm.get_output_embeddings()(h).float() / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets[:, None])[:, 0]
        ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
        values = None
        if self.value_head is not None:
            hv = h.detach() if self.detach_value else h
            values = self.value_head(hv.to(self.value_head.weight.dtype))[:, 0]
        return (logp, ent, values, h) if return_hidden else (logp, ent, values)

    def autocast_context(self):
        """The autocast context the forwards run in (:attr:`autocast`): bf16 autocast, or no change."""
        if self.autocast == "none":
            return contextlib.nullcontext()
        device = next(self.lm.parameters()).device
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor  # (N,) batch row of each action token
    cols: torch.Tensor  # (N,) position of the hidden state predicting it
    targets: torch.Tensor  # (N,) the action token ids
    memory: torch.Tensor  # (N,) bool: inside <memory>
    seq_index: torch.Tensor  # (N,) index of the sequence in the list given to collate
    prompt: torch.Tensor  # (N,) bool: a prompt (observation) token, only with include_prompt=True

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))

    def select_targets(self, keep: torch.Tensor) -> "Batch":
        """The same rows with only the targets where ``keep`` (bool, one per target) is true."""
        per_target = ("rows", "cols", "targets", "memory", "seq_index", "prompt")
        return Batch(**{f.name: getattr(self, f.name)[keep] if f.name in per_target else getattr(self, f.name)
                        for f in fields(self)})

    def inputs(self, target_multiple: int = 1) -> dict[str, torch.Tensor]:
        """The forward's arguments. ``target_multiple`` > 1: the targets (``rows``/``cols``/``targets``) are padded
        with dummies (row 0, column 0, id 0) up to a multiple of it, so the LM head's matrix products see few
        distinct shapes; the forward's outputs then hold ``len(self.targets)`` real entries first (slice them)."""
        rows, cols, targets = self.rows, self.cols, self.targets
        extra = -len(targets) % target_multiple if target_multiple > 1 else 0
        if extra:
            rows, cols, targets = (torch.cat([t, t.new_zeros(extra)]) for t in (rows, cols, targets))
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids, "rows": rows, "cols": cols, "targets": targets}


def collate(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
            memory_masks: Sequence[Sequence[int]] | None = None, action_masks: Sequence[Sequence[int]] | None = None,
            device=None, include_prompt: bool = False, pad_multiple: int = 1, max_width: int | None = None) -> Batch:
    """Right-padded batch of ``(prompt_ids, response_ids)``; action tokens are the response tokens whose
    ``action_mask`` is 1 (all of them by default). ``include_prompt`` also lists the prompt tokens 1.. as
    targets, flagged in ``Batch.prompt`` (language-model pretraining on task text; never used by PPO/GRPO).
    ``pad_multiple``: the width is rounded up to a multiple of it (at most ``max_width``, never below the longest
    row): CPU bf16 kernels (oneDNN) cache a plan per input shape, and SFT's every-width batches grew RSS by GBs."""
    width = max(len(p) + len(r) for p, r in sequences)
    if pad_multiple > 1:
        rounded = -(-width // pad_multiple) * pad_multiple
        width = max(width, min(rounded, max_width)) if max_width is not None else rounded
    n = len(sequences)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    rows, cols, targets, memory, seq_index, is_prompt = [], [], [], [], [], []
    for i, (prompt, response) in enumerate(sequences):
        ids = list(prompt) + list(response)
        input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, :len(ids)] = 1
        if include_prompt:
            for t in range(1, len(prompt)):
                rows.append(i)
                cols.append(t - 1)
                targets.append(prompt[t])
                memory.append(False)
                seq_index.append(i)
                is_prompt.append(True)
        amask = action_masks[i] if action_masks is not None else [1] * len(response)
        mmask = memory_masks[i] if memory_masks is not None else [0] * len(response)
        for t, tok in enumerate(response):
            if amask[t]:
                rows.append(i)
                cols.append(len(prompt) + t - 1)
                targets.append(tok)
                memory.append(bool(mmask[t]))
                seq_index.append(i)
                is_prompt.append(False)
    positions = torch.arange(width, dtype=torch.long).expand(n, width).contiguous()
    batch = Batch(input_ids, attention, positions, torch.tensor(rows, dtype=torch.long),
                  torch.tensor(cols, dtype=torch.long), torch.tensor(targets, dtype=torch.long),
                  torch.tensor(memory, dtype=torch.bool), torch.tensor(seq_index, dtype=torch.long),
                  torch.tensor(is_prompt, dtype=torch.bool))
    return batch.to(device) if device is not None else batch


# ---------------------------------------------------------------------- checkpoints
LATEST = "latest"


class NonFiniteUpdateError(NonFiniteWeightsError):
    """A training step whose gradient is NaN or infinite: the step is not taken, the run stops."""


def check_finite_step(grad_norm, where: str) -> None:
    """Stop a trainer (:class:`NonFiniteUpdateError`) before ``optimizer.step()`` when the gradient norm of the
    step (after the losses' backward; every rank sees the same one under DDP) is NaN or infinite: the step would
    write NaN into every weight. Nothing of the step is written; the last checkpoint stays ``latest``."""
    value = float(grad_norm)
    if not math.isfinite(value):
        raise NonFiniteUpdateError(f"{where}: the gradient norm is {value} (a NaN or infinite loss or gradient): "
                                   "training stopped before this step; the last checkpoint stays latest")


OPTIMIZER_FILE = "optimizer.pt"  # a checkpoint's optimizer state, beside trainer_state.pt (what --resume needs)


def save_checkpoint(out_dir: str | os.PathLike, step: int, lm, tokenizer, state: dict[str, Any],
                    value_head: nn.Module | None = None, keep: int = 2, keep_every: int = 0,
                    extra_files: dict[str, Any] | None = None, keep_optimizer: int = 1) -> Path:
    """``out_dir/checkpoint-STEP``: the LM and tokenizer (``save_pretrained``), ``trainer_state.pt`` (step, RNG,
    config, ...), ``optimizer.pt`` (``state["optimizer"]``) and ``value_head.pt``; written into a temporary folder,
    renamed, then ``out_dir/latest`` (one line: the folder name) is replaced atomically. Older ones beyond ``keep``
    are removed, except those whose step is a multiple of ``keep_every`` (when > 0); of those kept, only this one
    (the latest) and the ``keep_optimizer - 1`` newest others keep ``optimizer.pt`` (0: all): a resume reads the
    latest, and Adam's state is twice the weights (SmolLM2: 1.08 GB beside 0.54 GB), so an older checkpoint keeps
    what ``from_pretrained`` and the bench read. ``extra_files``: more files written into the folder (name -> callable(path), e.g. a run's
    adapters). Weights holding a NaN or an infinity are refused before anything is written
    (:class:`agents.llm.models.local.NonFiniteWeightsError`)."""
    out_dir = Path(out_dir)
    # Before anything is written: a checkpoint with NaN or infinite weights never exists, nor becomes latest.
    check_finite_weights(out_dir / f"checkpoint-{step:07d}", lm, value_head)
    rest = {k: v for k, v in state.items() if k != "optimizer"}
    extra = {**(extra_files or {}), "trainer_state.pt": lambda p: torch.save(rest, p)}
    if "optimizer" in state:
        extra[OPTIMIZER_FILE] = lambda p: torch.save(state["optimizer"], p)
    if value_head is not None:
        extra["value_head.pt"] = lambda p: torch.save(value_head.state_dict(), p)
    path = save_pretrained(lm, tokenizer, out_dir / f"checkpoint-{step:07d}", extra_files=extra)
    write_atomic(out_dir / LATEST, lambda tmp: Path(tmp).write_text(path.name + "\n"))
    def kept_for_good(p: Path) -> bool:
        step = _checkpoint_step(p)
        return keep_every > 0 and step is not None and step % keep_every == 0

    old = sorted(p for p in out_dir.glob("checkpoint-*") if p.is_dir() and p.name != path.name and not kept_for_good(p))
    for p in old[:max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    if keep_optimizer > 0:  # the one just written (latest) always keeps it, then the newest others
        others = sorted((p for p in out_dir.glob("checkpoint-*")
                         if p.is_dir() and p.name != path.name and _checkpoint_step(p) is not None), key=_checkpoint_step)
        for p in others[:max(0, len(others) - (keep_optimizer - 1))]:
            (p / OPTIMIZER_FILE).unlink(missing_ok=True)
    return path


def _checkpoint_step(path: Path) -> int | None:
    tail = path.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def checkpoints(out_dir: str | os.PathLike) -> dict[int, Path]:
    """Every complete ``checkpoint-STEP`` folder of a run, by step."""
    found = {}
    for p in Path(out_dir).glob("checkpoint-*"):
        step = _checkpoint_step(p)
        if step is not None and (p / "trainer_state.pt").exists():
            found[step] = p
    return found


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    out_dir = Path(out_dir)
    pointer = out_dir / LATEST
    if pointer.exists():
        path = out_dir / pointer.read_text().strip()
        if (path / "trainer_state.pt").exists():
            return path
    found = checkpoints(out_dir)
    return found[max(found)] if found else None


def load_trainer_state(path: str | os.PathLike, optimizer: bool = False) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.pt``, with its optimizer state under ``"optimizer"`` (``optimizer.pt``, or
    inside ``trainer_state.pt`` in checkpoints written before it had its own file). ``optimizer=True``: a checkpoint
    without one (an older checkpoint, whose optimizer state :func:`save_checkpoint` dropped) raises a
    ``ValueError`` naming it."""
    path = Path(path)
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    if "optimizer" not in state and (path / OPTIMIZER_FILE).exists():
        state["optimizer"] = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=False)
    if optimizer and "optimizer" not in state:
        raise ValueError(f"{path}: holds no optimizer state ({OPTIMIZER_FILE}; only the newest checkpoint keeps "
                         "it), so training cannot resume from it: resume from the run's latest checkpoint")
    return state


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


# ---------------------------------------------------------------------- metrics
class MetricsLog:
    """``metrics.csv`` (rewritten atomically on each append: columns may grow) and a learning-curve PNG."""

    def __init__(self, out_dir: str | os.PathLike, enabled: bool = True, resume: bool = False) -> None:
        self.path = Path(out_dir) / "metrics.csv"
        self.enabled = enabled
        self.rows: list[dict[str, Any]] = []
        if resume and self.path.exists():
            with open(self.path, newline="") as fh:
                self.rows = [{k: _num(v) for k, v in row.items()} for row in csv.DictReader(fh)]

    def truncate(self, key: str, below: float) -> None:
        """Drop rows logged after the checkpoint we resume from (they will be redone)."""
        self.rows = [r for r in self.rows if float(r.get(key, 0) or 0) <= below]

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(dict(row))
        if not self.enabled:
            return
        columns = list(dict.fromkeys(k for r in self.rows for k in r))

        def write(tmp: str) -> None:
            with open(tmp, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=columns)
                writer.writeheader()
                for r in self.rows:
                    writer.writerow({k: r.get(k, "") for k in columns})

        write_atomic(self.path, write)

    def plot(self, x: str, ys: Sequence[str], title: str, path: str | os.PathLike | None = None) -> Path | None:
        if not self.enabled:
            return None
        return plot_curves(self.rows, x, ys, title, Path(path) if path else self.path.with_name("learning_curve.png"))


def plot_curves(rows: Sequence[dict[str, Any]], x: str, ys: Sequence[str], title: str, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = [y for y in ys if any(_is_num(r.get(y)) for r in rows)]
    if not ys:
        return None
    fig, axes = plt.subplots(1, len(ys), figsize=(4.2 * len(ys), 3.4), squeeze=False)
    for ax, y in zip(axes[0], ys):
        pts = [(float(r[x]), float(r[y])) for r in rows if _is_num(r.get(y)) and _is_num(r.get(x))]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30 else None, ms=3)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return path


def _is_num(v: Any) -> bool:
    if v is None or v == "":
        return False
    try:
        return np.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _num(v: str) -> Any:
    try:
        f = float(v)
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f
    except (TypeError, ValueError):
        return v


# ---------------------------------------------------------------------- model/env setup
def make_envs(cfg: RunConfig, n: int | None = None):
    import gymnasium as gym

    import memenv  # noqa: F401

    return [gym.make(cfg.env_id, **cfg.env_kwargs) for _ in range(n or cfg.num_envs)]


def load_or_build_model(cfg: RunConfig, dist: Dist, path: str | os.PathLike | None = None):
    """``(lm, tokenizer)``: from ``path`` / ``cfg.model``, or a fresh tiny model whose tokenizer is trained on
    the env's oracle text (every rank builds the same one: seeded). Returned on ``dist.device`` in ``cfg.dtype``
    (:func:`agents.llm.models.precision.resolve_dtype`; default float32) with ``cfg.attn_implementation``."""

    from agents.llm.models.precision import check_attn_implementation, resolve_dtype

    source = path or cfg.model
    dtype = resolve_dtype(getattr(cfg, "dtype", None), dist.device, "dtype")
    impl = check_attn_implementation(getattr(cfg, "attn_implementation", "sdpa"), dtype, dist.device)
    if source:
        lm, tok = load_pretrained(source, dtype=dtype, device=dist.device, attn_implementation=impl)
    else:
        lm, tok = make_tiny(None, cfg.env_id, cfg.env_kwargs, episodes=cfg.tiny_tokenizer_episodes,
                            vocab_size=cfg.tiny_vocab, split_spaces=cfg.tiny_split_spaces,
                            min_frequency=cfg.tiny_min_frequency, seed=cfg.seed, arch=cfg.tiny_arch,
                            hidden_size=cfg.tiny_hidden, layers=cfg.tiny_layers, heads=cfg.tiny_heads)
        lm = lm.to(dtype)  # built in float32 (seeded), then cast: every rank holds the same weights
        if impl != "sdpa":
            lm.set_attn_implementation(impl)
    return lm.to(dist.device), tok


def eval_seeds(n: int) -> list[int]:
    return [EVAL_SEED_BASE + i for i in range(n)]


def distributed_evaluate(policy, envs, n: int, dist: Dist, progress: bool = False) -> dict[str, float]:
    """Held-out evaluation (seeds :data:`EVAL_SEED_BASE` + i), sharded over ranks, averaged by episode;
    ``progress``: a bar (the main rank's episodes and invocations: an evaluation can take minutes)."""

    seeds = eval_seeds(n)[dist.rank::dist.world]
    episodes = rollout(policy, envs, seeds, progress=progress and dist.main, desc="eval") if seeds else []
    turns = sum(ep.turns for ep in episodes)
    sums = dist.sum([sum(ep.f1 for ep in episodes), sum(float(ep.info.get("em", 0.0)) for ep in episodes),
                     float(len(episodes)), float(turns),
                     float(sum(int(ep.info.get("invalid_actions", 0)) for ep in episodes))])
    count = max(1.0, sums[2])
    return {"eval_f1": sums[0] / count, "eval_em": sums[1] / count, "eval_turns": sums[3] / count,
            "eval_invalid_rate": sums[4] / max(1.0, sums[3])}


@contextmanager
def off_the_bar(bar):
    """Time spent inside (an evaluation, a checkpoint write) is left out of ``bar``'s rate and ETA: its start and
    last-print times move on by the pause, so an SFT or PPO bar's ETA counts training only instead of swinging
    after every evaluation (3 h -> 25 min). The evaluation's own bar shows the pause meanwhile."""
    clock = getattr(bar, "_time", None) if not getattr(bar, "disable", True) else None  # tqdm's own clock
    begin = clock() if clock is not None else 0.0
    try:
        yield
    finally:
        if clock is not None and hasattr(bar, "start_t"):
            pause = clock() - begin
            bar.start_t += pause
            bar.last_print_t += pause


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; False where there is none): an
    evaluation's generation allocates and frees many differently sized buffers, which glibc otherwise keeps."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def evaluate_off_budget(policy, envs, n: int, dist: Dist, timer: "Timer", counts: bool = False,
                        progress: bool = False) -> dict[str, float]:
    """:func:`distributed_evaluate` outside ``timer``'s clocks (unless ``counts``), plus the cumulative
    evaluation time so far as ``eval_seconds`` / ``eval_cpu_seconds``."""
    with timer.excluded(not counts):
        result = distributed_evaluate(policy, envs, n, dist, progress)
        release_free_memory()
    return {**result, "eval_seconds": round(timer.excluded_wall, 2), "eval_cpu_seconds": round(timer.excluded_cpu, 2)}


class Timer:
    """Wall seconds (``timer()``) and this process's CPU seconds (``timer.cpu()``, all threads) since start,
    less the time spent inside :meth:`excluded` blocks (held-out evaluations and drawing the learning curve:
    measuring a run should not eat its training budget, and evaluating more often should not make a run look slower). The excluded time is
    kept in ``excluded_wall`` / ``excluded_cpu``. ``wall_clock`` and ``cpu_clock`` are the clocks read (tests
    give their own, so that what they check does not depend on the machine's load)."""

    def __init__(self, elapsed: tuple[float, float] = (0.0, 0.0), *,
                 wall_clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.wall_clock, self.cpu_clock = wall_clock, cpu_clock
        self.start = wall_clock() - elapsed[0]  # a resumed run continues its clocks
        self.start_cpu = cpu_clock() - elapsed[1]
        self.excluded_wall = 0.0
        self.excluded_cpu = 0.0

    def __call__(self) -> float:
        return self.wall_clock() - self.start

    def cpu(self) -> float:
        return self.cpu_clock() - self.start_cpu

    @contextmanager
    def excluded(self, enabled: bool = True):
        """A block whose wall and CPU time do not count on this timer's clocks (``enabled=False``: they do)."""
        if not enabled:
            yield
            return
        wall, cpu = self.wall_clock(), self.cpu_clock()
        try:
            yield
        finally:
            dw, dc = self.wall_clock() - wall, self.cpu_clock() - cpu
            self.start += dw
            self.start_cpu += dc
            self.excluded_wall += dw
            self.excluded_cpu += dc

    def budget(self, clock: str) -> float:
        """Seconds on the clock a time budget is counted in: ``"wall"`` or ``"cpu"``."""
        if clock not in ("wall", "cpu"):
            raise ValueError(f"budget clock must be 'wall' or 'cpu', got {clock!r}")
        return self() if clock == "wall" else self.cpu()
