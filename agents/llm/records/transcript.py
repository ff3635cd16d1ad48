"""The flattened-transcript view of an episode: what a multi-turn trainer shows a model instead of the memory state.

Two *views* of one episode exist in memenv (:data:`VIEWS`):

- ``memory`` (the env's own observation, MEM1-style): each invocation sees the task, its memory and the newest tool
  result; its prompt is :meth:`agents.llm.generation.policy.LLMPolicy.encode_prompt` of the observation.
- ``persistent`` (one growing transcript): the first invocation's prompt, then for each turn the action's ids
  followed by the ids of the environment's reply, so invocation ``k`` sees every earlier action and reply.

This module builds the persistent view's ids once, for every user of it: :func:`distill.reconstruct.persistent`
(the teacher-persistent control scores actions in it), the SFT that trains a teacher on both views
(:func:`agents.llm.training.sft.expert_data`, ``views``) and a policy acting in it
(:func:`agents.llm.records.rollouts.rollout`, ``view="persistent"``). Because all three append exactly
:meth:`TranscriptFormat.continuation` after each turn, a teacher trained on the persistent view saw the very ids the
control scores (tested: ids equal).

*The environment's reply* after turn k is what turn k+1's observation adds (:func:`environment_reply`): the newest
``<information>…</information>`` block (the tool output as the env showed it, with its ``[turns left]`` header and
any invalid-action notice), which is exactly what memenv's own ``context="history"`` mode appends after each
action. Where an observation has no such block (other envs), the reply is the part of the next observation after
its longest common prefix with the previous one. With the plain prompt template it is wrapped as
``reply_template.format(reply=...)`` (default ``"\\n{reply}\\n"``: the env's history mode joins transcript parts with
a newline, and the plain prompt template ends the observation with one).

Chat templates: when the first prompt was made with the tokenizer's chat template (it ends with the template's
assistant opening), the reply goes into a user turn the way the template writes a conversation: the assistant turn
is closed, a user turn holds the reply, and a new assistant turn is opened (:func:`chat_turn_frame`; ChatML:
``<|im_end|>\\n<|im_start|>user\\n{reply}<|im_end|>\\n<|im_start|>assistant\\n``), so the transcript is what
``apply_chat_template`` renders for the whole episode. A response that already ends with the template's end-of-turn
token (sampling stopped at it) is not closed twice.
"""

from __future__ import annotations

from typing import Sequence

VIEWS = ("memory", "persistent")
REPLY_TEMPLATE = "\n{reply}\n"
_INFO_OPEN, _INFO_CLOSE = "<information>", "</information>"
_SENTINEL_ASSISTANT, _SENTINEL_USER = "\u0001MEMENV-ASSISTANT\u0001", "\u0001MEMENV-USER\u0001"


def check_view(view: str) -> str:
    if view not in VIEWS:
        raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
    return view


def environment_reply(previous_observation: str, next_observation: str) -> str:
    """The text the env added for the next invocation (see the module doc): the last ``<information>`` block
    of ``next_observation``, else its part after the longest common prefix with ``previous_observation``."""
    start = next_observation.rfind(_INFO_OPEN)
    if start >= 0 and next_observation.find(_INFO_CLOSE, start) >= 0:
        end = next_observation.find(_INFO_CLOSE, start) + len(_INFO_CLOSE)
        return next_observation[start:end]
    n = 0
    limit = min(len(previous_observation), len(next_observation))
    while n < limit and previous_observation[n] == next_observation[n]:
        n += 1
    return next_observation[n:]


