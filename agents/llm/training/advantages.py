"""Credit assignment of the PPO/GRPO trainer (:func:`agents.llm.training.ppo.train_rl`): how the terminal reward reaches
every action token of an episode. PPO: token-level GAE over the episode's concatenated action tokens
(:func:`episode_gae`); GRPO: the trajectory's return against its group's (:func:`grpo_assign`), exactly 0 in a
group whose returns are all equal (:func:`zero_variance_groups`). See :mod:`agents.llm.training.ppo`'s module doc.

:func:`assign_advantages` and :func:`advantage_moments` are the loop's "advantages" step; the rest is pure math.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agents.llm.records.invocation import InvocationRecord


def gae(rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0, lam: float = 0.95,
        last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """Generalised advantage estimation over one token sequence; returns ``(advantages, returns)``.

    ``delta_j = r_j + gamma v_{j+1} - v_j`` (``v_T = last_value``), ``A_j = delta_j + gamma lam A_{j+1}``,
    ``R_j = A_j + v_j``."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for j in reversed(range(n)):
        next_value = values[j + 1] if j + 1 < n else last_value
        delta = rewards[j] + gamma * next_value - values[j]
        running = delta + gamma * lam * running
        adv[j] = running
    return adv, [a + v for a, v in zip(adv, values)]


def episode_gae(records: Sequence[InvocationRecord], values: Sequence[Sequence[float]], gamma: float = 1.0,
                lam: float = 0.95) -> None:
    """PPO credit: GAE over the concatenated action tokens of one episode (records in turn order); the env
    reward of each invocation sits on its last action token. Sets ``token_advantages``, ``token_returns`` and
    ``values`` (per response token; non-action tokens get 0 advantage)."""
    flat_r, flat_v, where = [], [], []
    for k, (rec, vals) in enumerate(zip(records, values)):
        action = [t for t, m in enumerate(rec.action_mask) if m]
        if len(vals) != len(action):
            raise ValueError(f"record {rec.key}: {len(vals)} values for {len(action)} action tokens")
        for i, t in enumerate(action):
            flat_r.append(rec.reward if i == len(action) - 1 else 0.0)
            flat_v.append(float(vals[i]))
            where.append((k, t))
        if not action and rec.reward:  # an empty response still carries its reward to the previous token
            if flat_r:
                flat_r[-1] += rec.reward
    adv, ret = gae(flat_r, flat_v, gamma, lam)
    for rec in records:
        n = len(rec.response_ids)
        rec.token_advantages, rec.token_returns, rec.values = [0.0] * n, [0.0] * n, [0.0] * n
    for (k, t), a, r, v in zip(where, adv, ret, flat_v):
        records[k].token_advantages[t] = a
        records[k].token_returns[t] = r
        records[k].values[t] = v


def group_advantages(returns: Sequence[float], groups: Sequence[Any], std_norm: bool = True,
                     eps: float = 1e-6, std_floor: float = 0.0) -> list[float]:
    """GRPO: ``(R_i - mean_g) / (max(std_g, std_floor) + eps)`` per group g (population std), or
    ``R_i - mean_g``."""
    returns = np.asarray(returns, dtype=np.float64)
    out = np.zeros_like(returns)
    keys = list(groups)
    for g in dict.fromkeys(keys):
        idx = np.array([i for i, k in enumerate(keys) if k == g])
        centred = returns[idx] - returns[idx].mean()
        out[idx] = centred / (max(returns[idx].std(), std_floor) + eps) if std_norm else centred
    return out.tolist()


def zero_variance_groups(returns: Sequence[float], groups: Sequence[Any], tol: float = 1e-9) -> set:
    """The groups whose returns are all equal (within ``tol``): no relative signal to learn from."""
    by_group: dict[Any, list[float]] = {}
    for r, g in zip(returns, groups):
        by_group.setdefault(g, []).append(float(r))
    return {g for g, rs in by_group.items() if max(rs) - min(rs) <= tol}


def grpo_assign(episodes, std_norm: bool = True, std_floor: float = 0.0) -> None:
    """Trajectory advantage of each episode, broadcast to all action tokens of its invocations."""
    adv = group_advantages([ep.reward for ep in episodes], [ep.group for ep in episodes], std_norm,
                           std_floor=std_floor)
    for ep, a in zip(episodes, adv):
        for rec in ep.records:
            rec.advantage = float(a)
            rec.token_advantages = [float(a) if m else 0.0 for m in rec.action_mask]


def assign_advantages(cfg, episodes, values: Sequence[Sequence[float]] | None) -> set:
    """The advantages of one update's ``episodes`` (set on their records): PPO's GAE per episode from ``values``
    (per record, the old values at its action tokens, in ``records_of`` order), or GRPO's group advantages.
    Returns GRPO's zero-variance groups, whose advantages are set to exactly 0 (``cfg``: a PPOConfig)."""
    if cfg.uses_value:
        k0 = 0
        for ep in episodes:
            episode_gae(ep.records, values[k0:k0 + len(ep.records)], cfg.gamma, cfg.lam)
            k0 += len(ep.records)
    else:
        grpo_assign(episodes, cfg.grpo_std_norm, cfg.adv_std_floor)
    flat = zero_variance_groups([ep.reward for ep in episodes], [ep.group for ep in episodes]) \
        if cfg.algo == "grpo" else set()
    for ep in episodes:  # no relative signal: exactly 0 (not the float noise of r - mean(r))
        if ep.group in flat:
            for rec in ep.records:
                rec.advantage, rec.token_advantages = 0.0, [0.0] * len(rec.response_ids)
    return flat


def advantage_moments(adv_all: torch.Tensor, dist) -> tuple[float, float]:
    """Mean and std of the token advantages ``adv_all`` (PPO's whitening); under DDP over every rank's tokens."""
    adv_mean, adv_std = float(adv_all.mean()), float(adv_all.std()) if len(adv_all) > 1 else 1.0
    if dist.enabled:  # PPO whitens over the global batch (every rank's tokens)
        n, s1, s2 = dist.sum([float(len(adv_all)), float(adv_all.double().sum()),
                              float(adv_all.double().pow(2).sum())])
        adv_mean = s1 / max(n, 1.0)
        adv_std = ((s2 - n * adv_mean ** 2) / (n - 1)) ** 0.5 if n > 1 else 1.0
    return adv_mean, adv_std


__all__ = ["gae", "episode_gae", "group_advantages", "zero_variance_groups", "grpo_assign", "assign_advantages",
           "advantage_moments"]
