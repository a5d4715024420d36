"""Seed statistics: distributions of a metric over seeds, and the verdicts that use them.

A metric measured on n seeds has a mean m and a standard deviation s (n - 1 in the
denominator). Two intervals follow (spec §11):

  confidence interval of the mean      m +- t(0.975, n-1) * s / sqrt(n)
  prediction interval of one new run   m +- t(0.975, n-1) * s * sqrt(1 + 1/n)

A new single run is shown against the prediction interval (its band; ALPHA = 0.05, two-sided);
the verdict judges the primary endpoints' shift from the reference's mean against equivalence
margins (margin_p: two one-sided tests and the beyond-margin test; docs/VERDICT.md). Metrics
that live near zero and move by factors (a collapsed entropy, the softmax Jacobian, logit
scales) are judged on the log scale: the same formulas on log(x). Student's t, quantiles and
tests come from scipy.stats.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binomtest, linregress, nct, percentileofscore, ttest_rel
from scipy.stats import t as student_t

ALPHA = 0.05  # two-sided; the check spends it family-wise over the primary endpoints (docs/VERDICT.md)

# metrics judged on the log scale: attention statistics and scales that move by factors and,
# collapsed, live near zero (a rule on the key, so every stage and the check agree)
LOG_SCALE = ("entropy", "jacobian", "logit_std", "q_std", "k_std", "w_qkv", "grad_norm", "diag_weight")


def log_scale(key: str) -> bool:
    return any(p in key for p in LOG_SCALE)


def t_cdf(t: float, df: float) -> float:
    """Student's t CDF (scipy.stats)."""
    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (scipy.stats)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile: p must be in (0, 1) and df > 0, got p={p}, df={df}")

    return float(student_t.ppf(p, df))


@dataclass
class Band:
    """A metric's distribution over seeds: n, mean and sd (on the log scale when `log`).

    Where the seeds fall into modes (`find_modes`), `modes` holds each mode's (n, mean) and
    `mode_sd` the pooled within-mode sd (n - len(modes) degrees of freedom): one new run is then
    predicted per mode, and consistent when it falls in any mode's interval. mean and sd stay
    those of all seeds (an effect in seed sd means the same with or without modes)."""
    n: int
    mean: float
    sd: float
    log: bool = False
    modes: tuple[tuple[int, float], ...] = ()
    mode_sd: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float], log: bool = False) -> "Band":
        x = [math.log(v) for v in values] if log else [float(v) for v in values]
        m = sum(x) / len(x)
        sd = math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else 0.0
        return cls(len(x), m, sd, log)

    def _interval(self, half: float) -> tuple[float, float]:
        lo, hi = self.mean - half, self.mean + half
        return (math.exp(lo), math.exp(hi)) if self.log else (lo, hi)

    def mode_intervals(self, alpha: float = ALPHA) -> list[tuple[float, float]]:
        """Per mode: where one new run of that mode falls with probability 1 - alpha."""
        t = t_quantile(1 - alpha / 2, self.n - len(self.modes))
        out = []
        for n, m in self.modes:
            half = t * self.mode_sd * math.sqrt(1 + 1 / n)
            out.append((math.exp(m - half), math.exp(m + half)) if self.log else (m - half, m + half))
        return out

    def prediction_interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """Where one new run falls with probability 1 - alpha (with modes: the hull of theirs)."""
        if self.modes:
            iv = self.mode_intervals(alpha)
            return min(lo for lo, _ in iv), max(hi for _, hi in iv)
        return self._interval(t_quantile(1 - alpha / 2, self.n - 1) * self.sd * math.sqrt(1 + 1 / self.n))

    def confidence_interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """Where the mean lies with confidence 1 - alpha."""
        return self._interval(t_quantile(1 - alpha / 2, self.n - 1) * self.sd / math.sqrt(self.n))

    def contains(self, value: float, alpha: float = ALPHA) -> bool:
        """Is one new run's `value` inside the prediction interval?"""
        if value is None or not math.isfinite(value):
            return False
        intervals = self.mode_intervals(alpha) if self.modes else [self.prediction_interval(alpha)]
        return any(lo <= value <= hi for lo, hi in intervals)

    def z_score(self, value: float, mode: Optional[int] = None) -> float:
        """How many seed standard deviations `value` lies from the mean (on the band's scale); with modes,
        from mode `mode` (an index into self.modes; default the nearest) in within-mode sd."""
        if self.log and value <= 0:
            return -math.inf
        x = math.log(value) if self.log else value
        mean, sd = self.mean, self.sd
        if self.modes:
            centres = [m for _, m in self.modes]
            mean = centres[mode] if mode is not None else min(centres, key=lambda m: abs(x - m))
            sd = self.mode_sd
        if sd == 0:
            return 0.0 if x == mean else math.copysign(math.inf, x - mean)
        return (x - mean) / sd

    def nearest_mode(self, value: float) -> int:
        """The index of the mode (lowest first) whose mean lies nearest `value`, on the band's scale."""
        x = math.log(value) if self.log and value > 0 else value
        return min(range(len(self.modes)), key=lambda i: abs(x - self.modes[i][1]))


