"""The "update" step of the PPO/GRPO trainer (:func:`agents.llm.training.ppo.train_rl`): ``epochs`` x
``num_minibatches`` clipped-surrogate steps on one update's records (:func:`ppo_update`), each a backward per
micro-batch and one optimizer step (:func:`minibatch_step`), with the token-mean loss :func:`ppo_loss`. See
:mod:`agents.llm.training.ppo`'s module doc for the loss, the masks of GRPO's zero-variance groups and the DDP
normalisers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents.llm.training.actor import ActorForward, LossHook, flat_tokens, micro_batches, minibatch_units
from agents.llm.records.invocation import InvocationRecord
from agents.llm.training.common import check_finite_step


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, *, clip: float = 0.2,
             values: torch.Tensor | None = None, old_values: torch.Tensor | None = None,
             returns: torch.Tensor | None = None, clip_vf: float | None = 0.2, vf_coef: float = 0.5,
             entropy: torch.Tensor | None = None, ent_coef: float = 0.0, ref_logp: torch.Tensor | None = None,
             kl_coef: float = 0.0, mask: torch.Tensor | None = None,
             pg_mask: torch.Tensor | None = None, denom: float | None = None,
             pg_denom: float | None = None) -> dict[str, torch.Tensor]:
    """The token-mean PPO/GRPO loss over action tokens (1-D tensors of equal length); see the module doc.

    ``mask`` (bool, same length): only these tokens count, in the loss terms and in the token-mean's
    denominator (GRPO's zero-variance groups are masked out); with no token left every term is 0 (and still a
    function of ``logp``, so ``backward`` runs). ``pg_mask``: the tokens of the policy-gradient term alone
    (default ``mask``; GRPO passes ``mask`` plus the tokens of zero-variance groups that carry memory credit).
    The ``approx_kl`` / ``clipfrac`` diagnostics still cover every token.

    ``denom`` / ``pg_denom``: the token-means' denominators (of ``mask``'s tokens and ``pg_mask``'s), when these
    tokens are part of a larger minibatch (gradient accumulation, DDP ranks: the global count / world size);
    default: the count of the tokens given."""
    def masked_mean(m, d):
        if m is None:
            return torch.mean if d is None else (lambda x: x.sum() / d)
        keep = m.to(logp.device, torch.float32)
        if d is not None:
            return lambda x: (x * keep).sum() / d
        return lambda x: (x * keep).sum() / keep.sum().clamp(min=1.0)

    mean = masked_mean(mask, denom)
    pg_mean = masked_mean(mask if pg_mask is None else pg_mask, denom if pg_mask is None else pg_denom)
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    pg = pg_mean(torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)))
    out = {"pg_loss": pg}
    loss = pg
    if values is not None:
        v_unclipped = (values - returns) ** 2
        if clip_vf is not None:
            v_clipped = (old_values + (values - old_values).clamp(-clip_vf, clip_vf) - returns) ** 2
            v_loss = 0.5 * mean(torch.max(v_unclipped, v_clipped))
        else:
            v_loss = 0.5 * mean(v_unclipped)
        out["v_loss"] = v_loss
        loss = loss + vf_coef * v_loss
    if entropy is not None:
        out["entropy"] = mean(entropy)
        loss = loss - ent_coef * out["entropy"]
    if ref_logp is not None:
        d = ref_logp - logp
        out["kl_ref"] = mean(d.exp() - d - 1)
        loss = loss + kl_coef * out["kl_ref"]
    with torch.no_grad():
        # diagnostics of how far the policy moved: over every token, masked or not (target_kl reads it)
        out["approx_kl"] = ((ratio - 1) - log_ratio).mean()
        out["clipfrac"] = ((ratio - 1).abs() > clip).float().mean()
    out["loss"] = loss
    return out


def clip_gradients(policy_params, value_params, max_norm: float) -> tuple[float, float | None]:
    """Clip the LM's and the value head's gradients to ``max_norm`` each; returns both norms before clipping.

    Apart, not as one norm: a fresh value head's gradient is several times the policy's (measured 1.7 vs 0.5
    on a MemQA SFT checkpoint), and one shared norm would shrink every policy step with it."""
    policy_norm = float(torch.nn.utils.clip_grad_norm_(list(policy_params), max_norm))
    value_params = list(value_params)
    value_norm = float(torch.nn.utils.clip_grad_norm_(value_params, max_norm)) if value_params else None
    return policy_norm, value_norm


@dataclass
class UpdateBatch:
    """What one update trains on, as the rollout and advantages steps leave it: the records (advantages, returns
    and old values set), per record the old and reference log-probs at its action tokens, the records of dropped
    zero-variance groups (``id``s), PPO's whitening moments; the episodes, GRPO's flat groups and the loss
    hook's ``on_update`` metrics ride along for the log."""

    records: list[InvocationRecord]
    old_logps: list[list[float] | None]  # None: taken from the first minibatch's own forward (see first_order)
    ref_logps: list[list[float] | None] | None
    dropped: set[int]
    adv_mean: float
    adv_std: float
    episodes: list[Any] = field(default_factory=list)
    flat: set = field(default_factory=set)
    hook_stats: dict[str, float] = field(default_factory=dict)
    # the first epoch's order of the minibatch units, drawn before the scoring passes (from the same generator,
    # so the minibatches are those ppo_update would draw): the records of its first minibatch are the only ones
    # whose old / reference log-probs may be None, filled by that minibatch's training forward before any
    # optimizer step (the policy the scoring pass would have seen); None: ppo_update draws it
    first_order: np.ndarray | None = None


