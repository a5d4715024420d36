"""The primary endpoints (claims.yaml `primary:`): does this run still reproduce the chapter? Each is a metric, or
the contrast `a / b` of two of one stage (a ratio per seed, judged on the log scale), with an equivalence margin;
SAME / DIFFERENT / INCONCLUSIVE against the reference's seeds, Holm over the family. The rules: docs/VERDICT.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from attnrepro.config import UserError
from attnrepro.stats import (ALPHA, LOOKS, Band, flatten, holm_adjusted, log_scale, margin_p, seeds_to_decide,
                             shift_detected)

SAME, DIFFERENT, INCONCLUSIVE, MISSING = "SAME", "DIFFERENT", "INCONCLUSIVE", "MISSING"
INVALID = "NOT A NUMBER"  # the run's value is nan, inf, or not positive on a log scale: a problem
MAX_ENDPOINTS = 20
SEEDS_CAP = 100  # INCONCLUSIVE's hint counts rerun seeds up to this
CONTRAST = " / "


class EndpointError(UserError):
    pass


def parts(metric: str) -> list[str]:
    """The metric keys an endpoint reads: itself, or a contrast's two."""
    return metric.split(CONTRAST)


def value(flat: Mapping[str, float], metric: str) -> Optional[float]:
    """An endpoint's value from {"file.key": number}: the metric's, or its contrast's ratio (None where a key is
    missing; nan where the denominator is 0)."""
    xs = [flat.get(k) for k in parts(metric)]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        return None
    return xs[0] if len(xs) == 1 else (xs[0] / xs[1] if xs[1] else math.nan)


def _log(metric: str) -> bool:
    return len(parts(metric)) > 1 or log_scale(metric)


@dataclass(frozen=True)
class Endpoint:
    metric: str
    margin: float  # on the analysis scale: the unit's own, or log(factor) for a log-scale metric
    text: str  # the margin as claims.yaml writes it: "±0.1" or "×2"
    reason: str

    @property
    def log(self) -> bool:
        return _log(self.metric)

    @classmethod
    def parse(cls, entry, where: str) -> "Endpoint":
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, str) for x in entry)):
            raise EndpointError(f"{where}: expected [metric key, margin (±x or ×x), reason]")
        metric, text, reason = (x.strip() for x in entry)
        keys = parts(metric)
        if len(keys) > 2 or len({k.split(".", 1)[0] for k in keys}) > 1 or not all(k.count(".") >= 1 for k in keys):
            raise EndpointError(f"{where}: {metric!r}: expected a metric key (file.key) or the contrast of two of one "
                                f"stage, 'file.a{CONTRAST}file.b'")
        log = _log(metric)
        sign = "×" if log else "±"
        try:
            value = float(text[1:]) if text.startswith(sign) else math.nan
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > (1 if log else 0)):
            raise EndpointError(f"{where}: margin {text!r} of {metric}: expected {sign}x with x > {1 if log else 0} "
                                + ("(a factor: the metric is judged on the log scale)" if log else "(in its unit)"))
        if not reason:
            raise EndpointError(f"{where}: {metric} needs the reason for its margin")
        return cls(metric, math.log(value) if log else value, text, reason)


def parse_primary(entries, where: str) -> list[Endpoint]:
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_ENDPOINTS:
        raise EndpointError(f"{where}: expected a list of 1 to {MAX_ENDPOINTS} endpoints")
    out = [Endpoint.parse(e, f"{where}[{i}]") for i, e in enumerate(entries)]
    seen = [e.metric for e in out]
    dup = next((m for m in seen if seen.count(m) > 1), None)
    if dup:
        raise EndpointError(f"{where}: {dup} is declared twice")
    return out


