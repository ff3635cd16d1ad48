"""Memory-aligned on-policy distillation (MemOPD) and memory credit (MemPO, HiMPO); see docs/distill.md.

- :mod:`distill.reconstruct`: token sequences of invocation records, *aligned* (as sampled) or *persistent*
  (the episode flattened into one transcript: the misaligned control).
- :mod:`distill.packing`: the packing layouts (padded, sorted padded, padding-free, shared prefix, prefix tree)
  with explicit 4D masks; unpack.
- :mod:`distill.attention`: the attention back-ends of the packed forwards (sdpa, sdpa_blocks, varlen
  boundaries, torch_varlen, flex masks) and their registration with transformers.
- :mod:`distill.scoring`: action log-probs on a packing in chunks, the input checks, the RCE check.
- :mod:`distill.diagnose`: the runtime RCE table (``memenv distill diagnose``).
- :mod:`distill.teacher`: the frozen teacher, the vocabulary check, action hidden states on a layout.
- :mod:`distill.losses`: reverse/forward KL, generalized JSD(beta), top-k, chunked + checkpointed head application.
- :mod:`distill.credit`: MemPO / HiMPO memory advantages on memory tokens.
- :mod:`distill.trainer`: :class:`MemOPDConfig` and :func:`train_memopd` (PPO/GRPO + lambda x distillation).
- :mod:`distill.stats`: seed-level inference for training experiments.
- :mod:`distill.experiment`: ``memenv experiment memopd``, MemOPD's comparison in miniature.
- :mod:`distill.cli`: ``memenv distill``.

Submodules are imported on first use (``import distill`` loads no torch). Imports only go down the layers:
distill -> agents -> memenv -> tasks.
"""

from __future__ import annotations

import importlib
from typing import Any

#: What ``memenv distill diagnose`` compares (here, not in :mod:`distill.diagnose`, so that registering the
#: command loads no torch): the aligned reference, two packings of it, and the persistent-history control.
DIAGNOSE_METHODS = ("aligned", "padding_free", "shared_prefix", "persistent")
#: Attention implementations of the packed forwards (:func:`distill.attention.hidden_states`); here for the same
#: reason, so that configurations are checked without loading torch.
ATTENTION_BACKENDS = ("auto", "sdpa", "sdpa_blocks", "flex_attention", "flash_attention_2", "torch_varlen")


def check_attention_backend(value: str, name: str = "attention_backend") -> str:
    """``value`` if it names one of :data:`ATTENTION_BACKENDS`, else a ValueError naming ``name`` and the options."""
    if value not in ATTENTION_BACKENDS:
        raise ValueError(f"{name} must be one of {', '.join(ATTENTION_BACKENDS)}; got {value!r}")
    return value


_EXPORTS = {
    "MemOPDConfig": "distill.trainer",
    "train_memopd": "distill.trainer",
    "Teacher": "distill.teacher",
    "VocabularyMismatchError": "distill.teacher",
    "DistillLossConfig": "distill.losses",
    "CreditConfig": "distill.credit",
    "reconstruct": "distill.reconstruct",
    "pack": "distill.packing",
    "diagnose": "distill.diagnose",
}

__all__ = sorted([*_EXPORTS, "DIAGNOSE_METHODS", "ATTENTION_BACKENDS", "check_attention_backend"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'distill' has no attribute {name!r}")
