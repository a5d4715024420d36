"""Seed statistics: Student's t, the intervals, the paired t-test, bootstrap, Fieller, Holm, power."""

from __future__ import annotations

import math

import numpy as np

from attnrepro import stats

import pytest

from attnrepro.stats import (Band, bootstrap_ratio, describe, distribution, from_summary,
                             paired_t_p, t_cdf, t_quantile)


@pytest.mark.parametrize("p,df,want", [  # printed tables of Student's t
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.975, 9, 2.2622), (0.975, 30, 2.0423),
    (0.995, 4, 4.6041), (0.95, 10, 1.8125), (0.5, 3, 0.0),
])
def test_t_quantiles_match_the_tables(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=1e-3)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_intervals_follow_the_spec_formula():
    b = Band.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (b.n, b.mean, b.sd) == (5, 3.0, pytest.approx(math.sqrt(2.5)))
    half = 2.7764451 * math.sqrt(2.5) * math.sqrt(1 + 1 / 5)  # mean +- t(0.975, n-1) sd sqrt(1 + 1/n)
    assert b.prediction_interval() == pytest.approx((3 - half, 3 + half))
    assert b.confidence_interval() == pytest.approx((3 - half / math.sqrt(6), 3 + half / math.sqrt(6)))
    assert b.contains(3 + 0.99 * half) and not b.contains(3 + 1.01 * half)
    assert b.z_score(3 + math.sqrt(2.5)) == pytest.approx(1.0)


def test_log_scale_for_values_near_zero():
    s = describe([0.001, 0.002, 0.004], log=True)
    b = from_summary(s)
    assert b.log and b.mean == pytest.approx(math.log(0.002)) and b.sd == pytest.approx(math.log(2))
    assert s["pi95_lo"] > 0 and b.contains(0.002) and not b.contains(0.2)
    assert "log_mean" not in describe([0.0, 0.002, 0.004], log=True)  # a zero: the linear scale
    with pytest.raises(ValueError, match="at least 2"):
        describe([1.0])


def test_paired_t():
    x = [1.0, 2.0, 3.0, 4.0]
    assert paired_t_p(x, [v + 0.5 for v in x]) == 0.0  # a constant shift: no spread at all
    assert paired_t_p(x, [1.1, 1.9, 3.05, 3.95]) > 0.5
    assert math.isnan(paired_t_p([1.0], [2.0])) and math.isnan(paired_t_p([], []))  # no degrees of freedom


def test_bootstrap_is_deterministic():
    num, den = [1.4, 1.3, 0.9, 1.3, 1.5], [0.15, 0.2, 0.26, 0.07, 0.33]
    assert bootstrap_ratio(num, den) == bootstrap_ratio(num, den)
    lo, hi = bootstrap_ratio(num, den)
    assert lo < sum(num) / sum(den) < hi


def test_paired_t_is_scipys():
    from scipy import stats as sp

    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [1.3, 2.1, 3.6, 4.2, 5.9]
    assert paired_t_p(a, b) == pytest.approx(sp.ttest_rel(b, a).pvalue, rel=1e-9)


def test_the_bootstrap_resamples_seeds_in_pairs():
    # num = 2 * den plus a little: a paired resample keeps the ratio near 2, an unpaired one would not
    den = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    num = [2 * d + e for d, e in zip(den, [0.01, -0.01, 0.02, -0.02, 0.0, 0.01])]
    lo, hi = bootstrap_ratio(num, den)
    assert 1.98 < lo < hi < 2.02


