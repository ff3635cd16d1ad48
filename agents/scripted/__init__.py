"""Scripted memory strategies: policies without a model that act only through the text protocol, and the bench that
runs them. Two rooms, siblings, neither importing this floor:

- :mod:`agents.scripted.strategies`: the strategies, one module per env family (the registry and
  :func:`make_strategy` in :mod:`agents.scripted.strategies.qa_strategies`), and the rule-based reader of the
  synthetic world's language they share (:mod:`agents.scripted.strategies.world_reader`).
- :mod:`agents.scripted.bench`: ``memenv bench``, strategies x envs x episodes -> table, CSVs and plots.
"""

from agents.scripted.strategies import STRATEGIES, STRATEGY_FAMILIES, ScriptedPolicy, make_strategy

__all__ = ["STRATEGIES", "STRATEGY_FAMILIES", "ScriptedPolicy", "make_strategy"]
