"""Seed-level inference for training experiments: every arm is trained from several training seeds and evaluated
on one fixed set of evaluation episodes, so a score is a ``[seeds, episodes]`` array.

What varies between reruns of an experiment is, first of all, the training seed: two seeds of one arm can end
several points of F1 apart. Averaging the seeds first and then taking a standard error over the episodes leaves
that variance out (with a large seed effect, far too small an error). Here the unit of inference is the
training seed:

- the **gain** of an arm, seed ``s``: ``g_s = mean_e(end[s, e] - start[e])`` (paired on the same evaluation
  episodes; ``start`` is the common starting model's score, or one per seed);
- a **comparison** of arms ``a`` and ``b``: ``d_s = mean_e(a[s, e] - b[s, e])``, paired by training seed (the
  arms' seed ``s`` share their rollout seeds and their start) and by episode;
- the **headline**: ``mean_s g_s`` with the standard error across seeds ``sd_s(g_s) / sqrt(n)`` (``ddof=1``),
  ``t = mean / se`` on ``n - 1`` degrees of freedom, its two-sided p-value and a t confidence interval
  (:func:`seed_level`);
- a **two-level bootstrap** (:func:`two_level_bootstrap`) resamples training seeds and, inside, evaluation
  episodes (the same resampled episodes for every seed, keeping the pairing): its interval also carries the
  sampling error of the fixed evaluation set, which the seed-level t holds fixed.

:func:`arm_summary` and :func:`compare_arms` apply these to the experiment's evaluation frames (one per training
seed, rows ``seed, f1, em`` on the same evaluation episodes); :func:`paired_stats` compares two models on one
evaluation set (no training seeds); :func:`standard_error` is the one standard error of a mean.

Pure numpy/scipy (frames are read, pandas is not imported); no torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

INFERENCE = ("seed-level: per training seed the paired gain over the same evaluation episodes; mean over seeds, "
             "SE across seeds, t on n_seeds - 1 degrees of freedom")


def _matrix(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] < 1 or a.shape[0] < 1:
        raise ValueError(f"{name} must be a [seeds, episodes] array, got shape {np.shape(x)}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds a value that is not finite")
    return a


def standard_error(values) -> float:
    """``sd(ddof=1) / sqrt(n)`` of ``values``: the sampling error of their mean; nan for fewer than 2 values."""
    v = np.asarray(values, dtype=np.float64).ravel()
    return float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan


def seed_level(per_seed: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Inference over seeds from one value per training seed: ``mean``, ``se`` (``sd(ddof=1)/sqrt(n)``), ``t``,
    ``df = n - 1``, two-sided ``p``, the t interval ``ci_low``/``ci_high`` at ``confidence``, ``n_seeds``,
    ``seed_sd``. One seed: ``se``, ``t``, ``p`` and the interval are nan (no spread to measure). A zero ``se``
    with a nonzero mean gives ``t = ±inf``, ``p = 0``."""
    from scipy import stats

    g = np.asarray(per_seed, dtype=np.float64).ravel()
    if g.size < 1 or not np.isfinite(g).all():
        raise ValueError(f"seed_level needs >= 1 finite value per training seed, got {list(g)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n, mean = int(g.size), float(g.mean())
    out = {"mean": mean, "n_seeds": n, "df": n - 1, "se": math.nan, "seed_sd": math.nan, "t": math.nan,
           "p": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    if n < 2:
        return out
    sd = float(g.std(ddof=1))
    se = sd / math.sqrt(n)
    out.update(se=se, seed_sd=sd)
    if se > 0:
        t = mean / se
        q = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
        out.update(t=t, p=float(2 * stats.t.sf(abs(t), n - 1)), ci_low=mean - q * se, ci_high=mean + q * se)
    else:
        out.update(t=math.copysign(math.inf, mean) if mean else math.nan, p=0.0 if mean else math.nan,
                   ci_low=mean, ci_high=mean)
    return out


def per_seed_gains(start, ends) -> np.ndarray:
    """``g_s = mean_e(ends[s, e] - start[e])``: ``start`` ``[episodes]`` (one start for every seed) or
    ``[seeds, episodes]``; ``ends`` ``[seeds, episodes]``."""
    e = _matrix(ends, "ends")
    s = _matrix(start, "start")
    if s.shape[1] != e.shape[1] or s.shape[0] not in (1, e.shape[0]):
        raise ValueError(f"start {s.shape} and ends {e.shape} are not scores of the same evaluation episodes")
    return (e - s).mean(axis=1)


def paired_gain(start, ends, confidence: float = 0.95) -> dict[str, float]:
    """Seed-level inference on an arm's gain (:func:`per_seed_gains`, :func:`seed_level`)."""
    return seed_level(per_seed_gains(start, ends), confidence)


def paired_difference(a, b, confidence: float = 0.95) -> dict[str, float]:
    """Seed-level inference on arm ``a`` minus arm ``b``, paired by training seed (row ``s`` of both) and by
    evaluation episode (column ``e``): ``d_s = mean_e(a[s, e] - b[s, e])``."""
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"arms to compare need the same [seeds, episodes] shape, got {a.shape} and {b.shape}")
    return seed_level((a - b).mean(axis=1), confidence)


def two_level_bootstrap(diff, n_boot: int = 4000, seed: int = 0, confidence: float = 0.95) -> dict[str, float]:
    """Percentile interval of ``mean(diff)`` (``diff``: ``[seeds, episodes]`` paired differences) under a
    two-level bootstrap: each replicate draws ``seeds`` training seeds with replacement and ``episodes``
    evaluation episodes with replacement (the same episodes for every seed). Returns ``mean``, ``boot_se``
    (sd of the replicates), ``boot_low``, ``boot_high``; with one seed only the episodes are resampled."""
    d = _matrix(diff, "diff")
    n_seeds, n_eps = d.shape
    rng = np.random.default_rng(seed)
    seed_w = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=n_boot) if n_seeds > 1 \
        else np.ones((n_boot, 1))
    ep_w = rng.multinomial(n_eps, np.full(n_eps, 1 / n_eps), size=n_boot)  # [B, E] counts
    per_seed = d @ ep_w.T / n_eps  # [S, B]: each seed's mean over the replicate's episodes
    reps = (seed_w * per_seed.T).sum(axis=1) / n_seeds
    alpha = (1 - confidence) / 2
    return {"mean": float(d.mean()), "boot_se": float(reps.std(ddof=1)),
            "boot_low": float(np.quantile(reps, alpha)), "boot_high": float(np.quantile(reps, 1 - alpha))}