@dataclass
class Learner:
    """The trained module and what steps it: ``train_model`` (``model``, DDP-wrapped under torchrun), the actor
    forward, the optimizer, and the LM's and value head's parameters (clipped apart)."""

    train_model: torch.nn.Module
    forward: ActorForward
    optimizer: torch.optim.Optimizer
    lm_params: list[torch.nn.Parameter]
    head: list[torch.nn.Parameter]
    temperature: float
    extra_loss: LossHook | None = None


def ppo_update(cfg, dist, learner: Learner, batch: UpdateBatch, mb_rng: np.random.Generator, cpu,
               update: int) -> tuple[dict[str, list[float]], bool]:
    """``cfg.epochs`` passes of ``cfg.num_minibatches`` minibatch steps over ``batch`` (``cfg``: a PPOConfig;
    ``cpu``: the update's :class:`agents.llm.training.ppo.PartClock`); returns the per-minibatch statistics and whether
    ``target_kl`` stopped the epochs early."""
    stats: dict[str, list[float]] = {}
    units = minibatch_units(batch.records, cfg.minibatch_unit)
    for epoch in range(cfg.epochs):
        order = batch.first_order if epoch == 0 and batch.first_order is not None else mb_rng.permutation(len(units))
        for unit_part in np.array_split(order, cfg.num_minibatches):
            part = [i for u in unit_part for i in units[u]]
            if part:
                minibatch_step(cfg, dist, learner, batch, part, cpu, update, stats)
                if any(lp is None for lp in batch.old_logps) or \
                        (batch.ref_logps is not None and any(lp is None for lp in batch.ref_logps)):
                    raise RuntimeError("old/reference log-probs left to a forward after the first optimizer step: "
                                       "only the first minibatch's may be taken from its own forward")
        if cfg.target_kl is not None and stats.get("approx_kl"):
            kl = dist.mean({"kl": float(np.mean(stats["approx_kl"][-cfg.num_minibatches:]))})["kl"]
            if kl > cfg.target_kl:
                return stats, True
    return stats, False