def test_the_onset_is_a_grid_interval_set_by_seed_noise():
    x = [32, 48, 64, 96, 128]
    rng = np.random.default_rng(0)
    for true_onset in range(1, 5):  # synthetic curves: flat, then a step far above the noise at x[true_onset]
        curves = [[0.2 + (1.0 if i >= true_onset else 0.0) + 0.02 * rng.standard_normal() for i in range(5)]
                  for _ in range(5)]
        assert stats.onset_interval(x, curves) == (x[true_onset - 1], x[true_onset])
    flat = [[0.2 + 0.05 * rng.standard_normal() for _ in x] for _ in range(5)]
    assert stats.onset_interval(x, flat) is None
    # a rise within the noise is no onset: the bounds are the seeds' spread, not a fixed threshold
    noisy = [[0.2, 0.2 + d, 0.3 + d, 0.4 + d, 0.5 + d] for d in (-0.6, 0.6, -0.5, 0.5, 0.0)]
    assert stats.onset_interval(x, noisy) is None
    # never finer than the grid: whatever the curve, the answer is two neighbouring grid points
    for _ in range(50):
        c = [[float(v) for v in np.cumsum(rng.uniform(0, 0.5, len(x)))] for _ in range(4)]
        got = stats.onset_interval(x, c)
        assert got is None or (got[0] in x and got[1] == x[x.index(got[0]) + 1])


def test_the_onset_rule_on_synthetic_curves_with_known_onsets():
    """The critical stage's rule on the one-variable grid: a known onset is found as exactly the grid interval
    that holds it; a curve that never leaves the first point's noise has none; a curve already high at the
    first point has none either (the rule reads a rise from the first point, so the stage reports separately
    whether that first gap is above zero)."""
    x = [32, 48, 64, 80, 96, 128, 192, 256]
    rng = np.random.default_rng(1)

    def curves(level, sd=0.03, n=5):
        return [[level(v) + sd * rng.standard_normal() for v in x] for _ in range(n)]

    # a sigmoid rise centred between grid points: the onset is the interval that first clears the noise
    for centre, want in ((40, (32, 48)), (70, (64, 80)), (110, (96, 128)), (220, (192, 256))):
        c = curves(lambda v: 0.2 + 1.0 / (1 + np.exp(-(v - centre) / 2.0)))
        assert stats.onset_interval(x, c) == want, centre
    # already at the first step after the baseline: (x[0], x[1]], never an interval below the grid's first point
    assert stats.onset_interval(x, curves(lambda v: 0.2 if v == 32 else 1.2)) == (32, 48)
    # not reached: a flat curve, and a rise smaller than the seed noise
    assert stats.onset_interval(x, curves(lambda v: 0.3)) is None
    assert stats.onset_interval(x, curves(lambda v: 0.3 + 0.0002 * v, sd=0.2)) is None
    # already broken at the first point: high everywhere, no rise beyond the first point's noise
    high = curves(lambda v: 1.2)
    assert stats.onset_interval(x, high) is None
    assert stats.Band.of([c[0] for c in high]).confidence_interval()[0] > 0  # ... but its gap is above zero
    # the threshold is the seed noise: the same step is an onset with tight seeds and none with loose ones
    step = lambda v: 0.2 + (0.3 if v >= 80 else 0.0)  # noqa: E731
    assert stats.onset_interval(x, curves(step, sd=0.02)) == (64, 80)
    assert stats.onset_interval(x, curves(step, sd=0.6)) is None
    # never finer than the grid, on any grid: the answer is a pair of neighbouring grid points
    for grid in (x, [32, 64, 96, 128, 192, 256], [4, 8, 12, 16]):
        for _ in range(30):
            c = [[float(v) for v in np.cumsum(rng.uniform(0, 0.4, len(grid)))] for _ in range(5)]
            got = stats.onset_interval(grid, c)
            assert got is None or (got[0] in grid and got[1] == grid[grid.index(got[0]) + 1])


def test_distribution_of_runs():
    runs = {s: {"a": {"loss": 4 + s / 10, "entropy_x": 0.1 * (s + 1)}, "ratio": {"gap_ratio_x": s}} for s in range(3)}
    d = distribution(runs, exclude=("gap_ratio",))
    assert d["seeds"] == [0, 1, 2] and set(d["stats"]) == {"a.loss", "a.entropy_x"}
    assert "log_mean" in d["stats"]["a.entropy_x"] and "log_mean" not in d["stats"]["a.loss"]


