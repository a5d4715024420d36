"""Exercises 1-2 (§1.20.1-2): the loss gap vs d_head under the train protocol (params `critical`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pandas as pd

from ..config import from_dict, require
from ..envinfo import stage_environment
from ..model import ModelConfig
from ..stats import ALPHA, describe, log_scale, onset_interval, paired_t_p
from ..engine import EngineConfig
from ..sweep import require_ok, run_sweep
from .protocol import TrainConfig, corpus_inputs

METRICS = ("loss_final", "val_loss_final", "entropy_final", "logit_std_step0", "trained_logit_std_l0")

@dataclass
class CriticalConfig:
    d_heads: list[int]  # increasing; the first is the baseline of the onset
    min_d_model: int  # d_model = the smallest multiple of d_head >= min_d_model
    seeds: list[int]

    def validate(self, prefix: str = "critical") -> None:
        require(len(self.d_heads) >= 3 and self.d_heads == sorted(set(self.d_heads)) and self.d_heads[0] > 0,
                f"{prefix}.d_heads", self.d_heads, "at least 3 increasing positive integers")
        require(self.min_d_model > 0, f"{prefix}.min_d_model", self.min_d_model, "a positive integer")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")


def critical_model(base: dict, d_head: int, min_d_model: int, **switches) -> ModelConfig:
    """A model of the critical-d_head sweep (exercise 2): the preset `base` with d_model the smallest multiple
    of d_head that is at least min_d_model, and n_head = d_model / d_head (vocab_size None, from the data)."""
    d_model = d_head * -(-min_d_model // d_head)
    spec = {**base, "d_model": d_model, "n_head": d_model // d_head, **switches, "vocab_size": None}
    return from_dict(ModelConfig, spec, prefix=f"critical.d_head {d_head}")


@dataclass
class CriticalResult:
    """What the critical stage writes."""
    metrics: dict  # metrics/critical.json: per d_head (seed statistics), exercise 1, the onset
    curve: list[dict]  # plots/critical/curve.csv: per d_head, mean, min and max
    rows: list[dict]  # plots/critical/per_seed.csv: per seed and d_head
    onset: Optional[tuple[float, float]]  # (d_head before, d_head at) the onset; None: not within the grid
    env: dict  # metrics/env/critical.json

    def lines(self) -> list[str]:
        out = [f"d_head {row['d_head']:4d}: gap {row['gap_loss_final_mean']:.3f} "
               f"[{row['gap_loss_final_min']:.3f}, {row['gap_loss_final_max']:.3f}]  "
               f"entropy unscaled {row['unscaled_entropy_final_mean']:.4f} "
               f"scaled {row['scaled_entropy_final_mean']:.4f}" for row in self.curve]
        first = self.curve[0]["d_head"]
        where = (f"d_head in ({self.onset[0]:.0f}, {self.onset[1]:.0f}]" if self.onset
                 else "not within the grid")
        return out + [f"onset (the first d_head whose mean gap's 95% lower bound exceeds d_head {first}'s upper "
                      f"bound): {where}"]


def run(train: TrainConfig, cfg: CriticalConfig, device: str, engine: EngineConfig) -> CriticalResult:
    """Scaled and unscaled models at every d_head of critical.d_heads and seed of critical.seeds, as one
    sweep under the train protocol; the gap curve, its onset and exercise 1."""
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
    where = onset_interval(cfg.d_heads, gaps.to_numpy())
    metrics["onset"] = {"reached": int(where is not None), "alpha": ALPHA,
                        **({"after_d_head": where[0], "by_d_head": where[1]} if where else {})}
    for d in cfg.d_heads[1:]:  # the seeds are shared across d_head: a paired test
        metrics[f"d{d}"][f"gap_vs_d{first}_paired_p"] = paired_t_p(gaps[first], gaps[d])
    if 2 * first in cfg.d_heads:  # exercise 1: halving the heads at the same d_model
        ratio = df[df.d_head == 2 * first].set_index("seed")["unscaled_logit_std_step0"] / \
            df[df.d_head == first].set_index("seed")["unscaled_logit_std_step0"]
        st = describe(ratio)
        metrics["exercise1"] = {"logit_std_ratio_step0": {k: st[k] for k in ("mean", "min", "max")},
                                "gap_loss_final": metrics[f"d{2 * first}"]["gap_loss_final"]}
    return CriticalResult(metrics=metrics, curve=curve, rows=rows, onset=where, env=stage_environment(device, runs))
