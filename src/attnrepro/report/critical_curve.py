"""The critical curve's shape, fitted in the report stage from the committed per-seed tables (issue 63).

The model, declared in docs/CRITICAL.md ("The curve's model") before it was fitted: the loss gap of every seed
at every grid point, against x = log2 of the width (d_qk, or d_head on the mixed-width curve), fitted by least
squares to a four-parameter logistic

    gap(x) = low + (high - low) / (1 + exp(-(x - mid) / width))

(the dose-response curve in the width, saturating on both sides). low: the gap below the rise; high: the gap
above it; mid: where it is half way (reported as the width 2**mid); width: how many doublings the rise takes
(10% to 90% of it spans 2 ln 9 width doublings). Intervals: delete-one-seed jackknife, Student's t with
n_seeds - 1 degrees of freedom (the seed is the unit that is shared across the grid; for a mean this is the
t interval the rest of the report uses).

Reads plots/critical/qk_per_seed.csv and per_seed.csv (written by the critical stage); the stage's own metrics
are not changed by this module.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from attnrepro.stats import ALPHA, t_quantile

PARAMS = ("low", "high", "mid", "width")
RISE = 2 * math.log(9)  # doublings from 10% to 90% of the rise, per unit of width
CURVES = {"one_variable": ("qk_per_seed.csv", "d_qk"), "mixed": ("per_seed.csv", "d_head")}


def logistic(x, low, high, mid, width):
    return low + (high - low) / (1 + np.exp(-(np.asarray(x) - mid) / width))


def _least_squares(x: np.ndarray, y: np.ndarray, lo_x: float, hi_x: float) -> np.ndarray:
    """The logistic's parameters for points (x, y); mid is kept inside the grid and width between a twentieth
    of a doubling and the grid's span (outside, the rise is not within the grid: the fit says so, at_bound)."""
    span = hi_x - lo_x
    start = [y[x == lo_x].mean(), y[x == hi_x].mean(), (lo_x + hi_x) / 2, span / 8]
    bounds = ([-np.inf, -np.inf, lo_x, 0.05], [np.inf, np.inf, hi_x, span])
    p, _ = curve_fit(logistic, x, y, p0=start, bounds=bounds, maxfev=20000)
    return p


def fit(df: pd.DataFrame, x: str, y: str = "gap_loss_final") -> dict:
    """The logistic fitted to every seed's `y` against log2(`x`), with delete-one-seed jackknife intervals."""
    seeds = sorted(df["seed"].unique())
    grid = sorted(df[x].unique())
    lo_x, hi_x = math.log2(grid[0]), math.log2(grid[-1])

    def one(d: pd.DataFrame) -> np.ndarray:
        return _least_squares(np.log2(d[x].to_numpy(float)), d[y].to_numpy(float), lo_x, hi_x)

    full = one(df)
    leave_out = np.array([one(df[df["seed"] != s]) for s in seeds])
    n = len(seeds)
    se = np.sqrt((n - 1) / n * ((leave_out - leave_out.mean(axis=0)) ** 2).sum(axis=0))
    t = t_quantile(1 - ALPHA / 2, n - 1)
    params = {k: {"value": float(v), "ci_lo": float(v - t * s), "ci_hi": float(v + t * s)}
              for k, v, s in zip(PARAMS, full, se)}
    at_bound = [k for k, v, (lo, hi) in zip(("mid", "width"), full[2:], ((lo_x, hi_x), (0.05, hi_x - lo_x)))
                if math.isclose(v, lo, abs_tol=1e-6) or math.isclose(v, hi, abs_tol=1e-6)]
    resid = df[y].to_numpy(float) - logistic(np.log2(df[x].to_numpy(float)), *full)
    return {"x": x, "n_seeds": n, "grid": [int(g) for g in grid], "params": params, "at_bound": at_bound,
            "fitted": {int(g): float(logistic(math.log2(g), *full)) for g in grid},
            "residual_sd": float(np.sqrt((resid ** 2).sum() / (len(resid) - len(PARAMS))))}


def fits(plots_dir: Path) -> dict:
    """Both designs' fits, from the critical stage's per-seed tables ({} where a table is missing)."""
    out = {}
    for name, (csv, x) in CURVES.items():
        path = Path(plots_dir) / "critical" / csv
        if path.is_file():
            out[name] = fit(pd.read_csv(path), x)
    return out
