"""Benchmark: how far the same seed drifts between float orders, step by step, against seed noise.

Train's four variants at train.seed are trained at 1 thread (the reference's float order) and
under two other orders: 2 threads (another reduction split) and AVX2 (torch, MKL and oneDNN
limited to AVX2, what another CPU of this kind does; `gate_power.isa_env`). For every logged
metric of the per-step history (loss, grad_norm, layer-0 entropy, logit std and softmax
Jacobian), the drift |x(other) - x(1 thread)| at each step is divided by the seed standard
deviation of that metric at that step over the seeds stage's seeds (seeds.seeds, 1 thread; on
the log scale for the attention statistics, as the check judges them).

The same ratio is computed for every summary metric of metrics/train.json (the numbers the check
gates), the largest over the two orders, and written to docs/float_order.json: where it is at
most FLOAT_ORDER_RATIO the check holds a rerun on another machine to FLOAT_ORDER_TOL seed sd of
the reference run instead of the seed band (issue 18, "power from structure"; attnrepro.judge.check).

Prints, per variant and metric, the median ratio over steps 0-99, 100-299, 300-999 and
1000-1499, and the first step where the ratio exceeds 0.01, 0.1 and 1; writes the figure
docs/divergence_profile.png (a rolling median over 25 steps), docs/divergence_profile.csv and
docs/float_order.json. A history keeps 6 significant digits: a drift below that reads 0. The
threads-1 runs and the seeds come from the run store (`runs/`, shared with the pipeline); the
threads-2 runs are trained into it, the AVX2 runs into a temporary store of their own (their
specs equal the reference's). About 45 minutes of CPU. Figures, not asserts.

    python benchmarks/divergence_profile.py [--store runs]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from attnrepro.config import from_dict
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.stats import flatten, log_scale

FLOAT_ORDER_RATIO = 0.01  # a metric the same seed moves by at most this many seed sd between float orders: 'stable'
from attnrepro.run.engine import require_ok, run_sweep

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("d32_scaled", "d32_unscaled", "d256_scaled", "d256_unscaled")
ORDERS = ("2 threads", "AVX2")
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
    inputs = corpus_inputs(ROOT / "data/corpus")
    records = run_sweep("divergence", list(specs.values()), inputs, engine)
    require_ok(records, "divergence")
    # AVX2: the reference's own specs (so a store of their own), on workers started with the ISA limited
    from gate_power import isa_env

    saved = dict(os.environ)
    with tempfile.TemporaryDirectory() as store:
        os.environ.update(isa_env("AVX2"))
        try:
            avx2 = run_sweep("divergence AVX2", [specs[(v, "1 thread")] for v in VARIANTS], inputs,
                             dataclasses.replace(engine, workers=2, store=store))
            require_ok(avx2, "divergence AVX2")
            for v, r in zip(VARIANTS, avx2):
                specs[(v, "AVX2")] = r.spec
            records += avx2
            hist = {k: r.read("history.json") for k, r in zip(specs, records)}
            summaries = {k: flatten(r.summary()) for k, r in zip(specs, records)}
        finally:
            os.environ.clear()
            os.environ.update(saved)

    rows, profiles = [], {}
    for v in VARIANTS:
        for m in METRICS:
            one, seeds_m = series(hist[(v, "1 thread")], m), [series(hist[(v, s)], m) for s in seeds]
            per_order = [profile(one, series(hist[(v, o)], m), seeds_m, log_scale(m)) for o in ORDERS]
            p = {step: max(q[step] for q in per_order) for step in set.intersection(*(set(q) for q in per_order))}
            p = dict(sorted(p.items()))
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
    ratios = {}
    for v in VARIANTS:
        ref = summaries[(v, "1 thread")]
        for key, x in ref.items():
            vals = [summaries[(v, s)].get(key) for s in seeds]
            others = [summaries[(v, o)].get(key) for o in ORDERS]
            if not isinstance(x, (int, float)) or any(not isinstance(y, (int, float)) for y in vals + others):
                continue
            log = log_scale(key) and min(vals + others + [x]) > 0
            f = math.log if log else float
            sd = float(np.std([f(y) for y in vals], ddof=1))
            if sd > 0 and all(math.isfinite(f(y)) for y in others + [x]):
                ratios[f"train.{v}.{key}"] = max(abs(f(y) - f(x)) for y in others) / sd
    tight = sorted(k for k, r in ratios.items() if r <= FLOAT_ORDER_RATIO)
    (out / "float_order.json").write_text(json.dumps(
        {"orders": ["1 thread (reference)", *ORDERS], "seed": train.seed, "seeds": seeds,
         "ratio": {k: float(f"{r:.3g}") for k, r in sorted(ratios.items())}}, indent=1) + "\n", encoding="utf-8")
    print(f"summary metrics: {len(tight)} of {len(ratios)} drift at most {FLOAT_ORDER_RATIO} seed sd under "
          f"{' and '.join(ORDERS)}: " + ", ".join(tight[:12]) + (" ..." if len(tight) > 12 else ""))
    with open(out / "divergence_profile.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    from attnrepro.figures import plt, save

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(4.5 * len(VARIANTS), 4.2), sharey=True)
    for ax, v in zip(axes, VARIANTS):
        for i, m in enumerate(METRICS):
            p = pd.Series(profiles[(v, m)]).sort_index()
            smooth = p.rolling(SMOOTH, center=True, min_periods=1).median().clip(lower=FLOOR)
            ax.plot(smooth.index, smooth.values, color=f"C{i}", lw=1, label=m)
        ax.axhline(1, color="k", lw=0.8, ls="--")
        ax.axhline(FLOOR, color="grey", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(v, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"|drift| / seed sd at that step ({len(seeds)} seeds),\nmedian over {SMOOTH} steps")
    fig.suptitle(f"seed {train.seed}: the larger drift of {' and '.join(ORDERS)} from 1 thread; dashed: 1 seed sd; "
                 "dotted: the floor drawn for drift 0 (a history keeps 6 significant digits)", fontsize=9)
    axes[0].legend(fontsize=8)
    save(fig, out / "divergence_profile.png")
    print(f"wrote {out / 'divergence_profile.png'} and {out / 'divergence_profile.csv'}")


if __name__ == "__main__":
    main()
