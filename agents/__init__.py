"""Agents for memenv, in two rooms.

- :mod:`agents.scripted`: memory strategies that need no model (oracle, keep-all, relevance, last-observation,
  history) for every env family, the rule-based readers they share, and the ``memenv bench`` runner.
- :mod:`agents.llm`: the LLM stack: tiny models without a hub, the token-exact :class:`~agents.llm.policy.LLMPolicy`,
  invocation records, rollouts, SFT, PPO/GRPO and ``memenv train`` (needs the ``llm`` extra: torch, transformers).

:mod:`agents.files` holds the atomic-write helpers both rooms use. ``from agents import make_strategy`` works
without torch.
"""

from agents.scripted import STRATEGIES, ScriptedPolicy, make_strategy

__all__ = ["STRATEGIES", "ScriptedPolicy", "make_strategy"]
