"""Scripted memory strategies: policies without a model that act only through the text protocol.

- :mod:`agents.scripted.qa_strategies`: the strategy registry (:func:`make_strategy`) and the MemQA strategies.
- :mod:`agents.scripted.reading_strategies`: the same strategies for the reading envs (MemRead, MemDialog),
  with the dialogue reader.
- :mod:`agents.scripted.world_reader`: the rule-based reader of the synthetic world's language they share.
- :mod:`agents.scripted.bench`: ``memenv bench``, strategies x envs x episodes -> table, CSVs and plots.
"""

from agents.scripted.qa_strategies import STRATEGIES, STRATEGY_FAMILIES, ScriptedPolicy, make_strategy
from agents.scripted import reading_strategies  # noqa: F401 - registers the MemRead and MemDialog families
from agents.scripted import tool_strategies  # noqa: F401 - registers the MemDialog-BEAM (memory tools) family
from agents.scripted import qa_tool_strategies  # noqa: F401 - registers MemQA's memory-tools family
from agents.scripted import text_strategies  # noqa: F401 - registers the real-text dialog strategies

__all__ = ["STRATEGIES", "STRATEGY_FAMILIES", "ScriptedPolicy", "make_strategy"]