@dataclass
class Minibatch:
    """One minibatch's records and per-token tensors (on the device), with its token-mean denominators."""

    records: list[InvocationRecord]
    adv: torch.Tensor
    old_logp: torch.Tensor | None  # None: old_from_forward
    ref_logp: torch.Tensor | None  # None: no reference (kl_coef 0), or ref_from_forward
    mask: torch.Tensor | None  # the tokens of the loss terms (None: all): GRPO's dropped groups left out
    pg_mask: torch.Tensor | None  # the policy-gradient term's tokens (mask plus memory-credited dropped tokens)
    denom_all: float
    denom: float
    pg_denom: float
    token_ends: np.ndarray  # record i's action tokens are token_ends[i]:token_ends[i + 1]
    # the old / reference log-probs are this minibatch's own training forward's (detached): the first minibatch
    # of an update, before any optimizer step (UpdateBatch.first_order); its log-probs are kept in forward_logp
    old_from_forward: bool = False
    ref_from_forward: bool = False
    forward_logp: torch.Tensor | None = None


def _per_token(values: list | None, part: list[int], device, name: str) -> tuple[torch.Tensor | None, bool]:
    """``part``'s per-record lists of ``values`` as one tensor, or ``(None, True)`` when every one of them is
    None (left to the minibatch's own forward); ``(None, False)`` when there are no such values."""
    if values is None:
        return None, False
    missing = [values[i] is None for i in part]
    if all(missing):
        return None, True
    if any(missing):
        raise RuntimeError(f"a minibatch mixes records with scored {name} log-probs and records left to its forward")
    return torch.tensor([v for i in part for v in values[i]], device=device), False


def make_minibatch(cfg, dist, batch: UpdateBatch, part: list[int]) -> Minibatch:
    """The records ``part`` of ``batch`` as a :class:`Minibatch` (PPO's advantages whitened)."""
    mb = [batch.records[i] for i in part]
    mask = pg_mask = None
    adv = flat_tokens(mb, "token_advantages").to(dist.device)
    if batch.dropped:
        # A minibatch whose tokens are all dropped still runs backward and step (a zero loss):
        # DDP ranks must take the same steps.
        mask = torch.tensor([id(r) not in batch.dropped for r in mb for m in r.action_mask if m],
                            device=dist.device)
        pg_mask = mask | (adv != 0)  # dropped groups' advantages are 0 but for the hook's credit
    if cfg.uses_value and cfg.norm_adv:
        adv = (adv - batch.adv_mean) / (batch.adv_std + 1e-8)
    old_logp, old_from_forward = _per_token(batch.old_logps, part, dist.device, "old")
    ref_logp, ref_from_forward = _per_token(batch.ref_logps, part, dist.device, "reference")
    counts = [float(len(adv)), float(mask.sum()) if mask is not None else float(len(adv)),
              float(pg_mask.sum()) if pg_mask is not None else float(len(adv))]
    if dist.enabled:
        counts = dist.sum(counts)
    # token-mean denominators of the whole minibatch over every rank (DDP averages over ranks)
    denom_all, denom, pg_denom = (max(c, 1.0) / dist.world for c in counts)
    token_ends = np.cumsum([0] + [sum(r.action_mask) for r in mb])
    forward_logp = torch.zeros(int(token_ends[-1]), device=dist.device) if old_from_forward or ref_from_forward \
        else None
    return Minibatch(mb, adv, old_logp, ref_logp, mask, pg_mask, denom_all, denom, pg_denom, token_ends,
                     old_from_forward, ref_from_forward, forward_logp)


