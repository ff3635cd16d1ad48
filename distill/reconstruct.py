"""Rebuild the token sequences that score invocation records: *aligned* (as sampled) or the *persistent* control.

Aligned (MemOPD): each invocation exactly as it was sampled, ``prompt_ids + response_ids`` at positions
``0 .. n-1``, seeing only itself. Scoring it reproduces the behaviour log-probs (the RCE check).

Persistent-history control (what multi-turn trainers do when they flatten an episode): one growing sequence per
episode, in turn order: the first invocation's prompt, then for each turn its sampled ids followed by the ids of
the environment's reply, positions running on, every action scored after all earlier text. The sampled ids are
kept exactly as sampled; only environment text is tokenised.

*The environment's reply* after turn k is what turn k+1's observation adds, read from the env snapshot
``records[k+1].snapshot["observation"]``: the newest ``<information>…</information>`` block (the tool output
as the env showed it, with its ``[turns left]`` header and any invalid-action notice), which is exactly what
memenv's own ``context="history"`` mode appends after each action. Where an observation has no such block
(other envs), the reply is the part of the next observation after its longest common prefix with the previous
one. With the plain prompt template it is wrapped as ``reply_template.format(reply=...)`` (default
``"\\n{reply}\\n"``: the env's history mode joins transcript parts with a newline, and the plain prompt template
ends the observation with one). Nothing is appended after the last invocation of an episode (there is no later
action to score).

Chat templates: when the records were sampled under the tokenizer's chat template (the first prompt ends with
the template's assistant opening), the reply goes into a user turn the way the template writes a conversation:
the assistant turn is closed, a user turn holds the reply, and a new assistant turn is opened
(:func:`chat_turn_frame`; ChatML: ``<|im_end|>\\n<|im_start|>user\\n{reply}<|im_end|>\\n<|im_start|>assistant\\n``),
so the transcript is what ``apply_chat_template`` renders for the whole episode. A response that already ends
with the template's end-of-turn token (sampling stopped at it) is not closed twice.

The logit that scores response token ``t`` of a :class:`Segment` sits at sequence index ``start + t - 1``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from agents.llm.records import InvocationRecord

RECONSTRUCTIONS = ("aligned", "persistent")
REPLY_TEMPLATE = "\n{reply}\n"
_INFO_OPEN, _INFO_CLOSE = "<information>", "</information>"


@dataclass
class Segment:
    """The sampled tokens of one invocation inside a :class:`TokenSequence`."""

    record: int  # index into the list of records passed in
    start: int  # index in TokenSequence.input_ids of the first response token
    length: int  # == len(records[record].response_ids)


@dataclass
class TokenSequence:
    """One causal sequence as it will be scored."""

    input_ids: list[int]
    position_ids: list[int]
    segments: list[Segment] = field(default_factory=list)
    prefix_len: int = 0  # set by shared-prefix packing; 0 otherwise

    def __len__(self) -> int:
        return len(self.input_ids)


def aligned(records: Sequence[InvocationRecord]) -> list[TokenSequence]:
    """One sequence per record: ``prompt_ids + response_ids``, positions ``0..n-1``, one segment."""
    out = []
    for i, r in enumerate(records):
        ids = list(r.prompt_ids) + list(r.response_ids)
        out.append(TokenSequence(ids, list(range(len(ids))), [Segment(i, len(r.prompt_ids), len(r.response_ids))]))
    return out


def episode_key(record: InvocationRecord) -> tuple[str, str]:
    """``(rollout_id, episode_id)``: what identifies one episode across rollout calls."""
    return (getattr(record, "rollout_id", "") or "", record.episode_id)


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


_SENTINEL_ASSISTANT, _SENTINEL_USER = "\u0001MEMENV-ASSISTANT\u0001", "\u0001MEMENV-USER\u0001"


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


def _sampled_under_chat(first: InvocationRecord, tokenizer, frame: tuple[str, str] | None) -> bool:
    """The first prompt ends with the chat template's assistant opening (else: the plain prompt template)."""
    if frame is None or not frame[1]:
        return False
    return tokenizer.decode(list(first.prompt_ids), skip_special_tokens=False).endswith(frame[1])


def _chat_reply_text(record: InvocationRecord, reply: str, tokenizer, frame: tuple[str, str]) -> str:
    close, opening = frame
    if record.response_ids:  # sampling stopped at the end-of-turn token: the turn is already closed
        last = tokenizer.decode([record.response_ids[-1]], skip_special_tokens=False)
        if last and last in set(getattr(tokenizer, "all_special_tokens", ())) and close.startswith(last):
            close = close[len(last):]
    return close + reply + opening


def persistent(records: Sequence[InvocationRecord], tokenizer, *, reply_template: str = REPLY_TEMPLATE,
               reply: Callable[[InvocationRecord, InvocationRecord], str] | None = None,
               template: str = "auto") -> list[TokenSequence]:
    """One sequence per episode (records grouped by ``(rollout_id, episode_id)``, ordered by turn; episodes in
    order of first appearance). ``reply(record_k, record_k1)`` overrides how the env's reply text is found.
    ``template``: ``"auto"`` (chat turns when the records were sampled under the tokenizer's chat template, see
    the module doc), ``"chat"`` or ``"plain"`` (``reply_template``)."""
    if tokenizer is None:
        raise ValueError("persistent reconstruction tokenises the environment's replies: pass the tokenizer")
    if template not in ("auto", "chat", "plain"):
        raise ValueError(f"template must be 'auto', 'chat' or 'plain', got {template!r}")
    frame = chat_turn_frame(tokenizer) if template != "plain" else None
    if template == "chat" and frame is None:
        raise ValueError("template='chat' but the tokenizer has no chat template")
    episodes: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        episodes[episode_key(r)].append(i)
    out = []
    for key, members in episodes.items():
        members.sort(key=lambda i: records[i].turn)
        turns = [records[i].turn for i in members]
        if len(set(turns)) != len(turns):
            raise ValueError(f"episode {key} (rollout_id, episode_id) has two records for one turn ({turns}): "
                             "records of different rollouts need distinct rollout_ids")
        first = records[members[0]]
        chat = template == "chat" or (template == "auto" and _sampled_under_chat(first, tokenizer, frame))
        ids = list(first.prompt_ids)
        segments = []
        for k, i in enumerate(members):
            r = records[i]
            segments.append(Segment(i, len(ids), len(r.response_ids)))
            ids += list(r.response_ids)
            if k + 1 < len(members):
                nxt = records[members[k + 1]]
                if reply is not None:
                    text = reply(r, nxt)
                else:
                    text = environment_reply(str(r.snapshot.get("observation", "")),
                                             str(nxt.snapshot.get("observation", "")))
                wrapped = (_chat_reply_text(r, text, tokenizer, frame) if chat
                           else reply_template.format(reply=text))
                ids += list(tokenizer.encode(wrapped, add_special_tokens=False))
        out.append(TokenSequence(ids, list(range(len(ids))), segments))
    return out


def reconstruct(records: Sequence[InvocationRecord], mode: str = "aligned", tokenizer=None,
                **kwargs) -> list[TokenSequence]:
    """``mode``: ``"aligned"`` (:func:`aligned`) or ``"persistent"`` (:func:`persistent`, needs ``tokenizer``)."""
    if mode == "aligned":
        return aligned(records)
    if mode == "persistent":
        return persistent(records, tokenizer, **kwargs)
    raise ValueError(f"reconstruction must be one of {RECONSTRUCTIONS}, got {mode!r}")
