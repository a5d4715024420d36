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

from attnrepro.formatting import fmt_number, md_table, zero_note
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


def _summary(p: np.ndarray) -> np.ndarray:
    """What the text reports, on the scale its interval is symmetric on: low, high, mid and the 90% point of the
    rise (log2 of the width), log(width) (positive)."""
    low, high, mid, width = p
    return np.array([low, high, mid, math.log(width), mid + RISE / 2 * width])


REPORTED = ("low", "high", "mid", "log_width", "x90")


def fit(df: pd.DataFrame, x: str, y: str = "gap_loss_final") -> dict:
    """The logistic fitted to every seed's `y` against log2(`x`), with delete-one-seed jackknife intervals (Student's
    t, n_seeds - 1 df) for its parameters and the 90% point of the rise; the residual sd beside the seeds' own sd
    about each grid point's mean (what no curve through the grid points can remove)."""
    seeds = sorted(df["seed"].unique())
    grid = sorted(df[x].unique())
    lo_x, hi_x = math.log2(grid[0]), math.log2(grid[-1])
    bounds = {"mid": (lo_x, hi_x), "width": (0.05, hi_x - lo_x)}

    def one(d: pd.DataFrame) -> np.ndarray:
        return _least_squares(np.log2(d[x].to_numpy(float)), d[y].to_numpy(float), lo_x, hi_x)

    def at_bound(p: np.ndarray) -> list[str]:
        return [k for k, v in zip(("mid", "width"), p[2:]) if any(math.isclose(v, b, abs_tol=1e-6) for b in bounds[k])]

    full = one(df)
    leave_out = [one(df[df["seed"] != s]) for s in seeds]
    jack = np.array([_summary(p) for p in leave_out])
    n = len(seeds)
    se = np.sqrt((n - 1) / n * ((jack - jack.mean(axis=0)) ** 2).sum(axis=0))
    t = t_quantile(1 - ALPHA / 2, n - 1)
    params = {k: {"value": float(v), "ci_lo": float(v - t * s), "ci_hi": float(v + t * s)}
              for k, v, s in zip(REPORTED, _summary(full), se)}
    xs, ys = np.log2(df[x].to_numpy(float)), df[y].to_numpy(float)
    resid = ys - logistic(xs, *full)
    within = ys - df.groupby(x)[y].transform("mean").to_numpy(float)
    return {"x": x, "n_seeds": n, "grid": [int(g) for g in grid], "params": params, "at_bound": at_bound(full),
            "leave_out_at_bound": sum(bool(at_bound(p)) for p in leave_out),
            "fitted": {int(g): float(logistic(math.log2(g), *full)) for g in grid},
            "residual_sd": float(np.sqrt((resid ** 2).sum() / (len(ys) - len(PARAMS)))),
            "within_sd": float(np.sqrt((within ** 2).sum() / (len(ys) - len(grid))))}


def fits(plots_dir: Path) -> dict:
    """Both designs' fits, from the critical stage's per-seed tables ({} where a table is missing)."""
    out = {}
    for name, (csv, x) in CURVES.items():
        path = Path(plots_dir) / "critical" / csv
        if path.is_file():
            out[name] = fit(pd.read_csv(path), x)
    return out


# ---------------------------------------------------------------- the words (README, report, docs/CRITICAL.md)

def _iv(p: dict, scale=None) -> str:
    """A reported parameter as value [lo, hi]: in nats to 3 decimals, or through `scale` (2**x for a width,
    exp for log_width) to 2 significant digits."""
    if scale is None:
        return f"{p['value']:.3f} [{p['ci_lo']:.3f}, {p['ci_hi']:.3f}]"
    v, lo, hi = (scale(p[k]) for k in ("value", "ci_lo", "ci_hi"))
    return f"{_num(v)} [{_num(lo)}, {_num(hi)}]"


def _num(v: float) -> str:
    """A width: whole from 10 up, else 2 significant digits."""
    return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def _pow2(v: float) -> float:
    return 2.0 ** v


