"""The critical curve read as it is (experiments.critical.reading) on synthetic per-seed tables whose shape is
known (the report's sentences about it: tests/test_critical_curve.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnrepro.experiments import critical

GRID = [8, 10, 12, 14, 16, 32, 48, 64, 80, 96, 128, 192, 256]


def table(gap, seeds=5, noise=0.03, seed=0) -> pd.DataFrame:
    """Per seed and d_qk: a scaled loss rising 0.1 per doubling, the unscaled one above it by gap(d_qk), the
    logit std at init 0.1 sqrt(d_qk); seed offsets shared by both arms and every point."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(seeds):
        off = 0.2 * rng.standard_normal()
        for d in GRID:
            scaled = 4.0 + off + 0.1 * np.log2(d) + noise * rng.standard_normal()
            rows.append({"seed": s, "d_qk": d, "scaled_loss_final": scaled,
                         "unscaled_loss_final": scaled + gap(d) + noise * rng.standard_normal(),
                         "unscaled_logit_std_step0": 0.1 * np.sqrt(d)})
    df = pd.DataFrame(rows)
    df["gap_loss_final"] = df["unscaled_loss_final"] - df["scaled_loss_final"]
    return df


def test_a_step_then_a_flat_tail_reads_as_a_plateau_at_the_step():
    r = critical.reading(GRID, table(lambda d: 0.1 + (0.6 if d >= 12 else 0.0)), "d_qk")
    o = r["paired_onset"]
    assert (o["reached"], o["after_d_qk"], o["by_d_qk"]) == (1, 10, 12)
    assert (o["logit_std_after"], o["logit_std_by"]) == pytest.approx((0.1 * np.sqrt(10), 0.1 * np.sqrt(12)))
    assert r["shape"]["shape"] == "plateau" and 0.5 < r["shape"]["step"] < 0.7
    t = r["trend"]
    assert set(t) == {f"{c}_{w}" for c in critical.SERIES for w in ("all", "after_onset")}
    # both arms rise 0.1 per doubling (the scaled loss by construction, the unscaled with it): the gap's
    # trend after the onset holds 0, each arm's does not
    assert t["gap_loss_final_after_onset"]["ci_lo"] < 0 < t["gap_loss_final_after_onset"]["ci_hi"]
    for arm in ("scaled", "unscaled"):
        assert t[f"{arm}_loss_final_after_onset"]["ci_lo"] > 0.05 and t[f"{arm}_loss_final_all"]["p_holm"] < 0.05


def test_a_steady_climb_reads_as_rising_and_a_flat_curve_as_no_onset():
    rising = critical.reading(GRID, table(lambda d: 0.15 * np.log2(d / 8)), "d_qk")
    assert rising["paired_onset"]["reached"] and rising["shape"]["shape"] == "rising"
    flat = critical.reading(GRID, table(lambda d: 0.2, seed=1), "d_qk")
    assert flat["paired_onset"] == {"reached": 0, "alpha": 0.05, "p_holm": flat["paired_onset"]["p_holm"]}
    assert flat["shape"] == {"shape": "no onset"} and set(flat["trend"]) == {f"{c}_all" for c in critical.SERIES}
