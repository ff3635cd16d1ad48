"""Agents for memenv: scripted memory strategies (and, in later issues, LLM policies and trainers)."""

from agents.scripted import STRATEGIES, ScriptedPolicy, make_strategy

__all__ = ["STRATEGIES", "ScriptedPolicy", "make_strategy"]