def from_summary(s: dict) -> Band:
    """The Band a describe() summary stores (its log-scale mean and sd where it has them, and its
    modes where the seeds fall into modes)."""
    log = "log_mean" in s
    modes = tuple((int(m["n"]), m["log_mean"] if log else m["mean"]) for m in s.get("modes", ()))
    return Band(n=int(s["n"]), mean=s["log_mean"] if log else s["mean"], sd=s["log_sd"] if log else s["sd"],
                log=log, modes=modes, mode_sd=s.get("mode_sd", 0.0))


def paired_t_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test of mean(b - a) = 0 (a[i], b[i] share seed i); nan for fewer than
    two pairs (no degrees of freedom)."""
    diffs = [y - x for x, y in zip(a, b)]
    if len(diffs) < 2:
        return math.nan
    d = Band.of(diffs)
    if d.sd == 0:
        return 1.0 if d.mean == 0 else 0.0
    return 2 * (1 - t_cdf(abs(d.mean) / (d.sd / math.sqrt(d.n)), d.n - 1))


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], alpha: float = ALPHA, reps: int = 10000,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(num) / mean(den), resampling paired seeds."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    idx = rng.integers(0, len(a), size=(reps, len(a)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = a[idx].mean(1) / b[idx].mean(1)
    ratios = ratios[np.isfinite(ratios)]
    return float(np.quantile(ratios, alpha / 2)), float(np.quantile(ratios, 1 - alpha / 2))


def fieller_ratio(num: Sequence[float], den: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """Fieller's 1 - alpha interval of mean(num) / mean(den) for paired seeds (num[i], den[i] share seed i):
    the ratios r with (mean(num) - r mean(den))^2 <= t^2 var(mean(num) - r mean(den)), t from Student's
    t with n - 1 degrees of freedom. Unbounded, (-inf, inf), where mean(den) is not significantly
    away from 0 (the set is then not an interval): the ratio is not determined by these seeds."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    n = len(a)
    c = np.cov(a, b) / n  # the covariance of the two means
    t2 = t_quantile(1 - alpha / 2, n - 1) ** 2
    ma, mb = a.mean(), b.mean()
    qa, qb, qc = mb * mb - t2 * c[1, 1], ma * mb - t2 * c[0, 1], ma * ma - t2 * c[0, 0]
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return -math.inf, math.inf
    root = math.sqrt(disc)
    return float((qb - root) / qa), float((qb + root) / qa)


