"""Low-rank adapters (LoRA) for the actor of the PPO/GRPO trainers (``PPOConfig.lora_rank > 0``; off by default).

The actor then trains ``W x + (alpha / r) B A x`` on its linear layers (``lora_targets``) instead of ``W``: peft's
LoRA layers are injected into the transformers model **in place** (:func:`add_adapters`), so the model keeps its
class, its body (``lm.base_model``), its head and every forward of the trainers; its base weights are frozen
(``requires_grad=False``), so the backward skips their weight gradients and the optimizer holds the adapters alone.
``B`` starts at zero: the adapted model starts as the base, bit for bit.

- **Reference** (``kl_coef > 0``): :class:`BaseReference`, the actor's own LM with its adapters off, i.e. the frozen
  base: exact, with no second copy of the model. The actor computes what the reference computes while every ``B``
  is zero (:func:`adapters_are_zero`: a fresh run until its first optimizer step), which is what
  ``PPOConfig.ref_logprobs_from_actor`` checks.
- **Checkpoints**: the model files are the **merged** model (:func:`merged_copy`: ``W + (alpha / r) B A``, plain
  linear layers), so a checkpoint loads with ``from_pretrained`` like any other; beside them, the adapters'
  weights (:data:`ADAPTER_FILE`) and their settings with a hash of the base's weights (:data:`ADAPTER_INFO`). A
  resume rebuilds the base (the run's starting model), adds the adapters, loads their weights (and the optimizer
  state, as always), and refuses a base whose hash differs.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agents.llm.training.common import ActorCritic

#: The linear layers adapted by default: attention's and the MLP's projections of Llama / Qwen2 / SmolLM2.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_FILE = "adapter_weights.pt"  # the adapters' parameters, by name (a checkpoint's extra file)
ADAPTER_INFO = "adapter_info.json"  # rank, alpha, targets and the base's weight hash


def check_lora_settings(rank: Any, alpha: Any, targets: Any) -> None:
    """Refuse bad adapter settings with a one-line :class:`ValueError` naming the field."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"lora_rank must be an integer >= 0 (0: no adapters), got {rank!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0
                              or alpha != alpha or alpha == float("inf")):
        raise ValueError(f"lora_alpha must be a number > 0 (None: 2 * lora_rank), got {alpha!r}")
    if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets \
            or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"lora_targets must be a non-empty list of module names, got {targets!r}")


def lora_alpha(rank: int, alpha: float | None) -> float:
    """The adapters' alpha (their update is scaled by ``alpha / rank``): ``alpha``, or ``2 * rank`` when None."""
    return float(alpha) if alpha is not None else 2.0 * rank


def _peft():
    try:
        import peft
    except ImportError:  # pragma: no cover - peft is in the llm extra
        raise ImportError("lora_rank > 0 needs the peft package: pip install 'memenv[llm]' (or pip install peft)") \
            from None
    return peft


def add_adapters(lm: nn.Module, rank: int, alpha: float | None = None,
                 targets: Sequence[str] = DEFAULT_TARGETS) -> nn.Module:
    """Inject LoRA adapters of ``rank`` into ``lm``'s linear layers named ``targets`` (the last part of their
    module names), in place; freeze every other parameter. Returns ``lm``. A name that matches no linear layer
    is refused (``lora_targets``), as is a model that already has adapters."""
    check_lora_settings(rank, alpha, list(targets))
    if rank == 0:
        raise ValueError("lora_rank must be > 0 to add adapters, got 0")
    if has_adapters(lm):
        raise ValueError("lora_rank: this model already has adapters")
    linear = {name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if isinstance(m, nn.Linear)}
    missing = [t for t in targets if t not in linear]
    if missing:
        raise ValueError(f"lora_targets: no linear layer named {', '.join(missing)} in this model "
                         f"(its linear layers: {', '.join(sorted(linear))})")
    peft = _peft()
    config = peft.LoraConfig(r=rank, lora_alpha=lora_alpha(rank, alpha), target_modules=list(targets),
                             lora_dropout=0.0, bias="none")
    peft.inject_adapter_in_model(config, lm)
    for name, p in lm.named_parameters():
        p.requires_grad_(_is_adapter(name))
    lm.memenv_lora = {"rank": rank, "alpha": lora_alpha(rank, alpha), "targets": list(targets)}
    return lm


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_layers(lm: nn.Module) -> list[nn.Module]:
    """The LoRA layers of ``lm`` (empty: no adapters)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return []
    return [m for m in lm.modules() if isinstance(m, LoraLayer)]


def has_adapters(lm: nn.Module) -> bool:
    return bool(getattr(lm, "memenv_lora", None)) or bool(adapter_layers(lm))


@contextlib.contextmanager
def adapters_disabled(lm: nn.Module):
    """Run ``lm`` as its base inside the block: every LoRA layer computes its base layer alone, bit for bit."""
    layers = [(layer, layer.disable_adapters) for layer in adapter_layers(lm)]
    for layer, _ in layers:
        layer.enable_adapters(False)
    try:
        yield lm
    finally:
        for layer, was_off in layers:  # as before the block (enabling gives the adapters their requires_grad back)
            layer.enable_adapters(not was_off)


def adapters_are_zero(lm: nn.Module) -> bool:
    """Whether every adapter adds exactly nothing (every ``B`` is zero): the adapted model then computes its base's
    forward (``y + 0 = y``)."""
    layers = adapter_layers(lm)
    return all(not torch.any(b.weight) for layer in layers for b in layer.lora_B.values())


def adapter_state_dict(lm: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' parameters by name (copies on the CPU)."""
    return {n: p.detach().cpu().clone() for n, p in lm.named_parameters() if _is_adapter(n)}


