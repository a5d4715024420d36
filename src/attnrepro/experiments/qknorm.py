"""§1.7.8, §1.26.5: the large model with q, k normalised per head (params `qknorm`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnrepro.config import require
from attnrepro.envinfo import stage_environment
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs, model_config
from attnrepro.formatting import md_table
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import describe, log_scale

METRICS = ("loss_final", "val_loss_final", "entropy_final", "jacobian_fro_final", "logit_std_step0",
           "trained_logit_std_l0")  # and the layer-0 entropy at every train.diag_steps

@dataclass
class QKNormConfig:
    references: list[str]  # train.variants to compare with (the plain scaled and unscaled models)
    forms: dict[str, dict]  # name -> a variant: {model: <preset>, qk_norm: ..., scaled: ...}
    seeds: list[int]

    def validate(self, prefix: str = "qknorm") -> None:
        require(len(self.forms) > 0, f"{prefix}.forms", self.forms, "at least one form")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")


@dataclass
class QKNormResult:
    """What the qknorm stage writes."""
    metrics: dict  # metrics/qknorm.json: per form and reference, seed statistics
    rows: list[dict]  # plots/qknorm/per_seed.csv
    curves: list[dict]  # plots/qknorm/curves.csv: mean training curves per form
    forms: list[str]  # the references, then the forms
    env: dict  # metrics/env/qknorm.json

    def lines(self) -> list[str]:
        out = []
        for n in self.forms:
            m = self.metrics[n]
            out.append(f"{n:22s} loss {m['loss_final']['mean']:.3f} [{m['loss_final']['min']:.3f}, "
                       f"{m['loss_final']['max']:.3f}]  entropy final {m['entropy_final']['mean']:.4f} "
                       f"[{m['entropy_final']['min']:.4f}, {m['entropy_final']['max']:.4f}]  "
                       f"logit std init {m['logit_std_step0']['mean']:.3g}")
        return out


def run(train: TrainConfig, cfg: QKNormConfig, device: str, engine: EngineConfig) -> QKNormResult:
    """The references and every form of qknorm.forms at every seed of qknorm.seeds, as one sweep
    under the train protocol; their statistics over seeds and mean training curves."""
    for name in cfg.references:
        require(name in train.variants, "qknorm.references", name, "names of train.variants")
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
    return QKNormResult(metrics=metrics, rows=rows, curves=wide, forms=list(variants),
                        env=stage_environment(device, records))

# ---------------------------------------------------------------- its part of the report

def report_markdown(metrics: dict) -> str:
    if not metrics:
        return ""
    steps = sorted({k for v in metrics.values() for k in v if k.startswith("entropy_step")}, key=lambda k: int(k[12:]))
    out = ["Mean [min, max] over seeds; the plain scaled and unscaled models are the references (`stages/qknorm.py`).\n"]
    header = ["form", "seeds", "loss final", "val loss", "logit std at init", *(f"entropy, step {k[12:]}" for k in steps),
              "entropy, end", "‖J‖_F, end"]

    def cell(s, digits=3):
        return f"{s['mean']:.{digits}g} [{s['min']:.{digits}g}, {s['max']:.{digits}g}]"

    rows = [[name, v["seeds"], cell(v["loss_final"], 4), cell(v["val_loss_final"], 4), cell(v["logit_std_step0"]),
             *(cell(v[k]) for k in steps), cell(v["entropy_final"]), cell(v["jacobian_fro_final"])]
            for name, v in metrics.items()]
    out += md_table(header, rows)
    return "\n".join(out) + "\n\n"


def answer(metrics, all_metrics, dists) -> str:
    if not metrics:
        return ""
    ok = {k: v for k, v in metrics.items() if "entropy_final" in v and "loss_final" in v}
    if not ok:
        return ""
    saved = sorted(k for k, v in ok.items() if v["entropy_final"]["min"] > 0.1)
    collapsed = sorted(k for k, v in ok.items() if v["entropy_final"]["max"] < 0.1)
    best = min(ok, key=lambda k: (ok[k]["loss_final"]["mean"], k))
    return (f"Final attention stays spread (entropy above 0.1 on every seed) for {', '.join(saved) or 'none'}; it "
            f"ends saturated (below 0.1 on every seed) for {', '.join(collapsed) or 'none'}. The lowest mean final "
            f"loss is {best}'s ({ok[best]['loss_final']['mean']:.3f}).")