def describe(values: Iterable[float], log: bool = False, groups: Sequence[Sequence[int]] = ()) -> dict:
    """n, mean, sd, min, max and 95% intervals (of the mean: ci95; of one new run: pi95) on the
    linear scale; on the log scale, where asked and every value is positive, the intervals come
    from log_mean and log_sd, which are stored too (the verdicts use them).

    groups: where the values fall into modes, the positions of each mode's values. Each mode then
    gets its n, mean, min and max ("modes"), the pooled within-mode sd ("mode_sd"), and pi95 is the
    hull of the per-mode prediction intervals (Band.mode_intervals): no normal band over modes."""
    vals = [float(v) for v in values]
    if len(vals) < 2:
        raise ValueError(f"a distribution needs at least 2 values, got {len(vals)}")
    lin, b = Band.of(vals), Band.of(vals, log=log and all(v > 0 for v in vals))
    out = {"n": lin.n, "mean": lin.mean, "sd": lin.sd, "min": min(vals), "max": max(vals)}
    out["ci95_lo"], out["ci95_hi"] = b.confidence_interval()
    if len(groups) > 1:
        if len(vals) - len(groups) < 1:
            raise ValueError(f"{len(groups)} modes over {len(vals)} values leave no degree of freedom for their sd")
        x = [math.log(v) if b.log else v for v in vals]
        means = [sum(x[i] for i in g) / len(g) for g in groups]
        ss = sum((x[i] - m) ** 2 for g, m in zip(groups, means) for i in g)
        b.modes, b.mode_sd = tuple((len(g), m) for g, m in zip(groups, means)), math.sqrt(ss / (len(x) - len(groups)))
        out["modes"] = [{"n": len(g), "mean": sum(vals[i] for i in g) / len(g), "min": min(vals[i] for i in g),
                         "max": max(vals[i] for i in g), **({"log_mean": m} if b.log else {})}
                        for g, m in zip(groups, means)]
        out["mode_sd"] = b.mode_sd
    out["pi95_lo"], out["pi95_hi"] = b.prediction_interval()
    if b.log:
        out["log_mean"], out["log_sd"] = b.mean, b.sd
    return out


def flatten(obj, prefix: str = "") -> dict[str, float]:
    """{'a': {'b': 1}} -> {'a.b': 1.0}; only numbers are kept."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix[:-1]] = float(obj)
    return out


def distribution(runs: dict[int, dict], exclude: Sequence[str] = (),
                 modes_of: Optional[Callable[[str], list[list]]] = None, modes: Optional[dict] = None) -> dict:
    """The reference distribution of a stage's metrics over seeds.

    runs: {seed: the metrics the stage writes for that seed (nested as in its metrics file)}.
    Returns {"seeds": [...], "stats": {key: describe(...)}, "runs": runs}: one entry per
    metric key present in every run (but those containing a string of `exclude`), on the log
    scale where log_scale(key) and every value > 0. modes_of(key): the seeds of each mode the
    metric's runs fall into (one group: none), and `modes` (find_modes' findings) is stored as is.
    """
    flat = {seed: flatten(r) for seed, r in runs.items()}
    keys = [k for k in next(iter(flat.values()))
            if all(k in f for f in flat.values()) and not any(x in k for x in exclude)]
    seeds = list(runs)
    stats = {}
    for k in keys:
        vals = [flat[s][k] for s in seeds]
        if all(math.isfinite(v) for v in vals):
            groups = [[seeds.index(s) for s in g] for g in modes_of(k)] if modes_of else []
            stats[k] = describe(vals, log=log_scale(k), groups=groups)
    out = {"seeds": seeds, "stats": stats, "runs": {str(s): r for s, r in runs.items()}}
    if modes is not None:
        out["modes"] = modes
    return out


# ---------------------------------------------------------------- modes

GAP_REPS = 20000  # draws of the Monte Carlo null distribution of the gap ratio


def gap_ratio(values: Sequence[float]) -> tuple[float, int]:
    """The largest gap between neighbouring sorted values, over the pooled sd of the two sides it
    leaves (n - 2 degrees of freedom); and how many values lie below it."""
    x = np.sort(np.asarray(values, dtype=float))
    gaps = np.diff(x)
    i = int(np.argmax(gaps))
    lo, hi = x[:i + 1], x[i + 1:]
    sw = math.sqrt((((lo - lo.mean()) ** 2).sum() + ((hi - hi.mean()) ** 2).sum()) / (len(x) - 2))
    if sw == 0:
        return (math.inf if gaps[i] > 0 else 0.0), i + 1
    return float(gaps[i] / sw), i + 1


def _gap_ratios(x: "np.ndarray") -> "np.ndarray":
    """gap_ratio of each row of x (rows sorted ascending), vectorized."""
    n = x.shape[1]
    gaps = np.diff(x, axis=1)
    i = gaps.argmax(1)
    below = np.arange(n) <= i[:, None]
    ss = sum(np.where(side, (x - (np.where(side, x, 0).sum(1) / side.sum(1))[:, None]) ** 2, 0).sum(1)
             for side in (below, ~below))
    return gaps[np.arange(len(x)), i] / np.sqrt(ss / (n - 2))


@functools.lru_cache(maxsize=None)
def _gap_null(n: int) -> "np.ndarray":
    return np.sort(_gap_ratios(np.sort(np.random.default_rng(0).standard_normal((GAP_REPS, n)), axis=1)))


def modes_power(n: int, share: float, separation: float, alpha: float, reps: int = 4000, seed: int = 0) -> float:
    """How often find_modes finds two modes among n seeds when a minority mode of `share` (each seed
    in it with that probability) lies `separation` within-mode sd from the rest: simulated."""
    rng = np.random.default_rng(seed)
    k = rng.binomial(n, share, reps)
    x = rng.standard_normal((reps, n)) + separation * (np.arange(n) < k[:, None])
    critical = np.quantile(_gap_null(n), 1 - alpha)
    return float((_gap_ratios(np.sort(x, axis=1)) > critical).mean())


def gap_p(ratio: float, n: int) -> float:
    """P(gap ratio >= ratio) for n independent draws of one normal distribution (the ratio does not
    depend on its mean or sd): Monte Carlo with GAP_REPS draws, seeded, so the same for everyone."""
    null = _gap_null(n)
    return float((1 + len(null) - np.searchsorted(null, ratio, side="left")) / (len(null) + 1))


@dataclass
class Modes:
    """What the seeds of one variant fall into, judged on one statistic."""
    statistic: str
    groups: list[list]  # the seeds of each mode, lowest statistic first; one group: one mode
    ratio: float  # gap_ratio of the statistic
    p: float  # gap_p: how often one normal sample has so large a gap
    alpha: float  # the level it was tested at

    def frequencies(self) -> list[dict]:
        """Each mode's seeds, count and share of the seeds with its exact 95% (Clopper-Pearson) interval."""
        n = sum(len(g) for g in self.groups)
        out = []
        for g in self.groups:
            ci = binomtest(len(g), n).proportion_ci(1 - ALPHA, method="exact")
            out.append({"seeds": list(g), "n": len(g), "frac": len(g) / n, "ci95_lo": ci.low, "ci95_hi": ci.high})
        return out


