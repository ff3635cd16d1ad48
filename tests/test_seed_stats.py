"""Seed-level inference (distill.stats) on hand-computed cases, with a large training-seed effect: the t over seeds
(none where the seeds do not differ), the exact sign-flip p, the two-level bootstrap."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from distill.stats import (arm_summary, compare_arms, episode_level_se, paired_difference, paired_gain,
                           paired_stats, per_seed_gains, seed_level, sign_flip_test, two_level_bootstrap)

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
    # sign flips of (0, 0.3, 0.6): flipping the 0 changes nothing, so the means are +-0.3 +-0.6 (each twice); 0.9
    # and -0.9 are as far from 0 as the observed: 4 of 8; no 3 seeds give less than 2 of 8
    assert s["p_exact"] == pytest.approx(0.5) and s["p_exact_min"] == pytest.approx(0.25)
    assert s["p_exact_draws"] == 0 and s["zero_variance"] is False
    # the old error (seeds averaged first, SE over episodes) sees a constant gain of 0.3: zero, a "z" of inf
    assert episode_level_se(START, ENDS) == pytest.approx(0.0, abs=1e-12)


def test_comparisons_pair_by_seed_and_episode():
    rng = np.random.default_rng(0)
    seed_effect = np.array([[0.0], [0.4], [-0.3], [0.2], [0.1]])  # shared by both arms of a seed
    b = np.clip(0.5 + seed_effect + rng.normal(0, 0.2, (5, 50)), 0, 1)
    a = b + 0.05  # arm a beats b by exactly 0.05 on every seed and episode
    d = paired_difference(a, b)
    # every seed's difference is 0.05 (up to rounding): no spread, so no t (nan, not inf or ~1e15), and a flag;
    # the sign flips still measure it: all 5 seeds positive, 2 of the 32 flips as extreme
    assert d["mean"] == pytest.approx(0.05) and d["se"] == 0.0 and d["seed_sd"] == 0.0 and d["zero_variance"]
    assert all(math.isnan(d[k]) for k in ("t", "p", "ci_low", "ci_high"))
    assert d["p_exact"] == pytest.approx(2 / 32) and d["df"] == 4
    # unpaired (seed means of each arm compared as independent samples) the seed effect would swamp it
    assert np.std(a.mean(1), ddof=1) > 0.2
    a2 = b + np.array([0.1, 0.0, 0.1, 0.0, 0.05])[:, None]
    d2 = paired_difference(a2, b)
    g = np.array([0.1, 0.0, 0.1, 0.0, 0.05])
    assert d2["mean"] == pytest.approx(g.mean()) and d2["se"] == pytest.approx(g.std(ddof=1) / math.sqrt(5))
    assert not d2["zero_variance"] and d2["t"] == pytest.approx(g.mean() / d2["se"])
    # two zero differences flip onto themselves: 2 ** 2 of the 32 flips give each of +-0.25 (the sum): 8 of 32
    assert d2["p_exact"] == pytest.approx(8 / 32)
    with pytest.raises(ValueError, match="same"):
        paired_difference(a, b[:, :10])


def test_per_seed_gains_shapes_and_one_seed():
    assert per_seed_gains(START, ENDS).tolist() == pytest.approx([0.0, 0.3, 0.6])
    assert per_seed_gains(ENDS - 0.1, ENDS).tolist() == pytest.approx([0.1, 0.1, 0.1])  # a start per seed
    one = seed_level([0.2])
    assert one["mean"] == 0.2 and math.isnan(one["se"]) and math.isnan(one["p"]) and one["df"] == 0
    assert not one["zero_variance"] and one["p_exact"] == 1.0  # one seed: no spread to measure, nothing to flip
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


def _brute_force_sign_flip(values) -> float:
    """Every sign assignment written out: the share whose |sum| reaches the observed one (ties count)."""
    v = np.asarray(values, dtype=float)
    sums = [abs(np.dot(signs, v)) for signs in itertools.product((1, -1), repeat=len(v))]
    return float(np.mean([x >= abs(v.sum()) - 1e-12 for x in sums]))


def test_sign_flip_p_on_hand_counted_cases():
    # five positive seeds: only the observed signs and their negation are as extreme: 2 / 32
    p = sign_flip_test([1, 2, 3, 4, 5])
    assert p == {"p": pytest.approx(0.0625), "p_min": pytest.approx(0.0625), "draws": 0, "n": 5}
    # (1, -2, 3, 4, 5), sum 11: a flipped subset S gives 11 - 2 sum(S), as far from 0 when sum(S) <= 0 ({}, {-2},
    # {1, -2}) or >= 11 ({1, -2, 3, 4, 5}, {1, 3, 4, 5}, {3, 4, 5}): 6 of 32
    assert sign_flip_test([1, -2, 3, 4, 5])["p"] == pytest.approx(6 / 32)
    # ties count: (1, -1, 2), sum 2: |+-1 +-1 +-2| >= 2 for 6 of the 8 assignments
    assert sign_flip_test([1, -1, 2])["p"] == pytest.approx(6 / 8)
    assert sign_flip_test([0.0, 0.0, 0.0])["p"] == 1.0 and sign_flip_test([0.7])["p"] == 1.0
    ten = sign_flip_test(np.full(10, 0.01))  # ten seeds can reach p = 2 / 1024, where five stop at 0.0625
    assert ten["p"] == pytest.approx(2 / 1024) == ten["p_min"]
    rng = np.random.default_rng(3)
    for n in (4, 7, 9):
        v = rng.normal(0.1, 1.0, n)
        assert sign_flip_test(v)["p"] == pytest.approx(_brute_force_sign_flip(v))
    with pytest.raises(ValueError, match="finite value per training seed"):
        sign_flip_test([0.1, math.nan])


def test_sign_flip_beyond_the_exact_limit_is_a_seeded_monte_carlo():
    v = np.random.default_rng(4).normal(0.3, 1.0, 14)
    exact = sign_flip_test(v)
    assert exact["draws"] == 0 and exact["p"] == pytest.approx(_brute_force_sign_flip(v))
    mc = sign_flip_test(v, max_exact=8, draws=10000, seed=1)  # 10,000 of the 16,384 assignments, drawn
    assert mc["draws"] == 10000 and mc["p_min"] == pytest.approx(2 / 10001)
    assert abs(mc["p"] - exact["p"]) < 0.03  # ~4 Monte Carlo standard errors
    assert sign_flip_test(v, max_exact=8, draws=10000, seed=1) == mc  # reproducible by seed
    assert sign_flip_test(v, max_exact=8, draws=10000, seed=2)["p"] != mc["p"]
    # as many draws as assignments: every one is enumerated instead
    assert sign_flip_test(v, max_exact=8, draws=2 ** 14) == exact


def test_two_level_bootstrap_on_known_cases():
    # all differences equal: every replicate is that value, a degenerate interval
    flat = two_level_bootstrap(np.full((4, 30), 0.05), n_boot=500)
    assert flat["boot_low"] == pytest.approx(0.05) and flat["boot_high"] == pytest.approx(0.05)
    assert flat["boot_se"] == pytest.approx(0.0, abs=1e-12) and flat["boot_draws"] == 500
    # a seed-only effect, seeds at 0 and 1 on every episode: a replicate draws the seeds (0,0), (0,1)/(1,0) or
    # (1,1): mean 0, 0.5 or 1 with probability 1/4, 1/2, 1/4; the 95% interval is [0, 1] and the SE sqrt(1/8)
    seeds = np.repeat([[0.0], [1.0]], 20, axis=1)
    b = two_level_bootstrap(seeds, n_boot=8000)
    assert (b["boot_low"], b["boot_high"]) == (pytest.approx(0.0), pytest.approx(1.0))
    assert b["boot_se"] == pytest.approx(math.sqrt(1 / 8), rel=0.05)
    # reproducible by seed; another seed another draw
    noisy = np.random.default_rng(5).normal(0.1, 0.3, (5, 40))
    assert two_level_bootstrap(noisy, seed=3) == two_level_bootstrap(noisy, seed=3)
    assert two_level_bootstrap(noisy, seed=3)["boot_low"] != two_level_bootstrap(noisy, seed=4)["boot_low"]
    with pytest.raises(ValueError, match="n_boot must be >= 2"):
        two_level_bootstrap(noisy, n_boot=1)


def test_summaries_carry_the_exact_p_the_bootstrap_and_the_zero_variance_flag():
    start = pd.DataFrame({"seed": [1, 2, 3], "f1": [0.2, 0.4, 0.6], "em": [0, 0, 1]})
    lifted = [start.assign(f1=start.f1 + 0.1) for _ in range(4)]  # every seed gains exactly 0.1
    out = arm_summary(start, lifted)
    assert out["gain_f1"] == pytest.approx(0.1) and out["gain_f1_zero_variance"] and math.isnan(out["gain_f1_t"])
    assert out["gain_f1_p_exact"] == pytest.approx(2 / 16) == out["gain_f1_p_exact_min"]
    assert out["gain_f1_boot_low"] == pytest.approx(0.1) == out["gain_f1_boot_high"]
    assert out["gain_em_zero_variance"] and out["gain_em_p_exact"] == 1.0  # EM unchanged: no spread, no difference
    c = compare_arms(lifted, [start] * 4)
    assert c["zero_variance"] and math.isnan(c["t"]) and c["p_exact"] == pytest.approx(2 / 16)
    assert c["boot_low"] == pytest.approx(0.1) and c["boot_draws"] == 4000


def test_the_training_length_is_the_first_point_after_which_no_arm_gains_beyond_its_se():
    """Issue 61's pre-registered length rule (distill.experiment.length.flat_length) on probe curves: one arm
    flattens at update 80, the other at 120; with a 40-update window the length is 120, the same for both; curves
    that still rise give the last point, flagged not flat."""
    import numpy as np
    import pandas as pd

    from distill.experiment.length import flat_length

    rng = np.random.default_rng(0)
    updates = list(range(0, 201, 20))

    def curve(knee):
        return pd.DataFrame([{"update": u, "seed": s, "probe_f1": 0.5 * min(u, knee) / knee + rng.normal(0, 0.004)}
                             for s in range(4) for u in updates])

    choice = flat_length({"memopd": curve(80), "control": curve(120)}, window=40)
    assert choice["updates"] == 120 and choice["flat"]
    rising = flat_length({"memopd": curve(400)}, window=40)
    assert rising["updates"] == 200 and not rising["flat"]
    with pytest.raises(ValueError, match="curve points"):
        flat_length({"a": curve(80), "b": curve(80).query("update < 200")}, window=40)
