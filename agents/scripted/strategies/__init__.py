"""The scripted memory strategies: policies that need no model and act only through the text protocol, one module
per env family, all reading the world with one shared reader so that scores differ by the memory strategy alone.

:mod:`agents.scripted.strategies.qa_strategies` holds the strategy registry (``STRATEGIES``, ``STRATEGY_FAMILIES``,
:func:`make_strategy`) and the MemQA strategies; :mod:`agents.scripted.strategies.qa_tool_strategies` MemQA's
memory-tools mode; :mod:`agents.scripted.strategies.reading_strategies` MemRead and MemDialog, with the dialogue
reader; :mod:`agents.scripted.strategies.tool_strategies` MemDialog-BEAM's memory tools;
:mod:`agents.scripted.strategies.text_strategies` any dialogue text (LoCoMo, BEAM, LongMemEval), scripted or served;
:mod:`agents.scripted.strategies.compact_oracle` the compact-notes oracle for a memory budget that binds;
:mod:`agents.scripted.strategies.user_strategies` the user's own strategy by import path or entry point; and
:mod:`agents.scripted.strategies.world_reader` the rule-based reader of the synthetic world's language. Importing this
package registers every family in ``STRATEGY_FAMILIES``. It imports nothing from the floor above
(:mod:`agents.scripted`) nor from its sibling :mod:`agents.scripted.bench`, which runs these strategies.
"""

from agents.scripted.strategies.qa_strategies import STRATEGIES, STRATEGY_FAMILIES, ScriptedPolicy, make_strategy
from agents.scripted.strategies import reading_strategies  # noqa: F401 - registers the MemRead and MemDialog families
from agents.scripted.strategies import tool_strategies  # noqa: F401 - registers MemDialog-BEAM's memory-tools family
from agents.scripted.strategies import qa_tool_strategies  # noqa: F401 - registers MemQA's memory-tools family
from agents.scripted.strategies import text_strategies  # noqa: F401 - registers the real-text dialog strategies

__all__ = ["STRATEGIES", "STRATEGY_FAMILIES", "ScriptedPolicy", "make_strategy"]