def onset_text(reading: dict, x: str) -> str:
    """The one onset rule's answer (stats.paired_onset, as the critical stage wrote it in `reading`)."""
    o = reading["paired_onset"]
    if not o["reached"]:
        return f"not shown (no {x} of the grid has a gap shown above the first point's)"
    return (f"**{x} in ({o[f'after_{x}']:.0f}, {o[f'by_{x}']:.0f}]** (unscaled logit std at init "
            f"{o['logit_std_after']:.3f} to {o['logit_std_by']:.3f})")


def levels_off(f: dict) -> bool:
    """The rise is shown to end inside the grid: the 90% point's upper bound lies below the grid's last point."""
    return f["params"]["x90"]["ci_hi"] < math.log2(f["grid"][-1])


def _bounds_note(f: dict) -> str:
    n = f["leave_out_at_bound"] + bool(f["at_bound"])
    return (f"; {'the fit and ' * bool(f['at_bound'])}{f['leave_out_at_bound']} of its {f['n_seeds']} leave-one-seed-out "
            "fits put the half-way point or the width at its bound (there the rise is not located by the data)") if n else ""


def model_text(f: dict) -> str:
    """The fitted curve in one clause: where it is half and 90% of the way up, its level above the rise."""
    p, x = f["params"], f["x"]
    return (f"the logistic fitted to every seed's gap is half way up at {x} {_iv(p['mid'], _pow2)} and 90% of the way "
            f"at {x} {_iv(p['x90'], _pow2)}, where it levels at {_iv(p['high'])} nats ("
            + ("the rise is shown to end within the grid" if levels_off(f) else "the rise is not shown to end within "
               "the grid") + ")")


def summary(metrics: dict, fits_: dict) -> str:
    """The answer in one sentence (the report's Answer, the README's line, docs/CRITICAL.md), one-variable curve."""
    q, f = metrics["d_qk"], fits_["one_variable"]
    return (f"With only the q/k width moving ({q['model']} model, {q['seeds']} seeds) the loss gap's onset by the paired "
            f"rule is {onset_text(q['reading'], 'd_qk')}, and {model_text(f)}; 95% intervals, jackknife over the seeds")


def model_markdown(f: dict) -> str:
    """The model paragraph: every parameter with its interval, and the residual beside the seeds' own scatter."""
    p, x = f["params"], f["x"]
    return (f"The curve's model (declared in `docs/CRITICAL.md` before it was fitted): gap = low + (high − low) / "
            f"(1 + exp(−(log2 {x} − mid) / width)), least squares over every seed's gap at every {x} "
            f"({f['n_seeds']} seeds × {len(f['grid'])} points), 95% intervals by delete-one-seed jackknife (Student's "
            f"t, {f['n_seeds'] - 1} df): high {_iv(p['high'])} nats; low {_iv(p['low'])} nats (the level below the rise, "
            f"which the grid barely reaches: an extrapolation); half way at {x} 2^mid = {_iv(p['mid'], _pow2)}; width "
            f"{_iv(p['log_width'], math.exp)} doublings; 90% of the rise at {x} {_iv(p['x90'], _pow2)}: "
            + ("the rise is shown to end within the grid" if levels_off(f) else
               "the rise is not shown to end within the grid") + _bounds_note(f)
            + f". Residual sd {f['residual_sd']:.3f} nats, against {f['within_sd']:.3f} for the seeds about each "
            f"{x}'s own mean.")


def _ci(v: dict) -> str:
    return f"{v['mean']:.3f} [{v['ci95_lo']:.3f}, {v['ci95_hi']:.3f}]"


def _modes_note(e: dict) -> str:
    """'unscaled: 2 modes (seeds ... vs ...)' where an arm's seeds fall into two modes at a grid point, else ''."""
    return "; ".join(f"{a}: {v['n_modes']} modes (seeds {' vs '.join(', '.join(map(str, g)) for g in v['seeds'])})"
                     for a, v in sorted((e.get("modes") or {}).items()) if v.get("n_modes", 1) > 1)


