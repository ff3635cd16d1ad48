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
  (:func:`seed_level`); per-seed values with no spread (every seed the same difference) get no t: ``t``, its p
  and its interval are nan and ``zero_variance`` is True;
- an **exact sign-flip p** (:func:`sign_flip_test`): under "no difference" each seed's paired difference is as
  likely negated, so the p-value counts the sign flips whose mean is at least as far from 0 as the observed one;
  it assumes no normality, and with ``n`` seeds it cannot go below ``2 / 2**n`` (0.0625 with 5 seeds, 0.002
  with 10), which is reported beside it;
- a **two-level bootstrap** (:func:`two_level_bootstrap`) resamples training seeds and, inside, evaluation
  episodes (the same resampled episodes for every seed, keeping the pairing): its interval also carries the
  sampling error of the fixed evaluation set, which the seed-level t holds fixed;
- the **verdict** (:func:`verdict`): met only where the exact p is at most 0.05 **and** the bootstrap interval lies
  above 0; "inconclusive" where the interval holds the effect the claim predicts; beside it the **minimum
  detectable effect** at 80% power (:func:`minimum_detectable_effect`) and the seeds a given effect needs
  (:func:`seeds_for_power`).

:func:`arm_summary` and :func:`compare_arms` apply these to the experiment's evaluation frames (one per training
seed, rows ``seed, f1, em`` on the same evaluation episodes); :func:`paired_stats` compares two models on one
evaluation set (no training seeds); :func:`standard_error` is the one standard error of a mean.

Pure numpy/scipy (frames are read, pandas is not imported); no torch.
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

INFERENCE = ("seed-level: per training seed the paired difference over the same evaluation episodes; mean over "
             "seeds, SE across seeds, t on n_seeds - 1 degrees of freedom (none where the seeds do not differ), an "
             "exact sign-flip p over the seeds, and a 95% interval from a two-level bootstrap (training seeds x "
             "evaluation episodes)")
#: Up to this many seeds :func:`sign_flip_test` enumerates every sign flip (2**16 = 65,536 of them, well under a
#: second); beyond, a seeded Monte Carlo of :data:`SIGN_FLIP_DRAWS` flips. scipy's enumeration of 2**20 flips takes
#: ~6 s on a 2-core CPU, and a report computes a few dozen of these p-values.
SIGN_FLIP_EXACT_MAX = 16
SIGN_FLIP_DRAWS = 2 ** 16
#: Per-seed values whose range is below this fraction of their largest magnitude (or of 1) count as equal:
#: ``b + 0.05`` minus ``b`` differs from 0.05 by rounding, and its t would be ~1e15, not a measurement.
_ZERO_SPREAD = 1e-12


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


