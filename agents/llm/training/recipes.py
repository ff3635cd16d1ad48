"""The tiny-model SFT recipe: the one source of the settings with which a tiny Qwen2 trained from scratch learns
MemQA-v0 (1 objective, 2 hops) by behaviour cloning of the oracle.

``memenv train --algo sft`` without ``--model`` starts from :data:`TINY_SFT_RECIPE` (any flag or ``--set`` still
overrides a field), and ``benchmarks/learn_memqa.py --stage sft`` (whose runs docs/llm_agents.md reports: F1 0.34 on
200 held-out episodes after 1,240 steps in 20 CPU-minutes, run A2) builds its config from the same dict, so the
command and the figures cannot drift apart. Why each setting (docs/llm_agents.md, "Learning evidence"):

- ``tiny_split_spaces="suffix"``: a word keeps its trailing space, so a name in a search result and the same name
  in an action are the same ids (the model learns to copy them) and prompts are 1.7x shorter than with isolated
  spaces; ``tiny_min_frequency=1`` under a vocabulary cap of 8192: every corpus word may become one token (85% of
  the world's numbers are single tokens).
- 8 attention heads of 16 dims (4 heads: 0.32 against 0.42 in the same budget).
- lr 3e-3 after 100 warm-up steps, then a cosine to 0.1x: over the time budget where ``max_seconds`` is set
  (``schedule_by="budget"``), else over the steps.
- a language-model loss on a random 30% of the observation tokens besides the action-token loss (pretraining on
  task text for a model with none).
- batches of 16 invocations cut from length-sorted pools of 8 batches; a bf16 autocast forward where the CPU computes
  bf16 fast (``autocast="auto"``: AMX; fp32 on AVX512-BF16 alone, where it measured faster); 3,000 oracle demonstrations.

The earlier defaults of the command (isolated spaces, 4 heads, vocabulary 4096 at min frequency 2, lr 1e-3 on a
step cosine, action tokens only) ended a 2,000-step run at held-out F1 0.008 (issue 51).

This module imports nothing heavy: the CLI reads it to print its help.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

#: ``agents.llm.training.sft.SFTConfig`` fields of the tiny-model recipe (the rest: the config's defaults or the run's
# own, : e.g. steps, budget, evaluation cadence, threads, output folder).
TINY_SFT_RECIPE: Mapping[str, Any] = MappingProxyType({
    # the tokenizer and the model, built from the env's oracle text
    "tiny_split_spaces": "suffix",
    "tiny_vocab": 8192,
    "tiny_min_frequency": 1,
    "tiny_hidden": 128,
    "tiny_layers": 4,
    "tiny_heads": 8,
    # the demonstrations and the batches
    "episodes": 3000,
    "batch_size": 16,
    "bucket": 8,
    "autocast": "auto",
    # the optimisation
    "lr": 3e-3,
    "warmup": 100,
    "schedule_by": "budget",
    "prompt_loss_weight": 1.0,
    "prompt_loss_fraction": 0.3,
})

#: The fields that make the tiny model and its tokenizer. ``memenv distill`` without ``--student`` builds its tiny
#: student with them, so that it shares the tokenizer of a teacher trained by ``memenv train --algo sft``.
TINY_MODEL_FIELDS: tuple[str, ...] = ("tiny_split_spaces", "tiny_vocab", "tiny_min_frequency", "tiny_hidden",
                                      "tiny_layers", "tiny_heads")

#: The env the recipe was measured on (the trainers' default env and kwargs).
TINY_SFT_ENV: tuple[str, Mapping[str, Any]] = ("MemQA-v0", MappingProxyType({"objectives": 1, "hops": 2}))


def tiny_sft_fields(**overrides: Any) -> dict[str, Any]:
    """The recipe's fields with ``overrides`` on top (SFTConfig keyword arguments)."""
    return {**TINY_SFT_RECIPE, **overrides}


def tiny_model_fields() -> dict[str, Any]:
    """The recipe's tokenizer and model fields (:data:`TINY_MODEL_FIELDS`), for any trainer's config."""
    return {name: TINY_SFT_RECIPE[name] for name in TINY_MODEL_FIELDS}


def tiny_sft_config(**overrides: Any):
    """An ``SFTConfig`` of the recipe, ``overrides`` on top (e.g. ``out_dir``, ``steps``, ``max_seconds``)."""
    from agents.llm.training.sft import SFTConfig

    return SFTConfig(**tiny_sft_fields(**overrides))


__all__ = ["TINY_MODEL_FIELDS", "TINY_SFT_ENV", "TINY_SFT_RECIPE", "tiny_model_fields", "tiny_sft_config",
           "tiny_sft_fields"]