# ---------------------------------------------------------------- modes

def test_two_clear_modes_are_found_and_split_at_the_gap():
    values = {s: v for s, v in enumerate([1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 3.0, 3.1, 0.98, 1.01])}
    m = stats.find_modes(values, alpha=0.01)
    assert m.groups == [[0, 1, 2, 3, 4, 5, 8, 9], [6, 7]] and m.p < 0.01
    f = m.frequencies()
    assert [x["n"] for x in f] == [8, 2] and f[1]["frac"] == 0.2
    assert f[1]["ci95_lo"] < 0.2 < f[1]["ci95_hi"] and f[1]["ci95_lo"] > 0.02  # exact binomial interval


def test_one_normal_sample_is_one_mode_at_about_the_stated_rate():
    rng = np.random.default_rng(1)
    found = [len(stats.find_modes(dict(enumerate(rng.normal(size=10))), alpha=0.05).groups) > 1
             for _ in range(400)]
    assert 0.02 <= np.mean(found) <= 0.09  # the test's false-positive rate is its alpha


def test_the_gap_test_is_scale_free_and_works_on_the_log_scale():
    x = [0.7737, 0.5663, 0.8521, 0.8196, 0.833, 0.80, 0.79, 0.55, 0.81, 0.84]
    lin = stats.find_modes(dict(enumerate(x)), alpha=0.05)
    scaled = stats.find_modes(dict(enumerate(1000 * v for v in x)), alpha=0.05)
    assert lin.ratio == pytest.approx(scaled.ratio) and lin.groups == scaled.groups
    assert lin.groups == [[1, 7], [0, 2, 3, 4, 5, 6, 8, 9]]
    assert stats.find_modes(dict(enumerate(x)), alpha=0.05, log=True).ratio != pytest.approx(lin.ratio)


def test_too_few_or_identical_values_are_one_mode():
    assert stats.find_modes({0: 1.0, 1: 5.0, 2: 5.1}).groups == [[0, 1, 2]]
    assert stats.find_modes(dict(enumerate([2.0] * 6))).groups == [[0, 1, 2, 3, 4, 5]]


def test_a_gap_metric_gets_the_modes_both_of_its_variants_make():
    assert stats.common_refinement([[[0, 1, 2], [3, 4]], [[0, 1], [2, 3, 4]]]) == [[0, 1], [2], [3, 4]]
    assert stats.common_refinement([[[0, 1, 2, 3]], [[0, 1, 2, 3]]]) == [[0, 1, 2, 3]]


def test_a_band_over_modes_is_per_mode_not_one_normal_band():
    vals = [1.0, 1.1, 0.9, 3.0, 3.1]
    one, two = stats.describe(vals), stats.describe(vals, groups=[[0, 1, 2], [3, 4]])
    assert "modes" not in one and [m["n"] for m in two["modes"]] == [3, 2]
    assert two["mode_sd"] == pytest.approx(math.sqrt((0.01 + 0.0 + 0.01 + 0.0025 + 0.0025) / 3))
    b1, b2 = stats.from_summary(one), stats.from_summary(two)
    assert b1.contains(2.0) and not b2.contains(2.0)  # between the modes: normal band yes, modes no
    assert b2.contains(1.0) and b2.contains(3.05)
    assert two["mean"] == one["mean"] and two["sd"] == one["sd"]  # effects in seed sd unchanged
    assert b2.z_score(3.05) == pytest.approx(0.0)  # from the nearest mode