def _trend(t: dict) -> str:
    return f"{t['slope']:+.3f} [{t['ci_lo']:+.3f}, {t['ci_hi']:+.3f}]"


def points(m: dict, prefix: str) -> list[tuple[int, dict]]:
    return sorted((int(k[len(prefix):]), v) for k, v in m.items() if k.startswith(prefix) and k[len(prefix):].isdigit())


def one_variable_markdown(q: dict, f: dict) -> list[str]:
    """The one-variable curve: its design, the table with the fitted curve beside the means, the model, both arms."""
    rows = points(q, "dqk")
    first = rows[0][0]
    new = 2 * q["seeds"] * sum(d != q["d_head"] for d, _ in rows)  # d_qk = d_head: the seeds stage's own runs
    out = [f"**One variable** (design, cost and the grid's history in `docs/CRITICAL.md`): the chapter's {q['model']} "
           f"model (d_model {q['d_model']}, {q['n_head']} head, value width {q['d_head']}) with only its per-head "
           f"query/key width d_qk moving over {', '.join(str(d) for d, _ in rows)}, so the scaled arm divides by √d_qk "
           f"and the value path, head count and every other weight stay the same; {q['seeds']} paired seeds per point, "
           f"scaled and unscaled ({2 * len(rows) * q['seeds']} runs; {new} to train where the store holds the seeds "
           f"stage's d_head-{q['d_head']} runs). Both arms move with d_qk, so the gap is the difference of two moving "
           "curves; each is shown with its 95% interval over the seeds, the gap also with the fitted curve.\n"]
    p_holm = q["reading"]["paired_onset"]["p_holm"]
    header = ["d_qk", "gap [95% CI]; fitted", "scaled loss [95% CI]", "unscaled loss [95% CI]",
              "unscaled logit std at init", "final entropy: unscaled l0, l1; scaled l0", f"Holm p, gap > d_qk {first}",
              "modes"]
    table = []
    for d, v in rows:
        g, l1 = v["gap_loss_final"], v.get("unscaled_entropy_final_l1")
        table.append([d, f"{_ci(g)}{zero_note(g['ci95_lo'], g['ci95_hi'])}; {f['fitted'][d]:.3f}",
                      _ci(v["scaled_loss_final"]), _ci(v["unscaled_loss_final"]),
                      f"{v['unscaled_logit_std_step0']['mean']:.3f}",
                      fmt_number(round(v["unscaled_entropy_final"]["mean"], 5))
                      + ("" if l1 is None else f", {fmt_number(round(l1['mean'], 5))}")
                      + f"; {v['scaled_entropy_final']['mean']:.3f}",
                      f"{p_holm[f'd_qk{d}']:.2g}" if f"d_qk{d}" in p_holm else "", _modes_note(v) or "one"])
    out += md_table(header, table)
    tr = q["reading"]["trend"]
    out += ["", model_markdown(f),
            f"Both arms move: per doubling of d_qk over the whole grid the scaled loss changes by "
            f"{_trend(tr['scaled_loss_final_all'])} nats and the unscaled by {_trend(tr['unscaled_loss_final_all'])} "
            "(each seed's least-squares slope, Student's t over the seeds). Modes: each arm's seeds at each d_qk tested "
            "on their step-222 entropy (stats.find_modes, Bonferroni over the grid), as in the seeds stage."]
    return out


