"""The actor side of the PPO/GRPO trainer (:func:`agents.llm.training.ppo.train_rl`): what one forward of the
actor(-critic) gives for a list of invocation records (:class:`ActorOutput`), the extension points a trainer
plugs in (an ``actor_forward``, :data:`ActorForward`; an ``extra_loss``, :class:`LossHook`), the default forward
(:func:`collate_forward`), the split of a minibatch into micro-batches and the no-grad scoring of old and
reference log-probs (:func:`score_records`). See :mod:`agents.llm.training.ppo`'s module doc.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agents.llm.records.invocation import InvocationRecord
from agents.llm.training.common import collate, unwrap_ddp


@dataclass
class ActorOutput:
    """What one actor forward gives for a list of records, per action token (``action_mask == 1``) in record
    order, then token order (the order of the flattened per-token record fields)."""

    logp: torch.Tensor  # [N] log_softmax(logits / T)[token], fp32
    entropy: torch.Tensor | None = None  # [N]
    values: torch.Tensor | None = None  # [N] (PPO's value head)
    hidden: torch.Tensor | None = None  # [N, d] the states that predict the action tokens (with grad in training)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None  # hidden -> logits (the LM head)
    batch: Any = None  # whatever the forward built (a training.Batch, packed batches, ...)
    # the denominator of a token-mean over the minibatch's action tokens, when this forward sees a part of it
    # (gradient accumulation, DDP: the count over every micro-batch and rank / world size); a loss hook divides
    # its per-token sum by it (None: its own tokens' mean)
    token_denom: float | None = None
    # a loss hook's per-token term computed by the same forward from the same logits ([N], with grad; e.g.
    # distill.trainer's fused LM head), or None: the hook computes its own
    distill: torch.Tensor | None = None


ActorForward = Callable[..., ActorOutput]  # (module, records, *, temperature, entropy) -> ActorOutput


class LossHook(Protocol):
    """An extra loss term on the PPO/GRPO minibatch; returns ``(term, metrics)``, the term already weighted.

    With ``grad_accumulation`` (or under DDP) it is called on each micro-batch: a per-token term divides its sum
    by ``actor.token_denom`` when that is set, so the micro-batches' terms add up to the minibatch's."""

    def __call__(self, records: Sequence[InvocationRecord], actor: ActorOutput) -> tuple[torch.Tensor, dict[str, float]]:
        ...


def micro_batches(forward, records: Sequence[InvocationRecord], cfg) -> list[list[int]]:
    """Index groups of ``records``, one per forward + backward of a minibatch (``cfg``: a PPOConfig; see
    :mod:`agents.llm.training.ppo`'s module doc on ``grad_accumulation``)."""
    if not cfg.grad_accumulation or len(records) <= 1:
        return [list(range(len(records)))]
    split = getattr(forward, "split", None)
    if split is not None:
        groups = [list(g) for g in split(records) if len(g)]
    else:
        groups = [list(range(i, min(i + cfg.micro_batch_size, len(records))))
                  for i in range(0, len(records), cfg.micro_batch_size)]
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(len(records))):
        raise ValueError(f"the micro-batches of a minibatch of {len(records)} records cover {covered}")
    return groups


def collate_forward(pad_id: int, device) -> ActorForward:
    """The default actor forward: one invocation per right-padded row (:func:`agents.llm.training.common.collate`)."""

    def forward(module, records, *, temperature: float = 1.0, entropy: bool = False) -> ActorOutput:
        b = collate_records(records, pad_id, device)
        logp, ent, values, hidden = module(**b.inputs(), temperature=temperature, entropy=entropy,
                                           return_hidden=True)
        return ActorOutput(logp, ent, values, hidden, unwrap_ddp(module).lm.get_output_embeddings(), b)

    return forward


def flat_tokens(records: Sequence[InvocationRecord], name: str) -> torch.Tensor:
    """A per-token record field (``token_advantages``, ``values``, ...) at the action tokens, flattened in record
    order, then token order."""
    return torch.tensor([v for r in records for v, m in zip(getattr(r, name), r.action_mask) if m],
                        dtype=torch.float32)


def collate_records(records, pad_id, device):
    """One invocation per right-padded row (:func:`agents.llm.training.common.collate`)."""
    return collate([(r.prompt_ids, r.response_ids) for r in records], pad_id,
                   memory_masks=[r.memory_mask for r in records], action_masks=[r.action_mask for r in records],
                   device=device)


def minibatch_units(records: Sequence[InvocationRecord], unit: str) -> list[list[int]]:
    """Record indices grouped into minibatch units: one invocation each, or whole episodes (consecutive records
    with the same ``(rollout_id, episode_id)``, as ``records_of`` lists them)."""
    if unit == "invocation":
        return [[i] for i in range(len(records))]
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault((getattr(r, "rollout_id", ""), r.episode_id), []).append(i)
    return list(groups.values())


@torch.no_grad()
def score_records(module, records, forward: ActorForward, temperature, chunk: int = 16, values: bool = True,
           unit: str = "invocation"):
    """Per-record lists of log-probs and values at action tokens (no grad)."""
    logps, vals = [None] * len(records), [None] * len(records)
    module.eval()
    units = minibatch_units(records, unit)
    for i in range(0, len(units), chunk):
        idx = [k for u in units[i:i + chunk] for k in u]
        out = forward(module, [records[k] for k in idx], temperature=temperature, entropy=False)
        counts = [sum(records[k].action_mask) for k in idx]
        for k, lp, v in zip(idx, out.logp.split(counts),
                            out.values.split(counts) if (values and out.values is not None) else [None] * len(idx)):
            logps[k] = lp.tolist()
            vals[k] = v.tolist() if v is not None else None
    module.train()
    return logps, vals


__all__ = ["ActorOutput", "ActorForward", "LossHook", "micro_batches", "collate_forward", "flat_tokens",
           "collate_records", "minibatch_units", "score_records"]
