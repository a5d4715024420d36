"""Seed statistics without scipy: Student's t, the intervals, Welch, the paired t-test, bootstrap."""

from __future__ import annotations

import math

import pytest

from attnrepro.stats import (Band, bootstrap_ratio, describe, distribution, first_crossing, from_summary, onset,
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
    assert b.z(3 + math.sqrt(2.5)) == pytest.approx(1.0)


def test_log_scale_for_values_near_zero():
    s = describe([0.001, 0.002, 0.004], log=True)
    b = from_summary(s)
    assert b.log and b.mean == pytest.approx(math.log(0.002)) and b.sd == pytest.approx(math.log(2))
    assert s["pi95_lo"] > 0 and b.contains(0.002) and not b.contains(0.2)
    assert "log_mean" not in describe([0.0, 0.002, 0.004], log=True)  # a zero: the linear scale
    with pytest.raises(ValueError, match="at least 2"):
        describe([1.0])


def test_welch_and_paired_t():
    a, same = Band.of([4.0, 4.1, 3.9, 4.05, 3.95]), Band.of([4.01, 4.09, 3.92, 4.04, 3.96])
    far = Band.of([4.5, 4.6, 4.4, 4.55, 4.45])
    assert a.welch(same) > 0.5 and a.welch(far) < 1e-4
    x = [1.0, 2.0, 3.0, 4.0]
    assert paired_t_p(x, [v + 0.5 for v in x]) == 0.0  # a constant shift: no spread at all
    assert paired_t_p(x, [1.1, 1.9, 3.05, 3.95]) > 0.5


def test_bootstrap_and_onset_are_deterministic():
    num, den = [1.4, 1.3, 0.9, 1.3, 1.5], [0.15, 0.2, 0.26, 0.07, 0.33]
    assert bootstrap_ratio(num, den) == bootstrap_ratio(num, den)
    lo, hi = bootstrap_ratio(num, den)
    assert lo < sum(num) / sum(den) < hi
    x = [32, 64, 128, 256]
    assert first_crossing(x, [0.1, 0.1, 0.3, 1.0], 0.2) == pytest.approx(math.exp((math.log(64) + math.log(128)) / 2))
    assert first_crossing(x, [0.1, 0.1, 0.1, 0.1], 0.2) == math.inf
    est, lo, hi = onset(x, [[0.1, 0.12, 0.4, 1.0], [0.2, 0.18, 0.5, 1.2], [0.15, 0.14, 0.45, 1.1]], 0.1)
    assert lo <= est <= hi and 64 < est < 128


def test_distribution_of_runs():
    runs = {s: {"a": {"loss": 4 + s / 10, "entropy_x": 0.1 * (s + 1)}, "ratio": {"gap_ratio_x": s}} for s in range(3)}
    d = distribution(runs, exclude=("gap_ratio",))
    assert d["seeds"] == [0, 1, 2] and set(d["stats"]) == {"a.loss", "a.entropy_x"}
    assert "log_mean" in d["stats"]["a.entropy_x"] and "log_mean" not in d["stats"]["a.loss"]
