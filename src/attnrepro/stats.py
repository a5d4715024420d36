"""Seed statistics: distributions of a metric over seeds, and the verdicts that use them.

A metric measured on n seeds has a mean m and a standard deviation s (n - 1 in the
denominator). Two intervals follow (spec §11):

  confidence interval of the mean      m +- t(0.975, n-1) * s / sqrt(n)
  prediction interval of one new run   m +- t(0.975, n-1) * s * sqrt(1 + 1/n)

A new single run is consistent with the reference when it falls in the prediction
interval (ALPHA = 0.05, two-sided); a multi-seed run is compared by Welch's t-test on
the means, as MLPerf's reference convergence points compare a submission with their
reference runs. Metrics that live near zero and move by factors (a collapsed entropy,
the softmax Jacobian, logit scales) are judged on the log scale: the same formulas on
log(x). Without scipy: Student's t comes from the regularized incomplete beta function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

ALPHA = 0.05  # two-sided; the check spends it family-wise (Bonferroni, attnrepro.check.families)

# metrics judged on the log scale: attention statistics and scales that move by factors and,
# collapsed, live near zero (a rule on the key, so every stage and the check agree)
LOG_SCALE = ("entropy", "jacobian", "logit_std", "q_std", "k_std", "w_qkv", "grad_norm", "diag_weight")


def log_scale(key: str) -> bool:
    return any(p in key for p in LOG_SCALE)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0

    def nz(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1.0 / nz(1.0 - qab * x / qap)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d, c = 1.0 / nz(1.0 + aa * d), nz(1.0 + aa / c)
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d, c = 1.0 / nz(1.0 + aa * d), nz(1.0 + aa / c)
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (bisection on the CDF)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile: p must be in (0, 1) and df > 0, got p={p}, df={df}")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class Band:
    """A metric's distribution over seeds: n, mean and sd (on the log scale when `log`)."""
    n: int
    mean: float
    sd: float
    log: bool = False

    @classmethod
    def of(cls, values: Sequence[float], log: bool = False) -> "Band":
        x = [math.log(v) for v in values] if log else [float(v) for v in values]
        m = sum(x) / len(x)
        sd = math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else 0.0
        return cls(len(x), m, sd, log)

    def _interval(self, half: float) -> tuple[float, float]:
        lo, hi = self.mean - half, self.mean + half
        return (math.exp(lo), math.exp(hi)) if self.log else (lo, hi)

    def prediction_interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """Where one new run falls with probability 1 - alpha."""
        return self._interval(t_quantile(1 - alpha / 2, self.n - 1) * self.sd * math.sqrt(1 + 1 / self.n))

    def confidence_interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """Where the mean lies with confidence 1 - alpha."""
        return self._interval(t_quantile(1 - alpha / 2, self.n - 1) * self.sd / math.sqrt(self.n))

    def contains(self, value: float, alpha: float = ALPHA) -> bool:
        """Is one new run's `value` inside the prediction interval?"""
        if value is None or not math.isfinite(value):
            return False
        lo, hi = self.prediction_interval(alpha)
        return lo <= value <= hi

    def z(self, value: float) -> float:
        """How many seed standard deviations `value` lies from the mean (on the band's scale)."""
        if self.log and value <= 0:
            return -math.inf
        x = math.log(value) if self.log else value
        if self.sd == 0:
            return 0.0 if x == self.mean else math.copysign(math.inf, x - self.mean)
        return (x - self.mean) / self.sd

    def welch(self, other: "Band") -> float:
        """Two-sided p-value of Welch's t-test: do `other`'s seeds share this band's mean?"""
        va, vb = self.sd ** 2 / self.n, other.sd ** 2 / other.n
        if va + vb == 0:
            return 1.0 if self.mean == other.mean else 0.0
        t = (other.mean - self.mean) / math.sqrt(va + vb)
        denom = (va ** 2 / (self.n - 1) if self.n > 1 else 0.0) + (vb ** 2 / (other.n - 1) if other.n > 1 else 0.0)
        df = (va + vb) ** 2 / denom if denom > 0 else 1.0
        return 2 * (1 - t_cdf(abs(t), df))


