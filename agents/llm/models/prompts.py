"""Prompt texts shared by the in-process policy (:mod:`agents.llm.generation.policy`) and the served one
(:mod:`agents.llm.adapters.served`), kept free of torch so that ``memenv bench --strategies openai:MODEL@URL`` needs
neither torch nor transformers."""

from __future__ import annotations

#: The system prompt that teaches an instruct model memenv's action protocol (chat templates only): one turn is
#: ``<memory>...</memory>`` then ``<search>...</search>`` or ``<answer>...</answer>``, taught by a two-turn example
#: (a 135M instruct model copies the task text when given instructions alone). Shared by
#: :class:`agents.llm.generation.policy.LLMPolicy` zero-shot runs (``system_prompt="protocol"``), the served policy
#: (``openai:MODEL@URL``) and the real-model tests, so every path sends the same prompt.
PROTOCOL_SYSTEM_PROMPT = (
    "You control a search engine with tags. You never repeat the user's text.\n"
    "User: <task>...Question 1: In which country is Wigei?</task><memory></memory>"
    "<information>No search results yet.</information>\n"
    "Assistant: <memory>Q1: country of Wigei?</memory><search>Wigei</search>\n"
    "User: <task>...Question 1: In which country is Wigei?</task><memory>Q1: country of Wigei?</memory>"
    "<information>Doc 1 (Title: Wigei) Wigei is a town in Solurtia.</information>\n"
    "Assistant: <memory>Q1: Wigei is in Solurtia.</memory><answer>Solurtia</answer>\n"
    "Reply as the Assistant does: one <memory> block, then one <search> or <answer> block, nothing else."
)
