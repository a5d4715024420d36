"""Rows matched by role: head indices carry no meaning between two trained models, the roles they take
may. One least-cost one-to-one assignment (scipy), used per layer by the heads stage's seed distribution
and by the check, which judges a run's heads under the reference's names, and per group by the claims'
matched tables, which pair each published row with one of ours."""

from __future__ import annotations

import math
import re
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnrepro.stats import flatten

HEAD = re.compile(r"^heads\.l(\d+)h(\d+)\.(\w+)$")
HEAD_STATS = ("entropy", "diag", "prev", "distance", "distance_std")  # what a head's role is matched on


def least_cost_pairs(reference: Sequence[Sequence[Optional[float]]], other: Sequence[Sequence[float]],
                     scale: Sequence[float]) -> list[tuple[int, int]]:
    """(i, j) pairs matching reference vector i with other vector j one-to-one at the least total cost (scipy's
    linear_sum_assignment); a pair costs the sum over the reference's numbers (None: not compared) of
    |reference - other| / scale, and 1e9 where that is not a number (a statistic that could not be computed
    resembles nothing)."""
    def cost(a: Sequence[Optional[float]], b: Sequence[float]) -> float:
        c = sum(abs(x - y) / sc for x, y, sc in zip(a, b, scale) if x is not None)
        return c if math.isfinite(c) else 1e9

    rows, cols = linear_sum_assignment([[cost(a, b) for b in other] for a in reference])
    return [(int(i), int(j)) for i, j in zip(rows, cols)]


def matched_to(reference: list[dict], other: list[dict], stats: tuple[str, ...]) -> list[dict]:
    """`other`'s head rows ({layer, head, <stat>: value}) renamed (layer, head) after the reference's head each
    one plays: least_cost_pairs within a layer over `stats`, each statistic scaled by its spread over the
    reference's heads of that layer."""
    out = []
    for li in sorted({r["layer"] for r in reference}):
        ref = [r for r in reference if r["layer"] == li]
        oth = [r for r in other if r["layer"] == li]
        # a head whose statistic is not a number must not make every pair of its layer cost the same
        scale = [float(np.nanstd([r[k] for r in ref])) for k in stats]
        scale = [sc if math.isfinite(sc) and sc > 0 else 1.0 for sc in scale]
        pairs = least_cost_pairs([[r[k] for k in stats] for r in ref], [[r[k] for k in stats] for r in oth], scale)
        out += [{**oth[j], "layer": li, "head": ref[i]["head"]} for i, j in pairs]
    return out


def heads_renamed(run: dict[str, float], reference: dict[str, float],
                  stats: tuple[str, ...] = HEAD_STATS) -> dict[str, float]:
    """Flat metrics (heads.l<L>h<H>.<stat>) with the run's heads renamed after the reference's head each plays,
    matched on `stats`; unchanged where either lacks a head's statistics or the two differ in shape."""
    def rows(m):
        by: dict[tuple, dict] = {}
        for k, v in m.items():
            x = HEAD.match(k)
            if x:
                by.setdefault((int(x[1]), int(x[2])), {"layer": int(x[1]), "head": int(x[2])})[x[3]] = v
        return list(by.values())
    mine, theirs = rows(run), rows(reference)
    if not mine or sorted((r["layer"], r["head"]) for r in mine) != sorted((r["layer"], r["head"]) for r in theirs) \
            or any(k not in r for r in mine + theirs for k in stats):
        return dict(run)
    out = {k: v for k, v in run.items() if not HEAD.match(k)}
    for r in matched_to(theirs, mine, stats):
        out.update({f"heads.l{r['layer']}h{r['head']}.{k}": v for k, v in r.items() if k not in ("layer", "head")})
    return out


def seeds_renamed(dist: dict, reference: dict[str, float]) -> dict:
    """A heads seed distribution (metrics/dist/heads.json) with every seed's heads renamed after the
    reference's head each plays (heads_renamed); its structure (each seed's values nested by head) kept, so an
    unchanged naming leaves it equal to the input."""
    head_name = re.compile(r"^l\d+h\d+$")
    runs = {}
    for s, r in (dist.get("runs") or {}).items():
        renamed = heads_renamed({f"heads.{k}": v for k, v in flatten(r).items()}, reference)
        runs[s] = {k: ({stat: renamed.get(f"heads.{k}.{stat}", v) for stat, v in sub.items()}
                       if head_name.match(k) and isinstance(sub, dict) else sub) for k, sub in r.items()}
    return {**dist, "runs": runs}
