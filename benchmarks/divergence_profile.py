"""Benchmark: how far the same seed drifts between two float orders, step by step, against seed noise.

The chapter's small and large scaled models (train.variants d32_scaled and d256_scaled) at
train.seed are trained at 1 thread (the reference's float order) and at 2 threads (another
reduction order: what another CPU does to the same run). For every logged metric of the
per-step history (loss, grad_norm, layer-0 entropy, logit std and softmax Jacobian), the
drift |x(2 threads) - x(1 thread)| at each step is divided by the seed standard deviation of
that metric at that step over the seeds stage's seeds (seeds.seeds, 1 thread; on the log
scale for the attention statistics, as the check judges them). Where that ratio is orders of
magnitude below 1, a rerun on another machine may be held to a tolerance far tighter than a
seed band (issue 18, "power from structure").

Prints, per variant and metric, the median ratio over steps 0-99, 100-299, 300-999 and
1000-1499, and the first step where the ratio exceeds 0.01, 0.1 and 1; writes the figure
docs/divergence_profile.png (a rolling median over 25 steps) and the numbers
docs/divergence_profile.csv. A history keeps 6 significant digits: a drift below that reads 0. The threads-1 runs
and the seeds come from the run store (`runs/`, shared with the pipeline; nothing is trained
for them if the seeds stage ran); the two threads-2 runs are trained into it (about 3 and 8
minutes on this machine). Figures, not asserts.

    python benchmarks/divergence_profile.py [--store runs]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from attnrepro.config import from_dict
from attnrepro.engine import EngineConfig
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.stats import log_scale
from attnrepro.sweep import require_ok, run_sweep

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("d32_scaled", "d256_scaled")
METRICS = ("loss", "grad_norm", "entropy_l0", "logit_std_l0", "jacobian_fro_l0")
WINDOWS = ((0, 100), (100, 300), (300, 1000), (1000, 1500))
LEVELS = (0.01, 0.1, 1.0)
SMOOTH = 25  # steps of the rolling median drawn (one step's drift jumps by orders of magnitude)
FLOOR = 1e-6  # where a drift of 0 is drawn on the log axis


def series(history: list[dict], metric: str) -> dict[int, float]:
    return {r["step"]: r[metric] for r in history if r.get(metric) is not None}


def profile(one: dict[int, float], two: dict[int, float], seeds: list[dict[int, float]], log: bool) -> dict[int, float]:
    """Per step: |two - one| / the seeds' sd at that step (on the log scale where `log`)."""
    f = (lambda v: math.log(v)) if log else (lambda v: v)
    out = {}
    for step in sorted(set(one) & set(two) & set.intersection(*(set(s) for s in seeds))):
        vals = [s[step] for s in seeds]
        if log and min(vals + [one[step], two[step]]) <= 0:
            continue
        sd = float(np.std([f(v) for v in vals], ddof=1))
        if sd > 0:
            out[step] = abs(f(two[step]) - f(one[step])) / sd
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=None, help="the run store (default: params.yaml engine.store)")
    args = ap.parse_args()
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    train = from_dict(TrainConfig, params["train"], prefix="train")
    seeds = params["seeds"]["seeds"]
    engine = EngineConfig(workers=1, scheduler="", store=args.store or params["engine"]["store"])

    specs = {}
    for v in VARIANTS:
        specs[(v, "1 thread")] = train.spec(v, train.seed, "cpu")
        specs[(v, "2 threads")] = dataclasses.replace(train.spec(v, train.seed, "cpu"), threads=2,
                                                      label=f"{v} seed {train.seed}, 2 threads")
        for s in seeds:
            specs[(v, s)] = train.spec(v, s, "cpu")
    records = run_sweep("divergence", list(specs.values()), corpus_inputs(ROOT / "data/corpus"), engine)
    require_ok(records, "divergence")
    hist = {k: r.read("history.json") for k, r in zip(specs, records)}

    rows, profiles = [], {}
    for v in VARIANTS:
        for m in METRICS:
            p = profile(series(hist[(v, "1 thread")], m), series(hist[(v, "2 threads")], m),
                        [series(hist[(v, s)], m) for s in seeds], log_scale(m))
            profiles[(v, m)] = p
            row = {"variant": v, "metric": m}
            for lo, hi in WINDOWS:
                w = [r for s, r in p.items() if lo <= s < hi]
                row[f"median_ratio_steps_{lo}_{hi - 1}"] = float(np.median(w)) if w else math.nan
            for level in LEVELS:
                row[f"first_step_over_{level:g}"] = next((s for s, r in p.items() if r > level), None)
            rows.append(row)
            print(f"{v:12s} {m:15s} " + "  ".join(f"{k.removeprefix('median_ratio_')}: {row[k]:.2e}"
                                                   for k in row if k.startswith("median"))
                  + "  first step over 0.01/0.1/1: " + "/".join(str(row[f'first_step_over_{x:g}']) for x in LEVELS))

    out = ROOT / "docs"
    with open(out / "divergence_profile.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    from attnrepro.figures import plt, save

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(6 * len(VARIANTS), 4.2), sharey=True)
    for ax, v in zip(axes, VARIANTS):
        for i, m in enumerate(METRICS):
            p = pd.Series(profiles[(v, m)]).sort_index()
            smooth = p.rolling(SMOOTH, center=True, min_periods=1).median().clip(lower=FLOOR)
            ax.plot(smooth.index, smooth.values, color=f"C{i}", lw=1, label=m)
        ax.axhline(1, color="k", lw=0.8, ls="--")
        ax.axhline(FLOOR, color="grey", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"{v}, seed {train.seed}: 2 threads vs 1", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"|drift| / seed sd at that step ({len(seeds)} seeds),\nmedian over {SMOOTH} steps")
    fig.suptitle("dotted: the floor drawn for drift 0 (equal to the 6 significant digits a history keeps)",
                 fontsize=9, y=0.01)
    axes[0].legend(fontsize=8)
    save(fig, out / "divergence_profile.png")
    print(f"wrote {out / 'divergence_profile.png'} and {out / 'divergence_profile.csv'}")


if __name__ == "__main__":
    main()
