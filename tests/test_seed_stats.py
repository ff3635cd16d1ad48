"""Seed-level inference (distill.stats) on hand-computed cases, with a large training-seed effect."""

import math

import numpy as np
import pandas as pd
import pytest

from distill.stats import (arm_summary, compare_arms, episode_level_se, paired_difference, paired_gain,
                           paired_stats, per_seed_gains, seed_level, two_level_bootstrap)

START = np.array([0.2, 0.4, 0.6, 0.8])
# three training seeds whose gains are 0.0, 0.3 and 0.6 on every episode: a pure seed effect
ENDS = START[None, :] + np.array([0.0, 0.3, 0.6])[:, None]


def test_seed_effect_hand_case():
    s = paired_gain(START, ENDS)
    assert s["mean"] == pytest.approx(0.3) and s["n_seeds"] == 3 and s["df"] == 2
    assert s["seed_sd"] == pytest.approx(0.3)  # sd (ddof=1) of (0, 0.3, 0.6)
    assert s["se"] == pytest.approx(0.3 / math.sqrt(3))
    assert s["t"] == pytest.approx(math.sqrt(3))
    # Student t with 2 degrees of freedom has a closed form: P(|T| > t) = 1 - t / sqrt(2 + t^2)
    assert s["p"] == pytest.approx(1 - math.sqrt(3) / math.sqrt(5))
    # its 97.5% quantile: a * sqrt(2 / (1 - a^2)) with a = 0.95
    q = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2))
    assert (s["ci_low"], s["ci_high"]) == (pytest.approx(0.3 - q * s["se"]), pytest.approx(0.3 + q * s["se"]))
    assert s["ci_low"] < 0 < s["ci_high"]  # three seeds, one of them no gain at all: not established
    # the old error (seeds averaged first, SE over episodes) sees a constant gain of 0.3: zero, a "z" of inf
    assert episode_level_se(START, ENDS) == pytest.approx(0.0, abs=1e-12)


def test_comparisons_pair_by_seed_and_episode():
    rng = np.random.default_rng(0)
    seed_effect = np.array([[0.0], [0.4], [-0.3], [0.2], [0.1]])  # shared by both arms of a seed
    b = np.clip(0.5 + seed_effect + rng.normal(0, 0.2, (5, 50)), 0, 1)
    a = b + 0.05  # arm a beats b by exactly 0.05 on every seed and episode
    d = paired_difference(a, b)
    assert d["mean"] == pytest.approx(0.05) and d["se"] == pytest.approx(0.0, abs=1e-12) and d["t"] > 1e10
    # unpaired (seed means of each arm compared as independent samples) the seed effect would swamp it
    assert np.std(a.mean(1), ddof=1) > 0.2
    a2 = b + np.array([0.1, 0.0, 0.1, 0.0, 0.05])[:, None]
    d2 = paired_difference(a2, b)
    g = np.array([0.1, 0.0, 0.1, 0.0, 0.05])
    assert d2["mean"] == pytest.approx(g.mean()) and d2["se"] == pytest.approx(g.std(ddof=1) / math.sqrt(5))
    with pytest.raises(ValueError, match="same"):
        paired_difference(a, b[:, :10])


def test_per_seed_gains_shapes_and_one_seed():
    assert per_seed_gains(START, ENDS).tolist() == pytest.approx([0.0, 0.3, 0.6])
    assert per_seed_gains(ENDS - 0.1, ENDS).tolist() == pytest.approx([0.1, 0.1, 0.1])  # a start per seed
    one = seed_level([0.2])
    assert one["mean"] == 0.2 and math.isnan(one["se"]) and math.isnan(one["p"]) and one["df"] == 0
    with pytest.raises(ValueError, match="same evaluation episodes"):
        per_seed_gains(START[:3], ENDS)
    with pytest.raises(ValueError, match="not finite"):
        per_seed_gains(START, ENDS * np.nan)


