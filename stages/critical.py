"""DVC stage `critical`: the chapter's exercises 1 and 2 (§1.20.1-1.20.2), the critical d_head.

"When attention starts to break is a property of your system, not a universal constant":
the loss gap (unscaled - scaled) and the final layer-0 entropy against d_head, over seeds,
under the train stage's protocol (params section `train`). The model family keeps the
chapter's two models at its ends: d_model is the smallest multiple of d_head that is at
least `critical.min_d_model`, n_head = d_model / d_head (d_head 32 -> 128 x 4 heads, the
small model; 64 -> 128 x 2, exercise 1; 96 -> 192 x 2; 128 -> 128 x 1; 192 -> 192 x 1;
256 -> 256 x 1, the large model). So d_model moves with d_head between the ends; the
runs at d_head 32 and 256 are the seeds stage's own (the run store shares them).

The onset estimate (the criterion): the smallest d_head at which the mean gap over seeds
has risen by `critical.onset_rise` nats above its d_head-32 value, interpolated linearly in
log d_head between grid points, with a 95% percentile-bootstrap interval over seeds.

Writes metrics/critical.json (per d_head: gap and entropies with seed statistics, the
exercise-1 logit-std ratio and gap, the onset with its interval), plots/critical/curve.csv
(per d_head: mean, min, max) and plots/critical/per_seed.csv, plots/critical/curve.png.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from attnrepro.experiments.critical import CriticalConfig, critical_model
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.config import from_dict, read_params, run_stage
from attnrepro.figures import critical_figure
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.io import write_csv, write_json
from attnrepro.runtime import resolve_device
from attnrepro.stats import ALPHA, describe, log_scale, onset, paired_t_p
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

METRICS = ("loss_final", "val_loss_final", "entropy_final", "logit_std_step0", "trained_logit_std_l0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    params = read_params(args.params)
    train = from_dict(TrainConfig, params.get("train"), prefix="train")
    cfg = from_dict(CriticalConfig, params.get("critical"), prefix="critical")
    engine = engine_config(params, args.scheduler, args.workers)
    device = resolve_device(train.device, "train.device")
    setup_determinism(train.threads, device)  # the environment record states the runs' thread count
    base = train.models[train.variants[next(iter(train.variants))]["model"]]

    keys = [(d, scaled, s) for s in cfg.seeds for d in cfg.d_heads for scaled in (True, False)]
    specs = [train.run(critical_model(base, d, cfg.min_d_model, scaled=sc), s, device,
                       f"d_head {d} {'scaled' if sc else 'unscaled'} seed {s}") for d, sc, s in keys]
    runs = run_sweep("critical", specs, corpus_inputs(), engine)
    require_ok(runs, "critical")
    records = dict(zip(keys, runs))

    rows = []
    for s in cfg.seeds:
        for d in cfg.d_heads:
            sc, un = records[(d, True, s)].summary(), records[(d, False, s)].summary()
            rows.append({"seed": s, "d_head": d, "d_model": critical_model(base, d, cfg.min_d_model).d_model,
                         "gap_loss_final": un["loss_final"] - sc["loss_final"],
                         "gap_val_loss_final": un["val_loss_final"] - sc["val_loss_final"],
                         **{f"scaled_{k}": sc[k] for k in METRICS}, **{f"unscaled_{k}": un[k] for k in METRICS}})
    df = pd.DataFrame(rows)
    metrics, curve = {"seeds": len(cfg.seeds)}, []
    for d, g in df.groupby("d_head"):
        entry = {"d_model": int(g["d_model"].iloc[0])}
        row = {"d_head": int(d)}
        for col in [c for c in df.columns if c not in ("seed", "d_head", "d_model")]:
            st = describe(g[col], log=log_scale(col))
            entry[col] = {k: st[k] for k in ("mean", "sd", "min", "max", "ci95_lo", "ci95_hi")}
            row.update({f"{col}_mean": st["mean"], f"{col}_min": st["min"], f"{col}_max": st["max"]})
        metrics[f"d{d}"] = entry
        curve.append(row)
    first = cfg.d_heads[0]
    gaps = df.pivot(index="seed", columns="d_head", values="gap_loss_final")[cfg.d_heads]
    est, lo, hi = onset(cfg.d_heads, gaps.to_numpy(), cfg.onset_rise)
    # inf: the gap does not rise that much within the grid; only finite bounds are written
    metrics["onset"] = {"rise_nats": cfg.onset_rise, "reached": int(math.isfinite(est)),
                        **{k: v for k, v in (("d_head", est), ("ci95_lo", lo), ("ci95_hi", hi)) if math.isfinite(v)}}
    for d in cfg.d_heads[1:]:  # the seeds are shared across d_head: a paired test
        metrics[f"d{d}"][f"gap_vs_d{first}_paired_p"] = paired_t_p(gaps[first], gaps[d])
    if 2 * first in cfg.d_heads:  # exercise 1: halving the heads at the same d_model
        ratio = df[df.d_head == 2 * first].set_index("seed")["unscaled_logit_std_step0"] / \
            df[df.d_head == first].set_index("seed")["unscaled_logit_std_step0"]
        st = describe(ratio)
        metrics["exercise1"] = {"logit_std_ratio_step0": {k: st[k] for k in ("mean", "min", "max")},
                                "gap_loss_final": metrics[f"d{2 * first}"]["gap_loss_final"]}
    write_json("metrics/critical.json", metrics)
    write_json("metrics/env/critical.json", stage_environment(device, [r.read("env.json") for r in runs]))
    write_csv("plots/critical/curve.csv", curve)
    write_csv("plots/critical/per_seed.csv", rows)
    critical_figure(curve, metrics["onset"], "plots/critical/curve.png", len(cfg.seeds))
    for row in curve:
        print(f"d_head {row['d_head']:4d}: gap {row['gap_loss_final_mean']:.3f} "
              f"[{row['gap_loss_final_min']:.3f}, {row['gap_loss_final_max']:.3f}]  "
              f"entropy unscaled {row['unscaled_entropy_final_mean']:.4f} scaled {row['scaled_entropy_final_mean']:.4f}")
    print(f"onset (gap +{cfg.onset_rise} nat over d_head {first}): d_head {est:.0f} "
          f"[95% {lo:.0f}, {hi:.0f}] (alpha {ALPHA}; inf: not within the grid)")


if __name__ == "__main__":
    run_stage(main)
