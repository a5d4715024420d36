"""One-factor changes of the choices the chapter leaves open, in seed sd (params `sensitivity`)."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import ConfigError, require
from ..envinfo import stage_environment
from ..io import read_json
from ..runspec import RunSpec
from ..stats import Band, from_summary
from ..engine import EngineConfig
from ..sweep import require_ok, run_sweep
from .failures import SYMPTOMS, FailuresConfig
from .protocol import TrainConfig, corpus_inputs, model_config, optim_config

SENSITIVITY_FAILURES = "failures_"  # a sensitivity variant failures_<bug> names a model of the failures table


def sensitivity_target(variant: str) -> tuple[str, str]:
    """(metrics file, variant there) that a sensitivity variant names: ("failures", bug) for
    failures_<bug>, else ("train", variant)."""
    if variant.startswith(SENSITIVITY_FAILURES):
        return "failures", variant[len(SENSITIVITY_FAILURES):]
    return "train", variant


@dataclass
class SensitivityConfig:
    seeds: list[int]
    choices: dict[str, dict]  # name -> {optim: {...}} | {model: {...}} | {split: first}
    metrics: dict[str, list[str]]  # train variant or failures_<variant> -> the deviating metrics

    def validate(self, prefix: str = "sensitivity") -> None:
        require(len(self.seeds) >= 2 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 2 different seeds")
        require(bool(self.choices) and "plain" not in self.choices, f"{prefix}.choices", sorted(self.choices),
                "at least one choice, none named 'plain' (the unchanged protocol's name)")
        require(bool(self.metrics) and all(self.metrics.values()), f"{prefix}.metrics", self.metrics,
                "at least one variant, each with at least one metric")
        for name, c in self.choices.items():
            require(isinstance(c, dict) and len(c) == 1 and next(iter(c)) in ("optim", "model", "split"),
                    f"{prefix}.choices.{name}", c, "one of {optim: {...}}, {model: {...}}, {split: first}")
            if "split" in c:
                require(c["split"] == "first", f"{prefix}.choices.{name}.split", c["split"], "first")
            else:
                kind = next(iter(c))
                require(isinstance(c[kind], dict) and bool(c[kind]), f"{prefix}.choices.{name}.{kind}", c[kind],
                        f"a mapping of {'OptimConfig' if kind == 'optim' else 'ModelConfig'} fields")


def seed_bands(cfg: SensitivityConfig) -> dict[tuple[str, str], Band]:
    """(variant, metric) -> the plain protocol's seed distribution, read before any run starts."""
    files = {"train": "metrics/dist/train.json", "failures": "metrics/dist/failures.json"}
    stats = {k: read_json(Path(path))["stats"] for k, path in files.items()}
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


def effect(ours: list[float], base: list[float], band: Band) -> dict:
    """The mean paired difference of `ours` from `base` (same seeds) in units of the seed sd."""
    f = math.log if band.log else (lambda x: x)
    diff = float(np.mean([f(o) - f(p) for o, p in zip(ours, base)]))
    return {"effect_sd": diff / band.sd if band.sd else (0.0 if diff == 0 else math.copysign(math.inf, diff)),
            "mean": float(np.mean(ours)), "baseline": float(np.mean(base)), "log_scale": int(band.log)}


@dataclass
class SensitivityResult:
    """What the sensitivity stage writes."""
    metrics: dict  # metrics/sensitivity.json: <variant>.<metric>.<choice>: effect_sd, mean, baseline
    rows: list[dict]  # plots/sensitivity/effects.csv: one row per variant, metric and choice
    env: dict  # metrics/env/sensitivity.json

    def table(self) -> str:
        """effect_sd per (variant, metric) and choice, to one decimal."""
        table = pd.DataFrame(self.rows).pivot_table(index=["variant", "metric"], columns="choice", values="effect_sd")
        return table.round(1).to_string()


def run(train: TrainConfig, failures: FailuresConfig, cfg: SensitivityConfig, device: str,
        engine: EngineConfig) -> SensitivityResult:
    """Every choice of sensitivity.choices and the plain protocol, for every variant of sensitivity.metrics
    at every seed of sensitivity.seeds (one sweep per input set); each choice's effect in seed sd.
    The params and the seed distributions are checked before any run starts."""
    for v in cfg.metrics:
        file, name = sensitivity_target(v)
        require(name in (failures.variants if file == "failures" else train.variants), "sensitivity.metrics", v,
                f"a train variant or {SENSITIVITY_FAILURES}<a failures variant>")
    for name, c in cfg.choices.items():
        if "optim" in c:
            optim_config(train, f"sensitivity.choices.{name}.optim", **c["optim"])
    bands = seed_bands(cfg)
    inputs = corpus_inputs()
    alt = first_split(inputs)

    def spec(variant: str, choice: dict, seed: int, label: str) -> RunSpec:
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
            for c in cfg.choices:
                base = [records[(v, "plain", s)].summary()[m] for s in cfg.seeds]
                ours = [records[(v, c, s)].summary()[m] for s in cfg.seeds]
                row = {"variant": v, "metric": m, "choice": c, **effect(ours, base, bands[(v, m)])}
                rows.append(row)
                metrics.setdefault(v, {}).setdefault(m, {})[c] = {k: row[k] for k in ("effect_sd", "mean", "baseline")}
    return SensitivityResult(metrics=metrics, rows=rows,
                             env=stage_environment(device, list(records.values())))