def from_summary(s: dict) -> Band:
    """The Band a describe() summary stores (its log-scale mean and sd where it has them)."""
    return Band(n=int(s["n"]), mean=s["log_mean"] if "log_mean" in s else s["mean"],
                sd=s["log_sd"] if "log_sd" in s else s["sd"], log="log_mean" in s)


def paired_t_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test of mean(b - a) = 0 (a[i], b[i] share seed i)."""
    d = Band.of([y - x for x, y in zip(a, b)])
    if d.sd == 0:
        return 1.0 if d.mean == 0 else 0.0
    return 2 * (1 - t_cdf(abs(d.mean) / (d.sd / math.sqrt(d.n)), d.n - 1))


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], alpha: float = ALPHA, reps: int = 10000,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(num) / mean(den), resampling paired seeds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    idx = rng.integers(0, len(a), size=(reps, len(a)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = a[idx].mean(1) / b[idx].mean(1)
    ratios = ratios[np.isfinite(ratios)]
    return float(np.quantile(ratios, alpha / 2)), float(np.quantile(ratios, 1 - alpha / 2))


def describe(values: Iterable[float], log: bool = False) -> dict:
    """n, mean, sd, min, max and 95% intervals (of the mean: ci95; of one new run: pi95) on the
    linear scale; on the log scale, where asked and every value is positive, the intervals come
    from log_mean and log_sd, which are stored too (the verdicts use them)."""
    vals = [float(v) for v in values]
    if len(vals) < 2:
        raise ValueError(f"a distribution needs at least 2 values, got {len(vals)}")
    lin, b = Band.of(vals), Band.of(vals, log=log and all(v > 0 for v in vals))
    out = {"n": lin.n, "mean": lin.mean, "sd": lin.sd, "min": min(vals), "max": max(vals)}
    out["ci95_lo"], out["ci95_hi"] = b.confidence_interval()
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


def distribution(runs: dict[int, dict], exclude: Sequence[str] = ()) -> dict:
    """The reference distribution of a stage's metrics over seeds.

    runs: {seed: the metrics the stage writes for that seed (nested as in its metrics file)}.
    Returns {"seeds": [...], "stats": {key: describe(...)}, "runs": runs}: one entry per
    metric key present in every run (but those containing a string of `exclude`), on the log
    scale where log_scale(key) and every value > 0.
    """
    flat = {seed: flatten(r) for seed, r in runs.items()}
    keys = [k for k in next(iter(flat.values()))
            if all(k in f for f in flat.values()) and not any(x in k for x in exclude)]
    stats = {}
    for k in keys:
        vals = [flat[s][k] for s in runs]
        if all(math.isfinite(v) for v in vals):
            stats[k] = describe(vals, log=log_scale(k))
    return {"seeds": list(runs), "stats": stats, "runs": {str(s): r for s, r in runs.items()}}


def first_crossing(x: Sequence[float], y: Sequence[float], level: float) -> float:
    """The x where y first rises above `level`, interpolated linearly in log(x) between grid points
    (inf when it never does; x[0] when it already is)."""
    if y[0] > level:
        return float(x[0])
    for (x0, y0), (x1, y1) in zip(zip(x, y), zip(x[1:], y[1:])):
        if y1 > level:
            t = (level - y0) / (y1 - y0)
            return float(math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0))))
    return math.inf


def onset(x: Sequence[float], per_seed: Sequence[Sequence[float]], rise: float, alpha: float = ALPHA,
          reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Where a curve starts to rise: the first x at which the mean over seeds exceeds its value at
    x[0] by `rise`; with a percentile bootstrap interval, resampling whole seeds (each seed's
    curve is one draw: its points share the seed). per_seed: one curve (len(x) values) per seed.
    inf where the curve does not rise that much within the grid."""
    import numpy as np

    y = np.asarray(per_seed, dtype=float)  # (seeds, len(x))

    def at(curves) -> float:
        m = curves.mean(0)
        return first_crossing(x, m, m[0] + rise)

    rng = np.random.default_rng(seed)
    boot = np.array([at(y[rng.integers(0, len(y), len(y))]) for _ in range(reps)])
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")  # sample values: inf stays inf
    return at(y), float(lo), float(hi)