@dataclass
class Judgement:
    endpoint: Endpoint
    answer: str
    n: int = 0  # this run's seeds
    n_ref: int = 0
    ref_mean: Optional[float] = None  # on the metric's own scale (the geometric mean on the log scale)
    run_mean: Optional[float] = None
    shift: Optional[float] = None  # run - reference, on the analysis scale
    ref_sd: float = 0.0  # the reference's seed sd, on the analysis scale
    sd: float = 0.0  # the seed sd the tests use: the reference's and the run's pooled (`pooled_sd`)
    shift_sd: Optional[float] = None  # the shift in the reference's seed sd
    p_same: float = 1.0
    p_different: float = 1.0
    seeds_needed: Optional[int] = None  # INCONCLUSIVE: the rerun seeds that would decide it (--decide's alpha, `sd`)

    def shift_text(self) -> str:
        if self.shift is None:
            return "—"
        unit = f"×{math.exp(self.shift):.3g}" if self.endpoint.log else f"{self.shift:+.3g}"
        return unit + ("" if self.shift_sd is None else f" ({self.shift_sd:+.2g} sd)")

    def need_text(self) -> str:
        if self.answer != INCONCLUSIVE:
            return ""
        if self.seeds_needed is None:
            wide = self.sd / self.ref_sd if self.ref_sd > 0 else 1.0
            return f"no number of seeds up to {SEEDS_CAP} decides it: " + (
                f"with the run's seeds the pooled sd is {wide:.3g}× the reference's (a seed far from the others)"
                if wide > 2 else f"the shift lies about as near its margin as the reference's own {self.n_ref} seeds "
                "can resolve")
        return f"{self.seeds_needed} seeds would decide it" + (
            f" (--decide stops at the reference's {self.n_ref})" if self.seeds_needed > self.n_ref else "")


def seed_values(dists: Mapping[str, dict], key: str) -> list[float]:
    """Each seed's value of metric `<file>.<key>` (or of a contrast of two), where its stage has a seed distribution."""
    file = key.partition(".")[0]
    runs = dists.get(file, {}).get("runs", {})
    return [v for v in (value(flatten(r, f"{file}."), key) for r in runs.values()) if v is not None]


def reference_values(family: Sequence[Endpoint], dists: Mapping[str, dict]) -> dict[str, list[float]]:
    """Each endpoint's values over the seeds of a seed distribution (metrics/dist)."""
    return {e.metric: seed_values(dists, e.metric) for e in family}


def pooled_sd(ref: Band, run: Band) -> float:
    """The seed sd of the reference's and the run's seeds pooled (the reference's alone at one rerun seed):
    the run's own spread enters because the reference's seeds can miss a rare mode (docs/VERDICT.md)."""
    return math.sqrt(((ref.n - 1) * ref.sd ** 2 + (run.n - 1) * run.sd ** 2) / (ref.n + run.n - 2))


def judge(endpoints: Sequence[Endpoint], reference: Mapping[str, Sequence[float]],
          run: Mapping[str, Sequence[float]], alpha: float = ALPHA, looks: int = 1, hints: bool = True) -> list[Judgement]:
    """Every endpoint's answer: `reference[metric]` its reference seeds' values, `run[metric]` this
    run's (one value per seed). Holm over the endpoints judged, at alpha / looks; `hints`: the seeds that would
    decide an INCONCLUSIVE one."""
    a = alpha / looks
    out = []
    for e in endpoints:
        ref, mine = list(reference.get(e.metric) or []), list(run.get(e.metric) or [])
        ok = lambda xs: len(xs) > 0 and all(isinstance(x, (int, float)) and math.isfinite(x) and (x > 0 or not e.log)
                                           for x in xs)
        if len(ref) < 2 or not ok(ref) or not mine:
            out.append(Judgement(e, MISSING, len(mine), len(ref)))
            continue
        if not ok(mine):
            out.append(Judgement(e, INVALID, len(mine), len(ref)))
            continue
        b, r = Band.of(ref, log=e.log), Band.of(mine, log=e.log)
        shift, sd = r.mean - b.mean, pooled_sd(b, r)
        mean = math.exp if e.log else float  # the geometric mean on the log scale
        out.append(Judgement(e, INCONCLUSIVE, r.n, b.n, mean(b.mean), mean(r.mean), shift, b.sd, sd,
                             shift / b.sd if b.sd > 0 else None, *margin_p(shift, sd, r.n, b.n, e.margin)))
    judged = [j for j in out if j.answer not in (MISSING, INVALID)]
    for kind, ps in ((SAME, [j.p_same for j in judged]), (DIFFERENT, [j.p_different for j in judged])):
        for j, p in zip(judged, holm_adjusted(ps)):
            if p < a:
                j.answer = kind
    for j in judged if hints else []:  # the seeds --decide, the way to add them, would need: at its alpha per look
        if j.answer == INCONCLUSIVE:
            j.seeds_needed = seeds_to_decide(j.shift, j.sd, j.n_ref, j.endpoint.margin,
                                             alpha / len(LOOKS) / len(judged), SEEDS_CAP)
    return out


def summary(judgements: Sequence[Judgement]) -> dict[str, int]:
    return {k: sum(j.answer == k for j in judgements) for k in (SAME, DIFFERENT, INCONCLUSIVE, MISSING, INVALID)}