def chat_turn_frame(tokenizer) -> tuple[str, str] | None:
    """``(close, open)``: the text the tokenizer's chat template writes between an assistant message's content and
    the next user message's content (``close``: end of the assistant turn, start of the user turn), and between
    that user content and the next assistant content (``open``: end of the user turn, the assistant opening of
    ``add_generation_prompt``). None without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"},
                                          {"role": "assistant", "content": _SENTINEL_ASSISTANT},
                                          {"role": "user", "content": _SENTINEL_USER}],
                                         tokenize=False, add_generation_prompt=True)
    a = text.find(_SENTINEL_ASSISTANT)
    u = text.find(_SENTINEL_USER, a + 1)
    if a < 0 or u < 0:
        raise ValueError("the tokenizer's chat template drops message contents: cannot place the environment's "
                         "replies in user turns")
    return text[a + len(_SENTINEL_ASSISTANT):u], text[u + len(_SENTINEL_USER):]


class TranscriptFormat:
    """How the persistent view joins turns, for one tokenizer: :meth:`uses_chat` (decided from an episode's first
    prompt) and :meth:`continuation` (the ids appended after a turn's response).

    ``template``: ``"auto"`` (chat turns when the first prompt was made under the tokenizer's chat template),
    ``"chat"`` or ``"plain"`` (``reply_template``)."""

    def __init__(self, tokenizer, *, reply_template: str = REPLY_TEMPLATE, template: str = "auto") -> None:
        if tokenizer is None:
            raise ValueError("the persistent view tokenises the environment's replies: pass the tokenizer")
        if template not in ("auto", "chat", "plain"):
            raise ValueError(f"template must be 'auto', 'chat' or 'plain', got {template!r}")
        self.tokenizer, self.reply_template, self.template = tokenizer, reply_template, template
        self.frame = chat_turn_frame(tokenizer) if template != "plain" else None
        if template == "chat" and self.frame is None:
            raise ValueError("template='chat' but the tokenizer has no chat template")
        self._special = set(getattr(tokenizer, "all_special_tokens", ()))

    def uses_chat(self, first_prompt_ids: Sequence[int]) -> bool:
        """Whether an episode whose first prompt is ``first_prompt_ids`` is joined in chat turns."""
        if self.template == "chat":
            return True
        if self.template == "plain" or self.frame is None or not self.frame[1]:
            return False
        return self.tokenizer.decode(list(first_prompt_ids), skip_special_tokens=False).endswith(self.frame[1])

    def reply_text(self, response_ids: Sequence[int], reply: str, chat: bool) -> str:
        """The text appended after a turn whose sampled ids are ``response_ids``, the env having replied ``reply``."""
        if not chat:
            return self.reply_template.format(reply=reply)
        close, opening = self.frame
        if response_ids:  # sampling stopped at the end-of-turn token: the turn is already closed
            last = self.tokenizer.decode([response_ids[-1]], skip_special_tokens=False)
            if last and last in self._special and close.startswith(last):
                close = close[len(last):]
        return close + reply + opening

    def continuation(self, response_ids: Sequence[int], previous_observation: str, next_observation: str,
                     chat: bool, reply: str | None = None) -> list[int]:
        """The ids the persistent view appends after a turn's ``response_ids``: the wrapped environment reply
        (``reply``, default :func:`environment_reply` of the two observations)."""
        text = environment_reply(previous_observation, next_observation) if reply is None else reply
        return list(self.tokenizer.encode(self.reply_text(response_ids, text, chat), add_special_tokens=False))


def flatten_episode(first_prompt_ids: Sequence[int], responses: Sequence[Sequence[int]],
                    observations: Sequence[str], fmt: TranscriptFormat,
                    replies: Sequence[str] | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    """One episode in the persistent view: ``(ids, spans)`` with ``spans[k] = (start, length)`` of turn k's
    response in ``ids``. ``observations[k]`` is the observation turn k acted on (the env's memory-view text; its
    next one gives the reply after turn k); ``replies[k]`` overrides that reply text. Nothing follows the last
    response (no later action to score)."""
    if len(observations) != len(responses):
        raise ValueError(f"one observation per turn: {len(observations)} observations for {len(responses)} responses")
    chat = fmt.uses_chat(first_prompt_ids)
    ids, spans = list(first_prompt_ids), []
    for k, response in enumerate(responses):
        spans.append((len(ids), len(response)))
        ids += list(response)
        if k + 1 < len(responses):
            ids += fmt.continuation(response, observations[k], observations[k + 1], chat,
                                    None if replies is None else replies[k])
    return ids, spans


__all__ = ["VIEWS", "REPLY_TEMPLATE", "check_view", "environment_reply", "chat_turn_frame", "TranscriptFormat",
           "flatten_episode"]