def episode_level_se(start, ends) -> float:
    """The standard error that averages the seeds first and pairs over episodes only:
    ``sd_e(mean_s(ends[s, e]) - start[e]) / sqrt(episodes)``. Kept to show what it leaves out; it is not an
    error bar for a claim about training."""
    e, s = _matrix(ends, "ends"), _matrix(start, "start")
    return standard_error(e.mean(axis=0) - s.mean(axis=0))


def paired_stats(start: Sequence[float], end: Sequence[float]) -> dict[str, float]:
    """Mean paired difference ``end - start`` over the same episodes, its standard error ``sd(ddof=1)/sqrt(n)``
    and ``z = mean / se`` (``se`` 0 -> ``z`` inf or nan). One model against another on one evaluation set (the
    teacher's or the start's F1 and its sampling error); claims about training use the seed-level functions above."""
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    if start.shape != end.shape or start.ndim != 1 or len(start) < 2:
        raise ValueError(f"paired_stats needs two equal-length 1-D series of >= 2 values, got {start.shape} and "
                         f"{end.shape}")
    d = end - start
    se = standard_error(d)
    mean = float(d.mean())
    return {"mean": mean, "se": se, "z": mean / se if se > 0 else (math.inf if mean else math.nan), "n": len(d)}


def _frame_scores(frames: Sequence[pd.DataFrame], metric: str, seeds: Sequence[int]) -> np.ndarray:
    for f in frames:
        if list(f["seed"]) != list(seeds):
            raise ValueError("start and end evaluations are not on the same evaluation episodes")
    return np.stack([f[metric].to_numpy(float) for f in frames])  # [training seeds, episodes]


def arm_summary(start: pd.DataFrame, ends: Sequence[pd.DataFrame], prefix: str = "") -> dict[str, float]:
    """Start vs end of one arm, with seed-level inference (:func:`paired_gain`, :func:`two_level_bootstrap`). Every
    frame has ``seed, f1, em`` rows on the same evaluation episodes (checked). Keys ``{prefix}gain_f1``,
    ``..._se`` (across training seeds), ``_t``, ``_df``, ``_p``, ``_ci_low/high`` (t), ``_boot_low/high``
    (two-level bootstrap), ``_episode_se`` (seeds averaged first: what that leaves out), ``end_f1_seed_sd`` ..."""
    out: dict[str, float] = {}
    for metric in ("f1", "em"):
        s0 = start[metric].to_numpy(float)
        ends_m = _frame_scores(ends, metric, list(start["seed"]))
        g = paired_gain(s0, ends_m)
        boot = two_level_bootstrap(ends_m - s0[None, :])
        out.update({f"{prefix}start_{metric}": float(s0.mean()), f"{prefix}end_{metric}": float(ends_m.mean()),
                    f"{prefix}end_{metric}_seed_sd": float(ends_m.mean(axis=1).std(ddof=1)) if len(ends) > 1
                    else math.nan,
                    f"{prefix}gain_{metric}": g["mean"], f"{prefix}gain_{metric}_se": g["se"],
                    f"{prefix}gain_{metric}_t": g["t"], f"{prefix}gain_{metric}_df": g["df"],
                    f"{prefix}gain_{metric}_p": g["p"], f"{prefix}gain_{metric}_ci_low": g["ci_low"],
                    f"{prefix}gain_{metric}_ci_high": g["ci_high"], f"{prefix}gain_{metric}_boot_low": boot["boot_low"],
                    f"{prefix}gain_{metric}_boot_high": boot["boot_high"],
                    f"{prefix}gain_{metric}_episode_se": episode_level_se(s0, ends_m)})
    return out


def compare_arms(a: Sequence[pd.DataFrame], b: Sequence[pd.DataFrame], metric: str = "f1") -> dict[str, float]:
    """End of arm ``a`` minus end of arm ``b``, paired by training seed (the i-th frame of each) and episode;
    seed-level inference (:func:`paired_difference`) and the two-level bootstrap."""
    if len(a) != len(b):
        raise ValueError(f"arms to compare need the same training seeds, got {len(a)} and {len(b)}")
    seeds = list(a[0]["seed"])
    ea, eb = _frame_scores(a, metric, seeds), _frame_scores(b, metric, seeds)
    # An arm that ends at 0 (a collapsed control) is below any positive arm by an unbounded ratio: inf, not
    # "undefined"; only 0 / 0 has no ratio.
    ratio = ea.mean() / eb.mean() if eb.mean() > 0 else (math.inf if ea.mean() > 0 else math.nan)
    return {**paired_difference(ea, eb), **two_level_bootstrap(ea - eb), "ratio": float(ratio)}


__all__ = ["INFERENCE", "standard_error", "seed_level", "per_seed_gains", "paired_gain", "paired_difference",
           "two_level_bootstrap", "episode_level_se", "paired_stats", "arm_summary", "compare_arms"]
