"""DVC stage `qknorm`: had QK-norm been used from the start, what would the failed experiment
have shown? (§1.7.8, §1.26.5)

The chapter's large model (d_head 256) under the train stage's protocol, with q and k
normalised per head before the dot product (attnrepro.attention.QKNorm), in the forms of
`qknorm.forms`: LayerNorm on q and k (ViT-22B; learned scale 1, bias 0 at init) and L2
normalisation with a learned gain (Henry et al. 2020; gain initialised to log2(block^2 -
block) = 11.98 at block 64, their heuristic), each on top of the 1/sqrt(d_k) and in place
of it. The plain scaled and unscaled models at the same seeds are the references (the
seeds stage's runs, shared through the run store). Note the form matters: LayerNorm'd q and
k without any scale give logits of std about sqrt(d_k) = 16 at init.

Writes metrics/qknorm.json (per form and reference: loss, entropy, Jacobian and logit
statistics over seeds), plots/qknorm/per_seed.csv, plots/qknorm/curves.csv (mean training
curves per form) and plots/qknorm/forms.png.
"""

from __future__ import annotations

import argparse

import pandas as pd

from attnrepro.experiments.protocol import TrainConfig, corpus_inputs, model_config
from attnrepro.experiments.qknorm import QKNormConfig
from attnrepro.config import from_dict, read_params, require, run_stage
from attnrepro.figures import qknorm_figure
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.io import write_csv, write_json
from attnrepro.runtime import resolve_device
from attnrepro.stats import describe, log_scale
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

METRICS = ("loss_final", "val_loss_final", "entropy_final", "jacobian_fro_final", "logit_std_step0",
           "trained_logit_std_l0")  # and the layer-0 entropy at every train.diag_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    params = read_params(args.params)
    train = from_dict(TrainConfig, params.get("train"), prefix="train")
    cfg = from_dict(QKNormConfig, params.get("qknorm"), prefix="qknorm")
    for name in cfg.references:
        require(name in train.variants, "qknorm.references", name, "names of train.variants")
    engine = engine_config(params, args.scheduler, args.workers)
    device = resolve_device(train.device, "train.device")
    setup_determinism(train.threads, device)  # the environment record states the runs' thread count

    variants = {**{r: train.variants[r] for r in cfg.references}, **cfg.forms}
    models = {n: model_config(train.models, v, f"qknorm.forms.{n}") for n, v in variants.items()}
    keys = [(n, s) for s in cfg.seeds for n in variants]
    records = run_sweep("qknorm", [train.run(models[n], s, device, f"{n} seed {s}") for n, s in keys],
                        corpus_inputs(), engine)
    require_ok(records, "qknorm")
    by = dict(zip(keys, records))

    names = [*METRICS, *(f"entropy_step{s}" for s in sorted(train.diag_steps) if 0 < s < train.steps)]
    rows = [{"form": n, "seed": s, **{k: by[(n, s)].summary()[k] for k in names}} for n, s in keys]
    df = pd.DataFrame(rows)
    metrics = {}
    for n in variants:
        g = df[df.form == n]
        metrics[n] = {"seeds": len(g)}
        for k in names:
            st = describe(g[k], log=log_scale(k))
            metrics[n][k] = {q: st[q] for q in ("mean", "sd", "min", "max", "ci95_lo", "ci95_hi")}
    hist = pd.DataFrame([{"form": n, **r} for (n, s), rec in by.items() for r in rec.read("history.json")])
    curves = hist.groupby(["form", "step"])[["loss", "entropy_l0"]].mean().unstack("form")
    wide = [{"step": int(step), **{f"{n}_{c}": (None if pd.isna(row[(c, n)]) else float(row[(c, n)]))
                                   for c in ("loss", "entropy_l0") for n in variants}}
            for step, row in curves.iterrows()]
    write_json("metrics/qknorm.json", metrics)
    write_json("metrics/env/qknorm.json", stage_environment(device, [r.read("env.json") for r in records]))
    write_csv("plots/qknorm/per_seed.csv", rows)
    write_csv("plots/qknorm/curves.csv", wide)
    qknorm_figure(wide, list(variants), "plots/qknorm/forms.png", len(cfg.seeds))
    for n in variants:
        m = metrics[n]
        print(f"{n:22s} loss {m['loss_final']['mean']:.3f} [{m['loss_final']['min']:.3f}, {m['loss_final']['max']:.3f}]  "
              f"entropy final {m['entropy_final']['mean']:.4f} "
              f"[{m['entropy_final']['min']:.4f}, {m['entropy_final']['max']:.4f}]  "
              f"logit std init {m['logit_std_step0']['mean']:.3g}")


if __name__ == "__main__":
    run_stage(main)
