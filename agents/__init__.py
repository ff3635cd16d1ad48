"""Agents for memenv: scripted memory strategies (and, in later issues, LLM policies and trainers)."""

from agents.scripted import STRATEGIES, ScriptedPolicy, make_strategy
import agents.reading  # noqa: E402,F401 - registers the MemRead and MemDialog strategy families

__all__ = ["STRATEGIES", "ScriptedPolicy", "make_strategy"]
