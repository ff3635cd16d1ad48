"""Agents for memenv, in two rooms.

- :mod:`agents.scripted`: memory strategies that need no model (oracle, keep-all, relevance, last-observation,
  history) for every env family, the rule-based readers they share, and the ``memenv bench`` runner.
- :mod:`agents.llm`: the LLM stack, by concern: models, generation (the token-exact
  :class:`~agents.llm.generation.policy.LLMPolicy`), records (invocation records, rollouts, the viewer), training
  (SFT, PPO/GRPO, ``memenv train``) and adapters to other stacks (needs the ``llm`` extra: torch, transformers).

Nothing else lives on this floor: a room never imports from the floor above it (the atomic-write helpers both
rooms use are :mod:`memenv.files`). ``from agents import make_strategy`` works without torch.
"""

from agents.scripted import STRATEGIES, ScriptedPolicy, make_strategy

__all__ = ["STRATEGIES", "ScriptedPolicy", "make_strategy"]


def __getattr__(name: str):
    # ``from agents import Agent`` meant for another distribution's top-level ``agents`` (openai-agents), which
    # this package hides: say so in one line instead of "cannot import name". (memenv's side checks the
    # other way round, another ``agents`` hiding this one: memenv.packages.)
    import dis
    import sys

    from memenv.packages import PackageClashError, shadowed_by_ours

    clash = shadowed_by_ours(__name__, name)
    if clash is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:  # an import statement keeps an ImportError's message (it replaces an AttributeError's with its own)
        frame = sys._getframe(1)
        importing = frame.f_code.co_code[frame.f_lasti] == dis.opmap["IMPORT_FROM"]
    except (AttributeError, IndexError, KeyError, ValueError):  # no frame to read: the safe kind
        importing = False
    if importing:
        raise PackageClashError(clash, name=__name__)
    raise AttributeError(clash)  # getattr, hasattr and pickle's lookups expect an AttributeError
