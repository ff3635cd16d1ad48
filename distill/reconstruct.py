"""Rebuild the token sequences that score invocation records: *aligned* (as sampled) or the *persistent* control.

Aligned (MemOPD): each invocation exactly as it was sampled, ``prompt_ids + response_ids`` at positions
``0 .. n-1``, seeing only itself. Scoring it reproduces the behaviour log-probs (the RCE check).

Persistent-history control (what multi-turn trainers do when they flatten an episode): one growing sequence per
episode, in turn order: the first invocation's prompt, then for each turn its sampled ids followed by the ids of
the environment's reply, positions running on, every action scored after all earlier text. The sampled ids are
kept exactly as sampled; only environment text is tokenised.

The environment's reply, its wrapping (plain template or chat turns) and the flattening itself live in
:mod:`agents.llm.records.transcript`, shared with the SFT that trains a teacher on this view and with a policy acting in
it, so the three see the same ids. ``environment_reply``, ``chat_turn_frame`` and ``REPLY_TEMPLATE`` are
re-exported here.

The logit that scores response token ``t`` of a :class:`Segment` sits at sequence index ``start + t - 1``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from agents.llm.records.invocation import InvocationRecord
from agents.llm.records.transcript import (REPLY_TEMPLATE, TranscriptFormat, chat_turn_frame,  # noqa: F401
                                           environment_reply, flatten_episode)

RECONSTRUCTIONS = ("aligned", "persistent")


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


def persistent(records: Sequence[InvocationRecord], tokenizer, *, reply_template: str = REPLY_TEMPLATE,
               reply: Callable[[InvocationRecord, InvocationRecord], str] | None = None,
               template: str = "auto") -> list[TokenSequence]:
    """One sequence per episode (records grouped by ``(rollout_id, episode_id)``, ordered by turn; episodes in
    order of first appearance). ``reply(record_k, record_k1)`` overrides how the env's reply text is found.
    ``template``: ``"auto"`` (chat turns when the records were sampled under the tokenizer's chat template, see
    the module doc), ``"chat"`` or ``"plain"`` (``reply_template``)."""
    fmt = TranscriptFormat(tokenizer, reply_template=reply_template, template=template)
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
        episode = [records[i] for i in members]
        replies = None if reply is None else [reply(a, b) for a, b in zip(episode, episode[1:])] + [""]
        ids, spans = flatten_episode(episode[0].prompt_ids, [r.response_ids for r in episode],
                                     [str(r.snapshot.get("observation", "")) for r in episode], fmt, replies)
        out.append(TokenSequence(ids, list(range(len(ids))),
                                 [Segment(i, start, length) for i, (start, length) in zip(members, spans)]))
    return out


def reconstruct(records: Sequence[InvocationRecord], mode: str = "aligned", tokenizer=None,
                **kwargs) -> list[TokenSequence]:
    """``mode``: ``"aligned"`` (:func:`aligned`) or ``"persistent"`` (:func:`persistent`, needs ``tokenizer``)."""
    if mode == "aligned":
        return aligned(records)
    if mode == "persistent":
        return persistent(records, tokenizer, **kwargs)
    raise ValueError(f"reconstruction must be one of {RECONSTRUCTIONS}, got {mode!r}")
