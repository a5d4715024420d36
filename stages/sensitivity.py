"""DVC stage `sensitivity`: which unstated choice moves which deviating number, in seed sd?

The source leaves open its weight-decay value and grouping (its snippet is
`AdamW(model.parameters(), ...)`), its warm-up and schedule, the block size of the
failures table, its validation split and its init scheme. Each choice of
`sensitivity.choices` changes ONE of them on top of the train protocol (params `train`)
and is trained at `sensitivity.seeds` for the variants whose numbers deviate from the
published ones (`sensitivity.metrics`): train variants, and the failures table's models
as `failures_<variant>` (`failures_correct`, `failures_mask_zero`, ...; the failures
protocol, 300 steps). The effect of a choice on a metric is the mean over seeds
of its paired difference from the plain protocol at the same seed, in units of the
plain protocol's seed standard deviation (the reference distribution of the seeds and
failures stages; the log scale for attention statistics and scales).

Choice kinds: {optim: {OptimConfig fields}}, {model: {ModelConfig fields}} or
{split: first} (the first 10% of the token stream is the validation set instead of the
last). The failures symptoms are measured as in the failures stage (its summary's
`diag_weight`, rows 1-63 of 64); its second protocol, over rows 0-31 as the source likely
measured, needs no retraining and is a metric of the failures stage itself.

Writes metrics/sensitivity.json (<variant>.<metric>.<choice>: effect_sd, mean, baseline)
and plots/sensitivity/effects.csv (one row per variant, metric and choice).
"""

from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnrepro.experiments.failures import FailuresConfig, SYMPTOMS
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs, model_config, optim_config
from attnrepro.experiments.sensitivity import SENSITIVITY_FAILURES, SensitivityConfig, sensitivity_target
from attnrepro.claims import read_json as read_metrics
from attnrepro.config import ConfigError, from_dict, read_params, require, run_stage
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.io import write_csv, write_json
from attnrepro.runtime import resolve_device
from attnrepro.stats import from_summary
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

def seed_bands(cfg: SensitivityConfig) -> dict:
    """(variant, metric) -> the plain protocol's seed distribution, read before any run starts."""
    files = {"train": "metrics/dist/train.json", "failures": "metrics/dist/failures.json"}
    stats = {k: read_metrics(Path(path))["stats"] for k, path in files.items()}
    bands = {}
    for v, names in cfg.metrics.items():
        for m in names:
            file, name = sensitivity_target(v)
            band = stats[file].get(f"{name}.{m}")
            if band is None or (file == "failures" and m not in SYMPTOMS):
                raise ConfigError(f"sensitivity.metrics.{v}: {m} has no seed distribution in metrics/dist/ that a "
                                  "run records; run the seeds and failures stages first, or name a metric they record")
            bands[(v, m)] = from_summary(band)
    return bands


def first_split(inputs: dict[str, bytes]) -> dict[str, bytes]:
    """The same token stream, with its first len(val) tokens as validation instead of its last."""
    train, val = (np.load(io.BytesIO(inputs[k])) for k in ("train.npy", "val.npy"))
    ids = np.concatenate([train, val])
    out = dict(inputs)
    for name, arr in (("val.npy", ids[:len(val)]), ("train.npy", ids[len(val):])):
        buf = io.BytesIO()
        np.save(buf, arr)
        out[name] = buf.getvalue()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    params = read_params(args.params)
    train = from_dict(TrainConfig, params.get("train"), prefix="train")
    failures = from_dict(FailuresConfig, params.get("failures"), prefix="failures")
    cfg = from_dict(SensitivityConfig, params.get("sensitivity"), prefix="sensitivity")
    for v in cfg.metrics:
        file, name = sensitivity_target(v)
        require(name in (failures.variants if file == "failures" else train.variants), "sensitivity.metrics", v,
                f"a train variant or {SENSITIVITY_FAILURES}<a failures variant>")
    for name, c in cfg.choices.items():
        if "optim" in c:
            optim_config(train, f"sensitivity.choices.{name}.optim", **c["optim"])
    bands = seed_bands(cfg)
    engine = engine_config(params, args.scheduler, args.workers)
    device = resolve_device(train.device, "train.device")
    setup_determinism(train.threads, device)  # the environment record states the runs' thread count
    inputs = corpus_inputs()
    alt = first_split(inputs)

    def spec(variant: str, choice: dict, seed: int, label: str):
        model, optim = choice.get("model", {}), choice.get("optim", {})
        file, name = sensitivity_target(variant)
        if file == "failures":
            return failures.spec(name, seed, device, model=model, label=label, **optim)
        v = {**train.variants[name], **model}
        return train.run(model_config(train.models, v, f"sensitivity.{variant}"), seed, device, label, **optim)

    plan = {"plain": {}, **cfg.choices}
    keys = [(v, c, s) for c in plan for v in cfg.metrics for s in cfg.seeds]
    specs = {k: spec(k[0], plan[k[1]], k[2], f"{k[0]} {k[1]} seed {k[2]}") for k in keys}  # all checked first
    records = {}
    for split in (False, True):  # the runs of each input set are one sweep
        sub = [k for k in keys if ("split" in plan[k[1]]) == split]
        if sub:
            recs = run_sweep(f"sensitivity{' (first split)' if split else ''}", [specs[k] for k in sub],
                             alt if split else inputs, engine)
            require_ok(recs, "sensitivity")
            records.update(zip(sub, recs))

    rows, metrics = [], {}
    for v, names in cfg.metrics.items():
        for m in names:
            b = bands[(v, m)]
            for c in cfg.choices:
                base = [records[(v, "plain", s)].summary()[m] for s in cfg.seeds]
                ours = [records[(v, c, s)].summary()[m] for s in cfg.seeds]
                f = math.log if b.log else (lambda x: x)
                diff = float(np.mean([f(o) - f(p) for o, p in zip(ours, base)]))
                row = {"variant": v, "metric": m, "choice": c,
                       "effect_sd": diff / b.sd if b.sd else (0.0 if diff == 0 else math.copysign(math.inf, diff)),
                       "mean": float(np.mean(ours)), "baseline": float(np.mean(base)), "log_scale": int(b.log)}
                rows.append(row)
                metrics.setdefault(v, {}).setdefault(m, {})[c] = {k: row[k] for k in ("effect_sd", "mean", "baseline")}
    write_json("metrics/sensitivity.json", metrics)
    write_json("metrics/env/sensitivity.json", stage_environment(device, [r.read("env.json") for r in records.values()]))
    write_csv("plots/sensitivity/effects.csv", rows)
    table = pd.DataFrame(rows).pivot_table(index=["variant", "metric"], columns="choice", values="effect_sd")
    print(table.round(1).to_string())


if __name__ == "__main__":
    run_stage(main)