def test_two_level_bootstrap_carries_both_levels():
    # pure seed effect: the bootstrap SE is the seed-level one up to the bootstrap's ddof-0 sqrt((n-1)/n)
    diff = ENDS - START
    boot = two_level_bootstrap(diff, n_boot=20000)
    assert boot["boot_se"] == pytest.approx(0.3 / math.sqrt(3) * math.sqrt(2 / 3), rel=0.05)
    assert boot["boot_low"] < 0.3 < boot["boot_high"]
    # no seed effect, episode noise only: seed-level SE 0 (the seeds share the episodes), bootstrap SE not
    rng = np.random.default_rng(1)
    noise = np.tile(rng.normal(0.1, 0.3, 200), (4, 1))
    assert paired_gain(np.zeros(200), noise)["se"] == pytest.approx(0.0, abs=1e-12)
    b2 = two_level_bootstrap(noise, n_boot=4000)
    assert b2["boot_se"] == pytest.approx(noise[0].std() / math.sqrt(200), rel=0.1)


def test_paired_stats_known_numbers():
    s = paired_stats([0, 0, 0, 0], [1, 0, 1, 0])
    assert s["mean"] == 0.5 and s["n"] == 4
    assert s["se"] == pytest.approx(math.sqrt(1 / 3) / 2)  # sd (ddof=1) of (1,0,1,0) is sqrt(1/3)
    assert s["z"] == pytest.approx(0.5 / (math.sqrt(1 / 3) / 2))
    # pairing removes the spread shared by start and end: a constant gain has zero standard error
    same = paired_stats([0.1, 0.9, 0.4], [0.3, 1.1, 0.6])
    assert same["mean"] == pytest.approx(0.2) and same["se"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="equal-length"):
        paired_stats([0, 1], [0, 1, 1])


def test_arm_summary_is_seed_level():
    start = pd.DataFrame({"seed": [7, 8, 9], "f1": [0.0, 0.5, 1.0], "em": [0, 0, 1]})
    ends = [pd.DataFrame({"seed": [7, 8, 9], "f1": [1.0, 0.5, 1.0], "em": [1, 0, 1]}),
            pd.DataFrame({"seed": [7, 8, 9], "f1": [0.0, 1.0, 1.0], "em": [0, 1, 1]})]
    out = arm_summary(start, ends)
    g = np.array([2.5 / 3 - 0.5, 2 / 3 - 0.5])  # per training seed: mean over episodes of end - start
    assert out["gain_f1"] == pytest.approx(g.mean())
    assert out["gain_f1_se"] == pytest.approx(g.std(ddof=1) / math.sqrt(2))  # across training seeds
    assert out["gain_f1_df"] == 1 and out["gain_f1_t"] == pytest.approx(g.mean() / out["gain_f1_se"])
    assert out["end_f1_seed_sd"] == pytest.approx(np.std([2.5 / 3, 2 / 3], ddof=1))
    d = np.array([0.5, 0.25, 0.0])  # the old error: seeds averaged first, SE over episodes
    assert out["gain_f1_episode_se"] == pytest.approx(d.std(ddof=1) / math.sqrt(3))
    with pytest.raises(ValueError, match="same evaluation episodes"):
        arm_summary(start, [ends[0].assign(seed=[7, 8, 10])])
    c = compare_arms(ends, [start, start])  # paired by training seed: the gains again
    assert c["mean"] == pytest.approx(g.mean()) and c["se"] == pytest.approx(out["gain_f1_se"])


def test_ratio_to_an_arm_that_ends_at_zero_is_unbounded_and_zero_over_zero_undefined():
    """A collapsed control (every end F1 0) against a positive arm: ratio inf (the 1.07x target is met when t > 3),
    not NaN; two arms at 0 have no ratio."""
    zero = [pd.DataFrame({"seed": [1, 2], "f1": [0.0, 0.0], "em": [0, 0]}) for _ in range(2)]
    some = [pd.DataFrame({"seed": [1, 2], "f1": [0.5, 1.0], "em": [0, 1]}),
            pd.DataFrame({"seed": [1, 2], "f1": [1.0, 0.5], "em": [1, 0]})]
    assert compare_arms(some, zero)["ratio"] == math.inf
    assert math.isnan(compare_arms(zero, zero)["ratio"])
    assert compare_arms(zero, some)["ratio"] == 0.0
    assert compare_arms(some, some)["ratio"] == pytest.approx(1.0)
