"""DVC stage `seeds`: the reference distribution of the controlled comparison over seeds.

Trains train.variants (the chapter's protocol, params section `train`) at every seed
of `seeds.seeds`. A seed drives the init draw and the batch order, so at each seed the
scaled and unscaled models of one shape start from the same weights and see the same
batches (paired). The seed train.seed is the train stage's own run: the run store
shares it. Every number of metrics/train.json gets n, mean, sd, min, max and 95%
intervals (log scale for attention statistics: attnrepro.stats), so `attnrepro check`
can tell a failure to reproduce from seed noise, and the claims are evaluated on every
seed.

Writes metrics/seeds.json (the headline: gaps and the gap ratio over seeds),
metrics/dist/train.json (every metric's distribution, and each seed's metrics),
plots/seeds/ (gaps.csv per seed, curves.csv: mean and range of each variant's training
curves, bands.png, gaps.png).
"""

from __future__ import annotations

import argparse

import pandas as pd

from attnrepro.experiments.comparison import SeedsConfig, comparison, pairs_by_dhead
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.config import from_dict, read_params, run_stage
from attnrepro.figures import seed_bands_figure, seed_gaps_figure
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.io import write_csv, write_json
from attnrepro.runtime import resolve_device
from attnrepro.stats import bootstrap_ratio, describe, distribution
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

CURVES = ("loss", "entropy_l0", "jacobian_fro_l0", "logit_std_l0")


def curves(histories: dict[tuple[str, int], list[dict]], variants) -> list[dict]:
    """Per step: mean, min and max over seeds of each variant's curve (wide: one column per series)."""
    df = pd.DataFrame([{"variant": v, "seed": s, **r} for (v, s), rows in histories.items() for r in rows])
    cols = [c for c in CURVES if c in df]
    g = df.groupby(["variant", "step"])[cols].agg(["mean", "min", "max"])
    wide = pd.DataFrame(index=sorted(df["step"].unique()))
    for v in variants:
        for c in cols:
            for stat in ("mean", "min", "max"):
                wide[f"{v}_{c}_{stat}"] = g.loc[v][(c, stat)]
    wide.index.name = "step"
    return [{"step": int(step), **{k: (None if pd.isna(x) else float(x)) for k, x in row.items()}}
            for step, row in wide.iterrows()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    params = read_params(args.params)
    cfg = from_dict(TrainConfig, params.get("train"), prefix="train")
    seeds = from_dict(SeedsConfig, params.get("seeds"), prefix="seeds").seeds
    engine = engine_config(params, args.scheduler, args.workers)
    device = resolve_device(cfg.device, "train.device")
    setup_determinism(cfg.threads, device)  # the environment record states the runs' thread count

    keys = [(v, s) for s in seeds for v in cfg.variants]
    records = run_sweep("seeds", [cfg.spec(v, s, device) for v, s in keys], corpus_inputs(), engine)
    require_ok(records, "seeds")
    by = dict(zip(keys, records))

    pairs = pairs_by_dhead(cfg)
    runs = {}
    for s in seeds:
        m = {v: by[(v, s)].summary() for v in cfg.variants}
        runs[s] = {**m, "comparison": comparison(m, pairs)}
    # a per-seed ratio with a noisy denominator has no meaningful t band: the gaps themselves have one,
    # and the ratio of the mean gaps gets a bootstrap interval below
    dist = distribution(runs, exclude=("gap_ratio",))
    write_json("metrics/dist/train.json", dist)

    gaps = pd.DataFrame([{"seed": s, **runs[s]["comparison"]} for s in seeds])
    d_heads = sorted(d for d, p in pairs.items() if set(p) == {True, False})
    small, large = d_heads[0], d_heads[-1]
    headline = {"n_seeds": len(seeds)}
    for key in ("loss_final", "val_loss_final"):
        num, den = gaps[f"gap_d{large}_{key}"], gaps[f"gap_d{small}_{key}"]
        for col in (f"gap_d{small}_{key}", f"gap_d{large}_{key}", f"gap_ratio_{key}"):
            st = describe(gaps[col])
            headline[col] = {k: st[k] for k in ("mean", "sd", "min", "max", "ci95_lo", "ci95_hi")}
        lo, hi = bootstrap_ratio(num, den)
        headline[f"gap_ratio_of_means_{key}"] = {"value": float(num.mean() / den.mean()), "ci95_lo": lo,
                                                 "ci95_hi": hi}
    write_json("metrics/seeds.json", headline)
    write_json("metrics/env/seeds.json", stage_environment(device, [r.read("env.json") for r in records]))
    write_csv("plots/seeds/gaps.csv", gaps.to_dict("records"))

    histories = {(v, s): by[(v, s)].read("history.json") for v in cfg.variants for s in seeds}
    rows = curves(histories, list(cfg.variants))
    write_csv("plots/seeds/curves.csv", rows)
    seed_bands_figure(rows, list(cfg.variants), "plots/seeds/bands.png", len(seeds))
    seed_gaps_figure(gaps.to_dict("records"), small, large, "plots/seeds/gaps.png")

    r = headline["gap_ratio_of_means_loss_final"]
    g = headline["gap_ratio_loss_final"]
    print(f"{len(seeds)} seeds: gap d{small} {headline[f'gap_d{small}_loss_final']['mean']:.3f} "
          f"(sd {headline[f'gap_d{small}_loss_final']['sd']:.3f}), gap d{large} "
          f"{headline[f'gap_d{large}_loss_final']['mean']:.3f} (sd {headline[f'gap_d{large}_loss_final']['sd']:.3f}); "
          f"ratio of mean gaps {r['value']:.2f} [95% {r['ci95_lo']:.2f}, {r['ci95_hi']:.2f}]; "
          f"per-seed ratio {g['mean']:.2f} [95% CI {g['ci95_lo']:.2f}, {g['ci95_hi']:.2f}]")


if __name__ == "__main__":
    run_stage(main)
