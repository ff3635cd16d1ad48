"""The LLM stack (``pip install -e '.[llm]'``): any transformers causal LM as a memenv policy, and its trainers.

Five sub-packages, each importing only those listed before it (``tests/test_layout.py`` checks it):

- :mod:`agents.llm.models`: tiny Qwen2/Llama models built from a config with a tokenizer trained on task text,
  ``save_pretrained`` / ``load_pretrained`` from local paths (nothing is downloaded), the registered real
  checkpoints, prompts and precision.
- :mod:`agents.llm.generation`: :class:`LLMPolicy`, batched token-exact sampling (prompt ids, sampled ids,
  log-probs), and the decoding it runs on.
- :mod:`agents.llm.records`: the :class:`InvocationRecord` (docs/design.md) with JSONL save/load, rollouts
  (episodes over lists or vector envs, joined with the env snapshots into records), transcript views, exporters,
  the viewer and ``memenv records``.
- :mod:`agents.llm.training`: SFT (behaviour cloning of the oracle), PPO and GRPO, what the trainers share
  (actor-critic, batching, torchrun, checkpoints, metrics) and ``memenv train``.
- :mod:`agents.llm.adapters`: TRL, verl, OpenAI-compatible servers, a local vLLM, a checkpoint as a bench strategy.

The names below are importable from ``agents.llm`` itself. Submodules are imported on first use, so
``import agents.llm.records.invocation`` does not load transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMPolicy": "agents.llm.generation.policy",
    "InvocationRecord": "agents.llm.records.invocation",
    "load_records": "agents.llm.records.invocation",
    "save_records": "agents.llm.records.invocation",
    "rollout": "agents.llm.records.rollouts",
    "records_of": "agents.llm.records.rollouts",
    "load_pretrained": "agents.llm.models.local",
    "save_pretrained": "agents.llm.models.local",
    "make_tiny": "agents.llm.models.local",
    "SFTConfig": "agents.llm.training.sft",
    "train_sft": "agents.llm.training.sft",
    "PPOConfig": "agents.llm.training.ppo",
    "train_rl": "agents.llm.training.ppo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agents.llm' has no attribute {name!r}")