def sign_flip_test(per_seed_values: Sequence[float], max_exact: int = SIGN_FLIP_EXACT_MAX,
                   draws: int = SIGN_FLIP_DRAWS, seed: int = 0) -> dict[str, float]:
    """Two-sided sign-flip (permutation) test of "the per-seed paired differences are symmetric about 0": the
    statistic is their mean, and ``p`` is the share of the ``2**n`` sign assignments whose mean is at least as far
    from 0 as the observed one (ties count; scipy's ``permutation_test``, ``permutation_type="samples"``).

    For ``n <= max_exact`` (or ``2**n <= draws``) every assignment is enumerated: the p is exact, ``draws`` is 0 and ``p_min`` is
    ``2 / 2**n``, the smallest p any data of ``n`` seeds can give (the observed signs and their negation always
    count). Beyond, ``draws`` sign assignments are drawn at random from ``seed`` (reproducible) and the p is
    scipy's Monte Carlo one, ``2 * (1 + hits on the observed side) / (1 + draws)`` (valid: the observed
    assignment counts once), so ``p_min`` is ``2 / (1 + draws)`` and the returned ``draws`` says how many were
    drawn. A single seed, or differences that are
    all 0, give ``p = 1``. Returns ``p``, ``p_min``, ``draws`` and ``n``."""
    from scipy import stats

    d = np.asarray(per_seed_values, dtype=np.float64).ravel()
    if d.size < 1 or not np.isfinite(d).all():
        raise ValueError(f"sign_flip_test needs >= 1 finite value per training seed, got {list(d)}")
    if max_exact < 1 or draws < 1:
        raise ValueError(f"sign_flip_test needs max_exact >= 1 and draws >= 1, got {max_exact} and {draws}")
    n = int(d.size)
    if n == 1:  # one value and its negation: both as far from 0
        return {"p": 1.0, "p_min": 1.0, "draws": 0, "n": 1}
    exact = n <= max_exact or 2 ** n <= draws  # enumerating is then no more work than drawing
    # scipy enumerates every assignment when n_resamples >= 2**n, and otherwise draws n_resamples of them
    n_resamples = math.inf if exact else draws
    generator = np.random.default_rng(seed)
    rng_kw = "rng" if "rng" in inspect.signature(stats.permutation_test).parameters else "random_state"
    res = stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                 vectorized=True, n_resamples=n_resamples, alternative="two-sided",
                                 **{rng_kw: generator})
    return {"p": float(min(1.0, res.pvalue)), "p_min": min(1.0, 2.0 / (2 ** n if exact else 1 + draws)),
            "draws": 0 if exact else int(draws), "n": n}


