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
one. It is wrapped as ``reply_template.format(reply=...)`` (default ``"\\n{reply}\\n"``: the env's history mode
joins transcript parts with a newline, and the plain prompt template ends the observation with one). Nothing
is appended after the last invocation of an episode (there is no later action to score).

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


def persistent(records: Sequence[InvocationRecord], tokenizer, *, reply_template: str = REPLY_TEMPLATE,
               reply: Callable[[InvocationRecord, InvocationRecord], str] | None = None) -> list[TokenSequence]:
    """One sequence per episode (records grouped by ``(rollout_id, episode_id)``, ordered by turn; episodes in
    order of first appearance). ``reply(record_k, record_k1)`` overrides how the env's reply text is found."""
    if tokenizer is None:
        raise ValueError("persistent reconstruction tokenises the environment's replies: pass the tokenizer")
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
                ids += list(tokenizer.encode(reply_template.format(reply=text), add_special_tokens=False))
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