def test_seed_headline_per_seed_ratio_is_median_and_range_and_split_gaps_get_a_bootstrap_interval():
    import pandas as pd

    from attnrepro.experiments.comparison import headline

    gaps = pd.DataFrame({"gap_d32_loss_final": [0.2, 0.1, 0.002, 0.3, 0.15], "gap_d32_val_loss_final": [0.1] * 5,
                         "gap_d256_loss_final": [0.8, 0.9, 1.5, 1.6, 0.85], "gap_d256_val_loss_final": [0.7] * 5})
    gaps["gap_ratio_loss_final"] = gaps.gap_d256_loss_final / gaps.gap_d32_loss_final
    gaps["gap_ratio_val_loss_final"] = gaps.gap_d256_val_loss_final / gaps.gap_d32_val_loss_final
    h = headline(gaps, 32, 256)
    assert h["gap_ratio_loss_final"] == pytest.approx({"median": 0.85 / 0.15, "min": 4.0, "max": 750.0})  # no mean, no t
    t = h["gap_d256_loss_final"]
    assert "ci95_bootstrap" not in t and t["ci95_lo"] < 0.85  # the t interval reaches below every mode's low seeds
    b = headline(gaps, 32, 256, frozenset({256}))["gap_d256_loss_final"]
    assert b["ci95_bootstrap"] == 1 and b["mean"] == t["mean"]
    assert t["ci95_lo"] < b["ci95_lo"] and b["ci95_hi"] <= 1.6  # inside the data's range, unlike the t interval


def test_holm_counts_a_nan_as_one_and_modes_on_log_fall_back_for_a_zero():
    from attnrepro.stats import find_modes, holm_adjusted

    assert holm_adjusted([float("nan"), 0.001, 0.002, 0.003, 0.2]) == pytest.approx([1.0, 0.005, 0.008, 0.009, 0.4])
    values = {s: v for s, v in enumerate([0.0, 0.01, 0.02, 0.015, 0.012, 0.9, 0.95, 0.92])}
    m = find_modes(values, log=True)  # log(0) would raise; on the values the split is plain
    assert len(m.groups) == 2 and m.groups[1] == [5, 6, 7]


def test_a_gaps_modes_keep_two_degrees_of_freedom_for_their_sd():
    from attnrepro.stats import gap_groups

    # two crossing splits of 4 seeds: 4 groups of one, no sd left: the gap is one band
    assert gap_groups([[0, 1], [2, 3]], [[0, 2], [1, 3]], 4) == []
    # 5 seeds, 3 groups: 2 degrees of freedom left, the modes stay
    assert gap_groups([[0, 1, 2], [3, 4]], [[0, 1, 2, 3], [4]], 5) == [[0, 1, 2], [3], [4]]
    assert gap_groups([[0, 1, 2, 3, 4]], [[0, 1, 2, 3, 4]], 5) == []  # one mode in both arms: none