def minibatch_step(cfg, dist, learner: Learner, batch: UpdateBatch, part: list[int], cpu, update: int,
                   stats: dict[str, list[float]]) -> None:
    """One optimizer step on the records ``part`` of ``batch``: a forward + backward per micro-batch (gradients
    accumulate), the gradients clipped, the step; its statistics appended to ``stats``."""
    mb = make_minibatch(cfg, dist, batch, part)
    micro = micro_batches(learner.forward, mb.records, cfg)
    learner.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    n_local = max(1, int(mb.token_ends[-1]))
    for j, idx in enumerate(micro):
        sync = not dist.enabled or j == len(micro) - 1  # DDP: only the last backward all-reduces
        with (learner.train_model.no_sync() if not sync else contextlib.nullcontext()), cpu("actor"):
            losses, share = micro_batch_backward(cfg, dist, learner, mb, idx, n_local, sums)
        for k, v in losses.items():  # loss terms are partial sums; diagnostics are means
            w = share if k in ("approx_kl", "clipfrac") else 1.0
            sums[k] = sums.get(k, 0.0) + float(v.detach()) * w
    if mb.forward_logp is not None:  # the first minibatch's old / reference log-probs, for the later epochs
        for k, i in enumerate(part):
            values = mb.forward_logp[mb.token_ends[k]:mb.token_ends[k + 1]].tolist()
            if mb.old_from_forward:
                batch.old_logps[i] = values
            if mb.ref_from_forward:
                batch.ref_logps[i] = values
    with cpu("optimizer"):
        grad_norm, value_grad_norm = clip_gradients(learner.lm_params, learner.head, cfg.grad_clip)
        check_finite_step(grad_norm + (value_grad_norm or 0.0), f"update {update + 1}")
        learner.optimizer.step()
    if learner.head:
        stats.setdefault("value_grad_norm", []).append(value_grad_norm)
    for k, v in sums.items():
        stats.setdefault(k, []).append(v)
    stats.setdefault("grad_norm", []).append(float(grad_norm))
    stats.setdefault("micro_batches", []).append(float(len(micro)))


def micro_batch_backward(cfg, dist, learner: Learner, mb: Minibatch, idx: list[int], n_local: int,
                         sums: dict[str, float]) -> tuple[dict[str, torch.Tensor], float]:
    """Forward and backward of the micro-batch ``idx`` of ``mb``; returns its loss terms and its share of the
    minibatch's tokens (the loss hook's metrics are added to ``sums``, weighted by that share)."""
    sub = [mb.records[i] for i in idx]
    tix = torch.tensor([t for i in idx for t in range(mb.token_ends[i], mb.token_ends[i + 1])],
                       dtype=torch.long, device=dist.device)
    share = len(tix) / n_local
    actor_out = learner.forward(learner.train_model, sub, temperature=learner.temperature, entropy=True)
    actor_out.token_denom = mb.denom_all
    own = actor_out.logp.detach()  # this forward's log-probs at the policy before the minibatch's step
    if mb.forward_logp is not None:
        mb.forward_logp[tix] = own
    old_logp = own if mb.old_from_forward else mb.old_logp[tix]
    kw: dict[str, Any] = {}
    if cfg.uses_value:
        kw = {"values": actor_out.values, "old_values": flat_tokens(sub, "values").to(dist.device),
              "returns": flat_tokens(sub, "token_returns").to(dist.device), "clip_vf": cfg.clip_vf,
              "vf_coef": cfg.vf_coef}
    if mb.ref_logp is not None or mb.ref_from_forward:
        kw["ref_logp"] = own if mb.ref_from_forward else mb.ref_logp[tix]
        kw["kl_coef"] = cfg.kl_coef
    losses = ppo_loss(actor_out.logp, old_logp, mb.adv[tix], clip=cfg.clip,
                      entropy=actor_out.entropy, ent_coef=cfg.ent_coef,
                      mask=mb.mask[tix] if mb.mask is not None else None,
                      pg_mask=mb.pg_mask[tix] if mb.pg_mask is not None else None,
                      denom=mb.denom, pg_denom=mb.pg_denom, **kw)
    if learner.extra_loss is not None:
        term, extra_stats = learner.extra_loss(sub, actor_out)
        losses["loss"] = losses["loss"] + term
        for k, v in extra_stats.items():  # per-token means: weighted by the micro-batch
            sums[k] = sums.get(k, 0.0) + float(v) * share
    losses["loss"].backward()
    return losses, share


__all__ = ["ppo_loss", "clip_gradients", "UpdateBatch", "Learner", "ppo_update", "Minibatch", "make_minibatch",
           "minibatch_step", "micro_batch_backward"]