def summary_line(judgements: Sequence[Judgement]) -> str:
    """The primary endpoints' answers in one line: what `attnrepro check` and the report both print."""
    e = summary(judgements)
    return (f"primary     {len(judgements)} endpoints: {e[SAME]} SAME, {e[DIFFERENT]} DIFFERENT, "
            f"{e[INCONCLUSIVE]} INCONCLUSIVE" + (f", {e[MISSING]} missing" if e[MISSING] else "")
            + (f", {e[INVALID]} not a number" if e[INVALID] else "")
            + f" (equivalence margins in claims.yaml, alpha {ALPHA} family-wise: docs/VERDICT.md)")


def faithful_reruns(family: Sequence[Endpoint], dists: Mapping[str, dict], n: int, reps: int,
                    rng: np.random.Generator) -> list[dict[str, list[float]]]:
    """`reps` simulated faithful reruns of n seeds: each seed's endpoint values drawn from the normal that the
    reference's seeds fit, per stage (their means and covariance on the analysis scale: a seed's endpoints
    move together), the log scale's exponentiated back."""
    out: list[dict[str, list[float]]] = [{} for _ in range(reps)]
    for file in dict.fromkeys(e.metric.split(".", 1)[0] for e in family):
        mine = [e for e in family if e.metric.startswith(file + ".")]
        runs = dists.get(file, {}).get("runs", {}).values()
        rows = [[value(flatten(r, f"{file}."), e.metric) for e in mine] for r in runs]
        x = np.array([[math.log(v) if e.log else v for v, e in zip(row, mine)] for row in rows
                      if all(v is not None and math.isfinite(v) and (v > 0 or not e.log) for v, e in zip(row, mine))])
        if len(x) < 2:
            continue
        draws = rng.multivariate_normal(x.mean(0), np.atleast_2d(np.cov(x.T)), size=(reps, n), method="svd")
        for sim, d in zip(out, draws):
            sim.update({e.metric: (np.exp(d[:, i]) if e.log else d[:, i]).tolist() for i, e in enumerate(mine)})
    return out


def same_probability(family: Sequence[Endpoint], dists: Mapping[str, dict], seeds: Sequence[int] = LOOKS,
                     reps: int = 400, seed: int = 0) -> dict[str, dict[int, float]]:
    """Per endpoint, the share of simulated faithful reruns (`faithful_reruns`) of n seeds, for n in `seeds`,
    that a look of --decide calls SAME (alpha / len(LOOKS), Holm over the family)."""
    rng = np.random.default_rng(seed)
    reference = reference_values(family, dists)
    out = {e.metric: {} for e in family}
    for n in seeds:
        same = dict.fromkeys(out, 0)
        for run in faithful_reruns(family, dists, n, reps, rng):
            for j in judge(family, reference, run, looks=len(LOOKS), hints=False):
                same[j.endpoint.metric] += j.answer == SAME
        for m in out:
            out[m][n] = same[m] / reps
    return out


def power_rows(endpoints: Sequence[Endpoint], dists: Mapping[str, dict], alpha: float = ALPHA,
               seeds: Sequence[int] = LOOKS) -> list[dict]:
    """Per endpoint: the smallest true shift a rerun of n seeds calls DIFFERENT with 80% power, for n in
    `seeds`, in the endpoint's unit and in the reference's seed sd (one look, Holm's first step:
    alpha / the family's size, the conservative end); and `same`, the simulated probability that a faithful
    rerun of n seeds is called SAME at a look of --decide (`same_probability`)."""
    rows = []
    a = alpha / max(1, len(endpoints))
    reference = reference_values(endpoints, dists)
    same = same_probability(endpoints, dists, seeds)
    for e in endpoints:
        ref = reference[e.metric]
        if len(ref) < 2:
            continue
        b = Band.of(ref, log=e.log)
        row = {"metric": e.metric, "margin": e.text, "n_ref": b.n, "sd": b.sd, "log": e.log,
               "margin_sd": e.margin / b.sd if b.sd > 0 else math.inf, "same": same[e.metric]}
        for n in seeds:
            shift = shift_detected(b.sd, n, b.n, e.margin, a) if b.sd > 0 else e.margin
            row[f"shift_{n}"] = math.exp(shift) if e.log else shift
            row[f"shift_sd_{n}"] = shift / b.sd if b.sd > 0 else math.inf
        rows.append(row)
    return rows