def load_adapter_state(lm: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state_dict`'s tensors into ``lm``'s adapters (every one of them, same shapes)."""
    own = {n: p for n, p in lm.named_parameters() if _is_adapter(n)}
    if set(own) != set(state):
        raise ValueError(f"lora: the checkpoint's adapters ({len(state)} tensors) are not this model's ({len(own)}): "
                         "another lora_rank or lora_targets?")
    with torch.no_grad():
        for n, p in own.items():
            if p.shape != state[n].shape:
                raise ValueError(f"lora: adapter {n} has shape {tuple(state[n].shape)} in the checkpoint, "
                                 f"{tuple(p.shape)} here: another lora_rank?")
            p.copy_(state[n].to(p.device, p.dtype))


def base_hash(lm: nn.Module) -> str:
    """A hash of the base's weights (every parameter but the adapters', under the names of the un-adapted
    model): a resume checks it finds the base its adapters were trained on."""
    h = hashlib.sha256()
    for name, p in sorted((n.replace(".base_layer.", "."), p) for n, p in lm.named_parameters() if not _is_adapter(n)):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def merged_copy(lm: nn.Module) -> nn.Module:
    """A copy of ``lm`` with every adapter merged into its base weight (``W + (alpha / r) B A``, peft's
    ``merge``) and the LoRA layers replaced by plain linear layers: the model ``from_pretrained`` reloads. ``lm``
    itself is unchanged."""
    merged = copy.deepcopy(lm)
    layers = set(adapter_layers(merged))
    head = merged.get_output_embeddings()
    if head in layers and head.get_base_layer().weight is merged.get_input_embeddings().weight:
        # an adapted head tied to the embeddings: merging into the shared tensor would move the embeddings too, so
        # the merged model gets a head of its own (saved untied; from_pretrained reloads it so)
        head.get_base_layer().weight = nn.Parameter(head.get_base_layer().weight.detach().clone())
        merged.config.tie_word_embeddings = False
        if getattr(merged.config, "get_text_config", None) is not None:
            merged.config.get_text_config().tie_word_embeddings = False
    for name, layer in [(n, m) for n, m in merged.named_modules() if m in layers]:
        layer.merge(safe_merge=True)
        parent_name, _, child = name.rpartition(".")
        setattr(merged.get_submodule(parent_name) if parent_name else merged, child, layer.get_base_layer())
    if hasattr(merged, "peft_config"):
        del merged.peft_config
    merged.__dict__.pop("memenv_lora", None)
    for p in merged.parameters():
        p.requires_grad_(True)
    return merged


def adapter_files(lm: nn.Module) -> dict[str, Any]:
    """A checkpoint's extra files for an adapted ``lm`` (:func:`agents.llm.training.common.save_checkpoint`'s
    ``extra_files``): the adapters' weights and their settings with the base's hash."""
    info = {**lm.memenv_lora, "base_hash": base_hash(lm)}
    return {ADAPTER_FILE: lambda p: torch.save(adapter_state_dict(lm), p),
            ADAPTER_INFO: lambda p: Path(p).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")}


def resume_adapters(lm: nn.Module, checkpoint: Path, rank: int, alpha: float | None, targets: Sequence[str]) -> None:
    """Add the adapters to the base ``lm`` and load their weights from ``checkpoint``; a checkpoint without
    adapters, with other settings, or trained on another base is refused (one line)."""
    info_path = Path(checkpoint) / ADAPTER_INFO
    if not info_path.exists():
        raise ValueError(f"lora_rank: {checkpoint} has no adapters ({ADAPTER_INFO} missing): it was not trained "
                         "with lora_rank > 0; resume it without adapters, or use another out_dir")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    want = {"rank": rank, "alpha": lora_alpha(rank, alpha), "targets": list(targets)}
    for key, field in (("rank", "lora_rank"), ("alpha", "lora_alpha"), ("targets", "lora_targets")):
        if info.get(key) != want[key]:
            raise ValueError(f"{field}: {checkpoint} was trained with {info.get(key)!r}, this run has {want[key]!r}")
    add_adapters(lm, rank, alpha, targets)
    if info.get("base_hash") != base_hash(lm):
        raise ValueError(f"lora: the base model (PPOConfig.model) is not the one {checkpoint}'s adapters were "
                         "trained on (its weights' hash differs)")
    load_adapter_state(lm, torch.load(Path(checkpoint) / ADAPTER_FILE, map_location="cpu"))


class BaseReference(ActorCritic):
    """The reference policy of an adapted actor: the actor's own LM with its adapters off (the frozen base, bit
    for bit; no second copy). Every forward of the trainers runs inside :meth:`autocast_context` (the default
    collate forward through :meth:`forward`, :mod:`distill.trainer`'s packed forward directly), so the adapters
    are off there; :meth:`forward` turns them off too, for a forward that skips the autocast context."""

    def __init__(self, lm: nn.Module, autocast: str = "none") -> None:
        super().__init__(lm, autocast=autocast)

    def forward(self, *args, **kwargs):
        with adapters_disabled(self.lm):
            return super().forward(*args, **kwargs)

    def autocast_context(self):
        stack = contextlib.ExitStack()
        stack.enter_context(adapters_disabled(self.lm))
        stack.enter_context(super().autocast_context())
        return stack


__all__ = ["DEFAULT_TARGETS", "ADAPTER_FILE", "ADAPTER_INFO", "check_lora_settings", "lora_alpha", "add_adapters",
           "adapter_layers", "has_adapters", "adapters_disabled", "adapters_are_zero", "adapter_state_dict",
           "load_adapter_state", "base_hash", "merged_copy", "adapter_files", "resume_adapters", "BaseReference"]