def find_modes(values: dict, alpha: float = ALPHA, log: bool = False, statistic: str = "") -> Modes:
    """Two modes when the largest gap in the sorted values is improbably large for one normal sample
    (gap_p < alpha), split at that gap; else one. values: {seed: number}; log: test log(values).
    Needs 4 values (2 degrees of freedom); at most two modes are looked for (a third cannot be
    estimated from tens of seeds). A value at or below 0 has no log: then the test is on the values."""
    seeds = list(values)
    log = log and all(values[s] > 0 for s in seeds)
    x = [math.log(values[s]) if log else float(values[s]) for s in seeds]
    if len(x) < 4:
        return Modes(statistic, [seeds], math.nan, 1.0, alpha)
    ratio, below = gap_ratio(x)
    p = gap_p(ratio, len(x))
    if p >= alpha:
        return Modes(statistic, [seeds], ratio, p, alpha)
    order = sorted(range(len(x)), key=lambda i: x[i])
    return Modes(statistic, [[seeds[i] for i in sorted(order[:below])], [seeds[i] for i in sorted(order[below:])]],
                 ratio, p, alpha)


def share_interval(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 1 - alpha interval of a share of k in n (scipy.stats.binomtest)."""
    ci = binomtest(k, n).proportion_ci(1 - alpha, method="exact")
    return float(ci.low), float(ci.high)


def percentile_of(values: Sequence[float], x: float) -> float:
    """Where x sits among values, in percent: the share below it, ties counting half
    (scipy.stats.percentileofscore, kind "mean"); 0 or 100 when outside their range."""
    return float(percentileofscore(list(values), x, kind="mean"))


def common_refinement(partitions: Iterable[Sequence[Sequence]]) -> list[list]:
    """The groups of seeds that share a mode in every partition (the modes of a metric that depends
    on several variants, e.g. a gap between two)."""
    groups: dict[tuple, list] = {}
    parts = [list(p) for p in partitions]
    seeds = [s for g in parts[0] for s in g] if parts else []
    for s in seeds:
        groups.setdefault(tuple(next(i for i, g in enumerate(p) if s in g) for p in parts), []).append(s)
    return [groups[k] for k in sorted(groups)]


def gap_groups(scaled: list, unscaled: list, n: int) -> list:
    """The modes of a paired gap: the common refinement of its two arms' modes, where it leaves at least 2
    degrees of freedom for their pooled sd (two crossing splits of 4 seeds leave 4 groups of one); else none,
    and the gap is one band."""
    refined = common_refinement([scaled, unscaled])
    return refined if 1 < len(refined) <= n - 2 else []


def onset_interval(x: Sequence[float], per_seed: Sequence[Sequence[float]],
                   alpha: float = ALPHA) -> Optional[tuple[float, float]]:
    """Where a curve starts to rise, at the grid's resolution: (x[i-1], x[i]] for the first grid point
    x[i] whose mean over seeds has a lower confidence bound (1 - alpha, Student's t over the seeds)
    above the upper bound of the mean at x[0]; None when no point of the grid does. The bounds are the
    seed noise; the answer is never finer than the grid. per_seed: one curve (len(x) values) per seed."""
    cols = list(zip(*per_seed))
    top = Band.of(cols[0]).confidence_interval(alpha)[1]
    for i in range(1, len(x)):
        if Band.of(cols[i]).confidence_interval(alpha)[0] > top:
            return float(x[i - 1]), float(x[i])
    return None


def trend(x: Sequence[float], per_seed: Sequence[Sequence[float]], alpha: float = ALPHA) -> dict:
    """A curve's slope per doubling of x, paired over seeds: each seed's least-squares slope of y on
    log2(x), then Student's t over those slopes (seed offsets cancel; n - 1 degrees of freedom).
    {slope, ci_lo, ci_hi, p, n}: the mean slope, its 1 - alpha interval, the two-sided p of slope 0 (nan where
    a value is not finite: Holm counts it as 1)."""
    lx = np.log2(np.asarray(x, dtype=float))
    each = [linregress(lx, y).slope for y in per_seed]
    slopes = Band.of(each)
    lo, hi = slopes.confidence_interval(alpha)
    return {"slope": slopes.mean, "ci_lo": lo, "ci_hi": hi, "p": paired_t_p([0.0] * len(each), each), "n": slopes.n}


def paired_onset(x: Sequence[float], per_seed: Sequence[Sequence[float]],
                 alpha: float = ALPHA) -> tuple[Optional[tuple[float, float]], list[float]]:
    """Where a curve starts to rise above its first point, paired over seeds: the one-sided paired t-test
    of y(x[i]) > y(x[0]) at every later grid point, Holm over those len(x) - 1 tests; the onset is
    (x[i-1], x[i]] for the first x[i] that rejects at family-wise alpha (None: none does), with the
    Holm-adjusted p of every x[i], i >= 1."""
    cols = np.asarray(per_seed, dtype=float).T
    p = [float(ttest_rel(cols[i], cols[0], alternative="greater").pvalue) for i in range(1, len(x))]
    adjusted = holm_adjusted(p)
    first = next((i for i, q in enumerate(adjusted, 1) if q < alpha), None)
    return (None if first is None else (float(x[first - 1]), float(x[first]))), adjusted


def curve_shape(x: Sequence[float], per_seed: Sequence[Sequence[float]], onset_at: Optional[int],
                alpha: float = ALPHA) -> dict:
    """What a curve does after its onset x[onset_at] (an index; None: no onset): the step from x[0] to
    the onset (paired, its 1 - alpha interval) and the trend from the onset to the grid's end (its
    unadjusted 1 - alpha interval). "plateau" where that interval holds 0 and the most it allows over the
    rest of the grid, either way (its bounds times the doublings), is smaller than the step's lower bound;
    "rising" / "falling" where the interval excludes 0; "undetermined" where it holds 0 but cannot rule
    out a rise or fall as large as the step; "too few points" with fewer than 3 from the onset on; "no
    onset"."""
    if onset_at is None:
        return {"shape": "no onset"}
    step = Band.of([c[onset_at] - c[0] for c in per_seed])
    lo, hi = step.confidence_interval(alpha)
    out = {"step": step.mean, "step_ci_lo": lo, "step_ci_hi": hi}
    if len(x) - onset_at < 3:
        return {**out, "shape": "too few points"}
    after = trend(x[onset_at:], [c[onset_at:] for c in per_seed], alpha)
    doublings = math.log2(x[-1] / x[onset_at])
    most = max(after["ci_hi"], -after["ci_lo"]) * doublings  # the largest change either way the interval allows
    if after["ci_lo"] > 0:
        shape = "rising"
    elif after["ci_hi"] < 0:
        shape = "falling"
    else:
        shape = "plateau" if most < out["step_ci_lo"] else "undetermined"
    return {**out, "after": after, "most_change_after": most, "shape": shape}


def holm_adjusted(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: reject at family-wise alpha where
    adjusted < alpha. A p that is not a number (a non-finite metric) counts as 1: unsorted, it would
    lift every later cell's p to 1."""
    pvalues = [p if math.isfinite(p) else 1.0 for p in pvalues]
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        out[i] = running
    return out


def holm_detectable(n: int, tests: int, alpha: float = ALPHA, power: float = 0.8) -> float:
    """The smallest true paired effect, in sd of the paired differences, that a two-sided paired t-test
    over n pairs finds with probability `power` at Holm's strictest threshold alpha / tests (so at
    least that power anywhere in the family): T is noncentral t, n - 1 degrees of freedom,
    noncentrality effect * sqrt(n) (the far tail, under alpha / (2 tests), ignored)."""
    return noncentrality(alpha / (2 * tests), n - 1, power) / math.sqrt(n)


def noncentrality(alpha: float, df: int, power: float) -> float:
    """The noncentrality at which a one-sided t-test at level alpha with df degrees of freedom rejects
    with probability `power` (a noncentral t's upper tail past the test's critical value)."""
    crit = float(student_t.isf(alpha, df))
    return brentq(lambda d: float(nct.sf(crit, df, d)) - power, 0.0, 100.0)


# ---------------------------------------------------------------- equivalence margins (docs/VERDICT.md)

LOOKS = (1, 3, 5, 10)  # attnrepro check --decide: the rerun's seeds at each look (the reference's first n)


def margin_p(diff: float, sd: float, n: int, n_ref: int, margin: float) -> tuple[float, float]:
    """(p_same, p_different) of a rerun whose n seeds' mean lies `diff` from the reference's mean over
    n_ref seeds, with the reference's seed sd `sd` (its n_ref - 1 degrees of freedom), against an
    equivalence margin: p_same tests H0 |shift| >= margin (the nearer of TOST's two one-sided tests),
    p_different tests H0 |shift| <= margin (one-sided, beyond the nearer edge). Standard error
    sd * sqrt(1/n + 1/n_ref)."""
    if sd <= 0:
        return (0.0, 1.0) if abs(diff) < margin else (1.0, 0.0 if abs(diff) > margin else 1.0)
    se = sd * math.sqrt(1 / n + 1 / n_ref)
    df = n_ref - 1
    return float(student_t.sf((margin - abs(diff)) / se, df)), float(student_t.sf((abs(diff) - margin) / se, df))


def seeds_to_decide(diff: float, sd: float, n_ref: int, margin: float, alpha: float, cap: int = 100) -> Optional[int]:
    """The fewest rerun seeds n (up to `cap`) at which a shift of `diff` would be decided (SAME or
    DIFFERENT at one-sided level alpha, `margin_p`) were the rerun's mean to stay where it is; None
    when no n does (|diff| too near the margin for the reference's n_ref seeds):
    t(1 - alpha, n_ref - 1) sd sqrt(1/n + 1/n_ref) < | |diff| - margin |, solved for n."""
    room = abs(abs(diff) - margin)
    if sd <= 0:
        return 1 if room > 0 else None
    inv_n = (room / (float(student_t.isf(alpha, n_ref - 1)) * sd)) ** 2 - 1 / n_ref
    if inv_n <= 0:
        return None
    n = max(1, math.floor(1 / inv_n) + 1)
    return n if n <= cap else None


def shift_detected(sd: float, n: int, n_ref: int, margin: float, alpha: float, power: float = 0.8) -> float:
    """The smallest true shift (in the metric's analysis unit) that `margin_p` calls DIFFERENT at one-sided
    level alpha with probability `power`, for n rerun seeds against n_ref reference seeds of seed sd `sd`:
    (shift - margin) / se is noncentral t with n_ref - 1 degrees of freedom (the other tail ignored)."""
    return margin + noncentrality(alpha, n_ref - 1, power) * sd * math.sqrt(1 / n + 1 / n_ref)