def test_the_mixed_width_model_is_the_smallest_multiple_of_d_head_at_least_min_d_model():
    from attnrepro.experiments.critical import critical_model

    import yaml
    from pathlib import Path

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text(encoding="utf-8"))
    base = params["train"]["models"]["small"]
    for d_head, d_model in ((32, 128), (96, 192), (192, 192), (256, 256), (24, 144)):
        m = critical_model(base, d_head, 128)
        assert (m.d_model, m.n_head, m.d_head) == (d_model, d_model // d_head, d_head)
    assert stats.describe([0.1, 0.2, 0.9, 1.0, 0.5], groups=[[0, 1, 2], [3], [4]])["mode_sd"] > 0  # 2 df left


def test_the_gap_tests_p_value_falls_as_the_gap_grows():
    ps = [stats.gap_p(r, 10) for r in (0.0, 1.0, 2.0, 4.0, 8.0)]
    assert ps[0] == 1.0 and all(a > b for a, b in zip(ps, ps[1:]))
    assert stats.gap_p(float("inf"), 10) == pytest.approx(1 / (stats.GAP_REPS + 1))
    # the ratio of a sample does not depend on its mean or scale
    x = [0.1, 0.4, 0.35, 0.2, 1.9, 2.1, 2.0]
    assert stats.gap_ratio(x) == pytest.approx(stats.gap_ratio([5 + 3 * v for v in x]))


def test_a_log_band_judges_a_value_at_or_below_zero_impossible():
    b = Band.of([0.001, 0.002, 0.0015, 0.0012], log=True)
    assert b.z_score(0.0) == -math.inf and not b.contains(0.0) and not b.contains(-1.0)
    assert not b.contains(float("nan")) and b.contains(0.0015)
    lo, hi = b.prediction_interval()
    assert not b.contains(hi * 1.0001) and b.contains(hi * 0.9999)


def test_z_from_a_given_mode_and_modes_need_a_degree_of_freedom():
    vals = [1.0, 1.1, 0.9, 3.0, 3.1]
    b = stats.from_summary(stats.describe(vals, groups=[[0, 1, 2], [3, 4]]))
    sd = b.mode_sd
    assert b.z_score(3.05) == pytest.approx(0.0)  # nearest: mode 1
    assert b.z_score(3.05, mode=0) == pytest.approx((3.05 - 1.0) / sd)  # the mode asked for, not the nearest
    with pytest.raises(ValueError, match="no degree of freedom"):
        stats.describe([1.0, 2.0], groups=[[0], [1]])


def test_modes_power_is_the_rate_find_modes_finds_two_modes():
    """stats.modes_power against find_modes itself on the same kind of draws, the null rate at most alpha,
    and power growing with the separation (issue 38: "1 mode" is no evidence of a second, at its power)."""
    import numpy as np

    from attnrepro.stats import find_modes, modes_power

    alpha = 0.0125
    assert modes_power(10, 0.0, 0.0, alpha) <= alpha
    p4, p8 = modes_power(10, 0.2, 4, alpha), modes_power(10, 0.2, 8, alpha)
    assert 0.05 < p4 < p8 < 0.95
    rng = np.random.default_rng(5)
    found = 0
    for _ in range(300):
        k = rng.binomial(10, 0.2)
        x = rng.standard_normal(10) + 8 * (np.arange(10) < k)
        found += len(find_modes(dict(enumerate(x)), alpha).groups) == 2
    assert abs(found / 300 - p8) < 0.08


def test_holm_detectable_is_the_power_a_simulation_measures():
    """At the effect holm_detectable gives, simulated paired t-tests over n pairs reject at Holm's
    strictest threshold alpha / tests 80% of the time; the effect grows with the family and shrinks
    with the seeds."""
    from scipy.stats import ttest_1samp

    rng = np.random.default_rng(0)
    for n, tests in ((5, 21), (5, 11), (10, 170)):
        effect = stats.holm_detectable(n, tests)
        diffs = rng.normal(effect, 1.0, size=(4000, n))
        p = ttest_1samp(diffs, 0.0, axis=1).pvalue
        assert abs(np.mean(p < stats.ALPHA / tests) - 0.8) < 0.025, (n, tests, effect)
    assert stats.holm_detectable(5, 1) < stats.holm_detectable(5, 21) < stats.holm_detectable(5, 170)
    assert stats.holm_detectable(10, 21) < stats.holm_detectable(5, 21)


GRID = [8, 10, 12, 14, 16, 32, 48, 64, 80, 96, 128, 192, 256]  # the one-variable grid


def _seed_curves(rng, level, n=5, seed_sd=0.1, noise=0.05):
    """n seeds' curves over GRID: a seed offset (cancels in paired tests) plus independent noise per point."""
    return [[level(x) + off + noise * rng.standard_normal() for x in GRID]
            for off in seed_sd * rng.standard_normal(n)]


def test_a_trend_over_a_value_that_is_not_a_number_has_no_p():
    t = stats.trend([1, 2, 4], [[0.0, 0.1, 0.2], [0.0, math.nan, 0.2], [0.1, 0.2, 0.3]])
    assert math.isnan(t["slope"]) and math.isnan(t["p"])
    assert stats.holm_adjusted([t["p"], 0.01]) == [1.0, 0.02]  # counted as 1, never as a rejection


def test_the_trend_is_the_mean_per_seed_slope_per_doubling():
    # an exact line in log2(x): every seed's slope is 0.1 per doubling whatever its offset
    exact = [[off + 0.1 * math.log2(x) for x in GRID] for off in (0.0, 0.3, -0.2)]
    t = stats.trend(GRID, exact)
    assert t["slope"] == pytest.approx(0.1) and t["ci_lo"] == pytest.approx(0.1) and t["p"] == 0.0 and t["n"] == 3
    # coverage by simulation: the 95% interval holds the true slope about 95% of the time
    rng = np.random.default_rng(3)
    ts = [stats.trend(GRID, _seed_curves(rng, lambda x: 0.05 * math.log2(x))) for _ in range(2000)]
    cover = sum(t["ci_lo"] <= 0.05 <= t["ci_hi"] for t in ts) / len(ts)
    assert 0.93 <= cover <= 0.97
    null = [stats.trend(GRID, _seed_curves(rng, lambda x: 0.5))["p"] for _ in range(2000)]
    assert 0.035 <= sum(p < 0.05 for p in null) / len(null) <= 0.065


def test_the_paired_onset_controls_family_wise_error_and_finds_a_step():
    rng = np.random.default_rng(4)
    # no rise anywhere: some later point is declared an onset at most alpha of the time (Holm over 12 tests)
    false = sum(stats.paired_onset(GRID, _seed_curves(rng, lambda x: 0.3))[0] is not None for _ in range(2000))
    assert false / 2000 <= 0.05
    # a step of 0.5 nats between 8 and 10 with seed offsets ten times the per-point noise: found exactly there,
    # where the unpaired rule (intervals widened by the seed offsets) may not see it
    step = lambda x: 0.1 + (0.5 if x >= 10 else 0.0)  # noqa: E731
    found = [stats.paired_onset(GRID, _seed_curves(rng, step, seed_sd=0.5, noise=0.05)) for _ in range(200)]
    assert sum(w == (8.0, 10.0) for w, _ in found) >= 190
    where, p = found[0]
    assert len(p) == len(GRID) - 1 and all(0 <= q <= 1 for q in p)
    unpaired = sum(stats.onset_interval(GRID, _seed_curves(rng, step, seed_sd=0.5, noise=0.05)) == (8.0, 10.0)
                   for _ in range(200))
    assert unpaired < 100


def test_the_curve_shape_after_the_onset():
    rng = np.random.default_rng(5)
    shape = lambda level, **kw: stats.curve_shape(GRID, _seed_curves(rng, level, **kw), 4)["shape"]  # noqa: E731
    # a step at 16 then flat: a plateau
    assert shape(lambda x: 0.1 + (0.6 if x >= 16 else 0.0)) == "plateau"
    # a step then a steady climb of 0.2 per doubling: rising
    assert shape(lambda x: 0.1 + (0.6 + 0.2 * math.log2(x / 16) if x >= 16 else 0.0)) == "rising"
    assert shape(lambda x: 0.1 + (0.6 - 0.2 * math.log2(x / 16) if x >= 16 else 0.0)) == "falling"
    # a tiny step in large noise: flat after it, but a change as large as the step cannot be ruled out
    assert shape(lambda x: 0.1 + (0.05 if x >= 16 else 0.0), noise=0.1) == "undetermined"
    # a plateau needs both bounds small: a trend interval that allows a fall as large as the step is not one
    wide_fall = [[0.1 + (0.6 if x >= 16 else 0.0) + 0.05 * rng.standard_normal()
                  + (s * math.log2(x / 16) if x >= 16 else 0.0) for x in GRID] for s in (-0.3, 0.1, -0.2, 0.15, 0.0)]
    got = stats.curve_shape(GRID, wide_fall, 4)
    assert got["after"]["ci_lo"] < 0 < got["after"]["ci_hi"] and got["shape"] == "undetermined"
    assert got["most_change_after"] == pytest.approx(-got["after"]["ci_lo"] * math.log2(256 / 16))
    assert stats.curve_shape(GRID, _seed_curves(rng, lambda x: 0.3), None) == {"shape": "no onset"}
    assert stats.curve_shape(GRID, _seed_curves(rng, lambda x: 0.3), len(GRID) - 2)["shape"] == "too few points"