def report_markdown(metrics: dict, fits_: dict) -> str:
    """Exercises 1-2: the one onset rule on both designs, the one-variable curve, then the mixed-width curve."""
    if not metrics or not fits_:
        return ""
    q = metrics["d_qk"]
    out = [f"**Onset** (one rule for both designs, the paired one: the first grid point whose gap exceeds the first "
           "point's, one-sided paired t over the seeds, Holm over the later points; docs/CRITICAL.md): one variable "
           f"{onset_text(q['reading'], 'd_qk')}, mixed width {onset_text(metrics['reading'], 'd_head')}.\n"]
    out += one_variable_markdown(q, fits_["one_variable"]) + [""]
    rows = points(metrics, "d")
    first = rows[0][0]
    f = fits_["mixed"]
    out += [f"**Mixed width** (not one variable): the chapter's protocol at every d_head of its suggested grid, "
            f"{metrics['seeds']} seeds each (mean [min, max]), with d_model the smallest multiple of d_head ≥ 128 and "
            "n_head = d_model / d_head, so d_model and n_head move with d_head (`stages/critical.py`): not a "
            "one-variable answer (plots/critical/gap_vs_logit_std.png: the gap against the logit scale at init, for "
            "both designs, with the chapter's two models as separate reference points).\n"]
    header = ["d_head", "d_model", "gap (unscaled − scaled); fitted", "unscaled entropy", "scaled entropy",
              "unscaled logit std, trained", f"p, gap vs d_head {first} (paired t)"]
    table = []
    for d, v in rows:
        g, p = v["gap_loss_final"], v.get(f"gap_vs_d{first}_paired_p")
        table.append([d, v["d_model"], f"{g['mean']:.3f} [{g['min']:.3f}, {g['max']:.3f}]; {f['fitted'][d]:.3f}",
                      fmt_number(round(v["unscaled_entropy_final"]["mean"], 5)),
                      f"{v['scaled_entropy_final']['mean']:.3f}", f"{v['unscaled_trained_logit_std_l0']['mean']:.4g}",
                      "" if p is None else f"{p:.2g}"])
    out += md_table(header, table) + ["", model_markdown(f)]
    e1 = metrics.get("exercise1")
    if e1:
        r, g = e1["logit_std_ratio_step0"], e1["gap_loss_final"]
        out.append(f"Exercise 1 (d_head {2 * first}: half the heads at the same d_model): the unscaled logit std at "
                   f"step 0 is {r['mean']:.3f}× that of d_head {first} (√2 = 1.414); the gap is "
                   f"{g['mean']:.3f} [{g['min']:.3f}, {g['max']:.3f}].")
    return "\n".join(out) + "\n\n"


def answer(metrics: dict, fits_: dict) -> str:
    """The section's answer: the onset and the fitted curve (the one-variable curve answers the exercise)."""
    if not metrics.get("d_qk") or "one_variable" not in fits_:
        return ""
    return summary(metrics, fits_) + ". Both arms and the mixed-width curve are in the section below."


def doc_markdown(metrics: dict, fits_: dict) -> str:
    """docs/CRITICAL.md's generated block: the answer, the onset on both designs in the logit scale at init, both
    fitted models, both arms' trends."""
    q = metrics["d_qk"]
    one, mixed = q["reading"]["paired_onset"], metrics["reading"]["paired_onset"]
    tr = q["reading"]["trend"]
    meet = (one["reached"] and mixed["reached"] and one["logit_std_after"] <= mixed["logit_std_by"]
            and mixed["logit_std_after"] <= one["logit_std_by"])
    return "\n".join([
        f"* **Answer.** {summary(metrics, fits_)}.",
        f"* **Onset, both designs, by the one rule:** one variable {onset_text(q['reading'], 'd_qk')}; mixed width "
        f"{onset_text(metrics['reading'], 'd_head')}. In the logit scale at init the two onsets "
        + ("meet: by this rule the designs agree there." if meet else "do not meet: the logit scale at init alone "
                                                                     "does not put both designs on one curve."),
        f"* **One variable.** {model_markdown(fits_['one_variable'])}",
        f"* **Mixed width.** {model_markdown(fits_['mixed'])}",
        f"* **Both arms move.** Per doubling of d_qk over the whole grid the scaled loss changes by "
        f"{_trend(tr['scaled_loss_final_all'])} nats and the unscaled by {_trend(tr['unscaled_loss_final_all'])}: "
        "the gap is their difference.",
    ])