def seed_level(per_seed: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Inference over seeds from one value per training seed: ``mean``, ``se`` (``sd(ddof=1)/sqrt(n)``), ``t``,
    ``df = n - 1``, two-sided ``p``, the t interval ``ci_low``/``ci_high`` at ``confidence``, ``n_seeds``,
    ``seed_sd``, and the exact sign-flip ``p_exact`` with ``p_exact_min`` (the smallest it can be for these
    seeds) and ``p_exact_draws`` (0: every sign flip enumerated; see :func:`sign_flip_test`).

    One seed: ``se``, ``t``, ``p`` and the interval are nan (no spread to measure). Per-seed values that are all
    equal (``zero_variance`` True; up to rounding): ``se`` and ``seed_sd`` are 0 and ``t``, ``p`` and the t
    interval are nan: a t of a difference without variance is not a number to report (the sign-flip p and the
    two-level bootstrap still measure it)."""
    from scipy import stats

    g = np.asarray(per_seed, dtype=np.float64).ravel()
    if g.size < 1 or not np.isfinite(g).all():
        raise ValueError(f"seed_level needs >= 1 finite value per training seed, got {list(g)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n, mean = int(g.size), float(g.mean())
    flips = sign_flip_test(g)
    out = {"mean": mean, "n_seeds": n, "df": n - 1, "se": math.nan, "seed_sd": math.nan, "t": math.nan,
           "p": math.nan, "ci_low": math.nan, "ci_high": math.nan, "zero_variance": False,
           "p_exact": flips["p"], "p_exact_min": flips["p_min"], "p_exact_draws": flips["draws"]}
    if n < 2:
        return out
    if float(np.ptp(g)) <= _ZERO_SPREAD * max(1.0, float(np.abs(g).max())):
        out.update(se=0.0, seed_sd=0.0, zero_variance=True)
        return out
    sd = float(g.std(ddof=1))
    se = sd / math.sqrt(n)
    t = mean / se
    q = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    out.update(se=se, seed_sd=sd, t=t, p=float(2 * stats.t.sf(abs(t), n - 1)), ci_low=mean - q * se,
               ci_high=mean + q * se)
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
    """Seed-level inference on an arm's gain (:func:`per_seed_gains`, :func:`seed_level`: t, the exact
    sign-flip p, the zero-variance flag)."""
    return seed_level(per_seed_gains(start, ends), confidence)


def paired_difference(a, b, confidence: float = 0.95) -> dict[str, float]:
    """Seed-level inference on arm ``a`` minus arm ``b``, paired by training seed (row ``s`` of both) and by
    evaluation episode (column ``e``): ``d_s = mean_e(a[s, e] - b[s, e])`` (:func:`seed_level`: t, the exact
    sign-flip p, the zero-variance flag)."""
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"arms to compare need the same [seeds, episodes] shape, got {a.shape} and {b.shape}")
    return seed_level((a - b).mean(axis=1), confidence)


def two_level_bootstrap(diff, n_boot: int = 4000, seed: int = 0, confidence: float = 0.95) -> dict[str, float]:
    """Percentile interval of ``mean(diff)`` (``diff``: ``[seeds, episodes]`` paired differences) under a
    two-level bootstrap: each replicate draws ``seeds`` training seeds with replacement and ``episodes``
    evaluation episodes with replacement, the same episodes for every seed (the seeds were evaluated on the same
    episodes, so an episode's difficulty is shared and resampled once), and takes the mean over the drawn seeds
    of each drawn seed's mean over the drawn episodes. Returns ``mean``, ``boot_se`` (sd of the replicates),
    ``boot_low``, ``boot_high`` and ``boot_draws`` (``n_boot``); the same ``seed`` gives the same interval.
    With one seed only the episodes are resampled; values that are all equal give the degenerate interval at
    that value."""
    d = _matrix(diff, "diff")
    if n_boot < 2:
        raise ValueError(f"n_boot must be >= 2, got {n_boot}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n_seeds, n_eps = d.shape
    rng = np.random.default_rng(seed)
    seed_w = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=n_boot) if n_seeds > 1 \
        else np.ones((n_boot, 1))  # [B, S] how often each seed is drawn
    ep_w = rng.multinomial(n_eps, np.full(n_eps, 1 / n_eps), size=n_boot)  # [B, E] counts
    per_seed = d @ ep_w.T / n_eps  # [S, B]: each seed's mean over the replicate's episodes
    reps = (seed_w * per_seed.T).sum(axis=1) / n_seeds
    alpha = (1 - confidence) / 2
    return {"mean": float(d.mean()), "boot_se": float(reps.std(ddof=1)),
            "boot_low": float(np.quantile(reps, alpha)), "boot_high": float(np.quantile(reps, 1 - alpha)),
            "boot_draws": int(n_boot)}


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


#: The decision rule of every claim (issue 61, pre-registered in docs/results.md): a paired difference is **met**
#: when it is above 0 with its exact sign-flip p at most :data:`ALPHA` **and** its two-level bootstrap 95% lower
#: bound above 0; either alone lets through more than the nominal rate of false claims (the bootstrap alone: 4.3%
#: at 10 seeds and 7.3% at 5 under simulated nulls, against a nominal 2.5% one-sided).
ALPHA = 0.05
#: The power a minimum detectable effect is stated at.
POWER = 0.8
#: What a verdict can be (:func:`verdict`).
VERDICTS = ("met", "reversed", "inconclusive", "not met")


def is_finite_number(v) -> bool:
    """A real number (not a bool) that is finite: a figure a verdict can be read from (nan or a missing cell is not)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def verdict(diff: float, boot_low: float, boot_high: float, p_exact: float, expected: float = math.nan,
            alpha: float = ALPHA) -> str:
    """The verdict on a paired difference ``a - b`` claimed positive (:data:`VERDICTS`):

    - ``"met"``: ``diff > 0``, the exact sign-flip ``p_exact <= alpha`` and the bootstrap interval above 0;
    - ``"reversed"``: the same rule the other way (``diff < 0``, ``p_exact <= alpha``, interval below 0);
    - ``"inconclusive"``: neither, and the interval holds the ``expected`` effect (the size the claim predicts, e.g.
      the paper's), so the data cannot tell that effect from none; or the interval excludes 0 while the exact test
      cannot (too few seeds: with 5 no p goes below 0.0625);
    - ``"not met"``: the interval holds 0 and excludes the expected effect (a null with the power to see it), or no
      expected effect is given.

    A missing figure (nan) is never met or reversed."""
    finite = is_finite_number
    if not (finite(diff) and finite(boot_low) and finite(boot_high)):
        return "not met"
    significant = finite(p_exact) and p_exact <= alpha
    if diff > 0 and boot_low > 0 and significant:
        return "met"
    if diff < 0 and boot_high < 0 and significant:
        return "reversed"
    if finite(expected) and boot_low <= expected <= boot_high:
        return "inconclusive"
    if boot_low > 0 or boot_high < 0:
        return "inconclusive"
    return "not met"


def detection_power(effect: float, seed_sd: float, n_seeds: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided seed-level t test at ``alpha`` to see a true mean difference ``effect`` with a
    per-seed standard deviation ``seed_sd`` over ``n_seeds`` seeds (the noncentral t; the exact sign-flip test
    the verdict uses has about this power where the per-seed differences are near normal)."""
    from scipy import stats

    if n_seeds < 2 or not seed_sd > 0:
        raise ValueError(f"detection_power needs >= 2 seeds and a positive seed sd, got {n_seeds} and {seed_sd}")
    df = n_seeds - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    nc = abs(effect) * math.sqrt(n_seeds) / seed_sd
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    # scipy's noncentral t underflows to nan far in a tail: there the tail holds no mass (the lower one, for a
    # large nc) or all of it (the upper one)
    lower = lower if math.isfinite(lower) else 0.0
    upper = upper if math.isfinite(upper) else (1.0 if nc > crit else 0.0)
    return min(1.0, upper + lower)


def minimum_detectable_effect(seed_sd: float, n_seeds: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true difference that ``n_seeds`` training seeds with per-seed sd ``seed_sd`` detect with
    probability ``power`` (:func:`detection_power`); nan where it cannot be computed (fewer than 2 seeds, no
    spread)."""
    from scipy.optimize import brentq

    if n_seeds < 2 or not (math.isfinite(seed_sd) and seed_sd > 0):
        return math.nan
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    hi = seed_sd
    while detection_power(hi, seed_sd, n_seeds, alpha) < power:
        hi *= 2
    return float(brentq(lambda e: detection_power(e, seed_sd, n_seeds, alpha) - power, 0.0, hi, xtol=1e-9 * hi))


def seeds_for_power(effect: float, seed_sd: float, alpha: float = ALPHA, power: float = POWER,
                    at_least: int = 16, at_most: int = 100_000) -> int:
    """The number of training seeds whose :func:`minimum_detectable_effect` is at most ``effect`` (and no fewer
    than ``at_least``: 16 for a headline); ``at_most`` bounds the search (returned where even it is too few)."""
    if not effect > 0 or not seed_sd > 0:
        raise ValueError(f"seeds_for_power needs a positive effect and seed sd, got {effect} and {seed_sd}")
    def enough(n: int) -> bool:
        return detection_power(effect, seed_sd, n, alpha) >= power

    low = max(2, at_least)
    if enough(low):
        return low
    high = low
    while high < at_most and not enough(high):  # the power rises with the seeds: double, then bisect
        low, high = high, min(2 * high, at_most)
    if not enough(high):
        return at_most
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def _frame_scores(frames: Sequence[pd.DataFrame], metric: str, seeds: Sequence[int]) -> np.ndarray:
    for f in frames:
        if list(f["seed"]) != list(seeds):
            raise ValueError("start and end evaluations are not on the same evaluation episodes")
    return np.stack([f[metric].to_numpy(float) for f in frames])  # [training seeds, episodes]


def arm_summary(start: pd.DataFrame, ends: Sequence[pd.DataFrame], prefix: str = "") -> dict[str, float]:
    """Start vs end of one arm, with seed-level inference (:func:`paired_gain`, :func:`two_level_bootstrap`). Every
    frame has ``seed, f1, em`` rows on the same evaluation episodes (checked). Keys ``{prefix}gain_f1``,
    ``..._se`` (across training seeds), ``_t``, ``_df``, ``_p``, ``_ci_low/high`` (t; nan where
    ``_zero_variance``), ``_p_exact``, ``_p_exact_min`` (exact sign-flip), ``_boot_low/high``, ``_boot_se``
    (two-level bootstrap), ``_episode_se`` (seeds averaged first: what that leaves out), ``end_f1_seed_sd`` ..."""
    out: dict[str, float] = {}
    for metric in ("f1", "em"):
        s0 = start[metric].to_numpy(float)
        ends_m = _frame_scores(ends, metric, list(start["seed"]))
        g = paired_gain(s0, ends_m)
        boot = two_level_bootstrap(ends_m - s0[None, :])
        gain = f"{prefix}gain_{metric}"
        out.update({f"{prefix}start_{metric}": float(s0.mean()), f"{prefix}end_{metric}": float(ends_m.mean()),
                    f"{prefix}end_{metric}_seed_sd": float(ends_m.mean(axis=1).std(ddof=1)) if len(ends) > 1
                    else math.nan,
                    gain: g["mean"], f"{gain}_se": g["se"], f"{gain}_t": g["t"], f"{gain}_df": g["df"],
                    f"{gain}_p": g["p"], f"{gain}_ci_low": g["ci_low"], f"{gain}_ci_high": g["ci_high"],
                    f"{gain}_zero_variance": g["zero_variance"], f"{gain}_p_exact": g["p_exact"],
                    f"{gain}_p_exact_min": g["p_exact_min"], f"{gain}_boot_low": boot["boot_low"],
                    f"{gain}_boot_high": boot["boot_high"], f"{gain}_boot_se": boot["boot_se"],
                    f"{gain}_episode_se": episode_level_se(s0, ends_m)})
    return out


def compare_arms(a: Sequence[pd.DataFrame], b: Sequence[pd.DataFrame], metric: str = "f1") -> dict[str, float]:
    """End of arm ``a`` minus end of arm ``b``, paired by training seed (the i-th frame of each) and episode:
    seed-level inference (:func:`paired_difference`: ``mean``, ``se``, ``t``, ``df``, ``p``, ``ci_low/high``,
    ``zero_variance``, ``p_exact``, ``p_exact_min``, ``p_exact_draws``), the two-level bootstrap (``boot_low/high``,
    ``boot_se``) and ``ratio``, end F1 a / b (information, never a verdict)."""
    if len(a) != len(b):
        raise ValueError(f"arms to compare need the same training seeds, got {len(a)} and {len(b)}")
    seeds = list(a[0]["seed"])
    ea, eb = _frame_scores(a, metric, seeds), _frame_scores(b, metric, seeds)
    # An arm that ends at 0 (a collapsed control) is below any positive arm by an unbounded ratio: inf, not
    # "undefined"; only 0 / 0 has no ratio.
    ratio = ea.mean() / eb.mean() if eb.mean() > 0 else (math.inf if ea.mean() > 0 else math.nan)
    paired = paired_difference(ea, eb)
    mde = minimum_detectable_effect(paired["seed_sd"], paired["n_seeds"])
    return {**paired, **two_level_bootstrap(ea - eb), "ratio": float(ratio), "mde": mde}


__all__ = ["INFERENCE", "SIGN_FLIP_EXACT_MAX", "SIGN_FLIP_DRAWS", "standard_error", "sign_flip_test", "seed_level",
           "per_seed_gains", "paired_gain", "paired_difference", "two_level_bootstrap", "episode_level_se",
           "paired_stats", "arm_summary", "compare_arms", "is_finite_number", "ALPHA", "POWER", "VERDICTS", "verdict",
           "detection_power", "minimum_detectable_effect", "seeds_for_power"]
