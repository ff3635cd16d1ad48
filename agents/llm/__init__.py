"""The LLM stack (``pip install -e '.[llm]'``): any transformers causal LM as a memenv policy, and its trainers.

- :mod:`agents.llm.models`: tiny Qwen2/Llama models built from a config with a tokenizer trained on task text;
  ``save_pretrained`` / ``load_pretrained`` from local paths (nothing is downloaded).
- :mod:`agents.llm.policy`: :class:`LLMPolicy`, batched token-exact sampling (prompt ids, sampled ids, log-probs).
- :mod:`agents.llm.records`: the :class:`InvocationRecord` (docs/design.md), with JSONL save/load.
- :mod:`agents.llm.rollouts`: episodes over lists or vector envs, joined with the env snapshots into records.
- :mod:`agents.llm.training`: what the trainers share (actor-critic, batching, torchrun, checkpoints, metrics).
- :mod:`agents.llm.sft`, :mod:`agents.llm.ppo`: behaviour cloning of the oracle; PPO and GRPO.
- :mod:`agents.llm.cli`: ``memenv train``.

Submodules are imported on first use, so ``import agents.llm.records`` does not load transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLMPolicy": "agents.llm.policy",
    "InvocationRecord": "agents.llm.records",
    "load_records": "agents.llm.records",
    "save_records": "agents.llm.records",
    "rollout": "agents.llm.rollouts",
    "records_of": "agents.llm.rollouts",
    "load_pretrained": "agents.llm.models",
    "save_pretrained": "agents.llm.models",
    "make_tiny": "agents.llm.models",
    "SFTConfig": "agents.llm.sft",
    "train_sft": "agents.llm.sft",
    "PPOConfig": "agents.llm.ppo",
    "train_rl": "agents.llm.ppo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agents.llm' has no attribute {name!r}")
