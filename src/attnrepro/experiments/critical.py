"""Exercises 1-2 (§1.20.1-2): the loss gap against the width under the train protocol (params `critical`).

Two designs, one sweep (docs/CRITICAL.md argues them and their cost):

  one variable   critical.one_variable: one train.models preset (the large model) with its per-head q/k
                 width d_qk (the d_k of 1/sqrt(d_k)) on a grid; d_model, n_head, the value width and every
                 other weight stay the preset's. The onset is read here.
  mixed width    critical.d_heads: d_model = the smallest multiple of d_head >= critical.min_d_model and
                 n_head = d_model / d_head, so d_model and n_head move with d_head (the chapter's suggested
                 grid; exercise 1 is its d_head-64 point). Kept, labelled for what it is.

The chapter's four train.variants at the one-variable seeds are the reference points (the seeds stage's
own runs, shared through the run store).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pandas as pd

from attnrepro.config import from_dict, require
from attnrepro.envinfo import stage_environment
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.model.transformer import ModelConfig
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import (ALPHA, curve_shape, describe, find_modes, gap_groups, holm_adjusted, log_scale,
                             onset_interval, paired_onset, paired_t_p, trend)

METRICS = ("loss_final", "val_loss_final", "entropy_final", "logit_std_step0", "trained_logit_std_l0",
           "entropy_final_l1", "trained_logit_std_l1")
SERIES = ("gap_loss_final", "scaled_loss_final", "unscaled_loss_final")  # the curves whose trends are tested


@dataclass
class OneVariableConfig:
    model: str  # a train.models preset: its d_model, n_head and value width stay fixed
    d_qks: list[int]  # increasing per-head q/k widths; the first is the baseline of the onset
    seeds: list[int]
    mode_statistic: str  # each arm's seeds at each width are tested for two modes on it (stats.find_modes)

    def validate(self, prefix: str = "critical.one_variable") -> None:
        require(len(self.d_qks) >= 3 and self.d_qks == sorted(set(self.d_qks)) and self.d_qks[0] > 0,
                f"{prefix}.d_qks", self.d_qks, "at least 3 increasing positive integers")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")


@dataclass
class CriticalConfig:
    one_variable: OneVariableConfig
    d_heads: list[int]  # the mixed-width curve: increasing; the first is the baseline of its onset
    min_d_model: int  # d_model = the smallest multiple of d_head >= min_d_model
    seeds: list[int]  # the mixed-width curve's seeds

    def validate(self, prefix: str = "critical") -> None:
        require(len(self.d_heads) >= 3 and self.d_heads == sorted(set(self.d_heads)) and self.d_heads[0] > 0,
                f"{prefix}.d_heads", self.d_heads, "at least 3 increasing positive integers")
        require(self.min_d_model > 0, f"{prefix}.min_d_model", self.min_d_model, "a positive integer")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")


def critical_model(base: dict, d_head: int, min_d_model: int, **switches) -> ModelConfig:
    """A model of the mixed-width curve: the preset `base` with d_model the smallest multiple of d_head that
    is at least min_d_model, and n_head = d_model / d_head (vocab_size None, from the data)."""
    d_model = d_head * -(-min_d_model // d_head)
    spec = {**base, "d_model": d_model, "n_head": d_model // d_head, **switches, "vocab_size": None}
    return from_dict(ModelConfig, spec, prefix=f"critical.d_head {d_head}")


def qk_model(base: dict, d_qk: int, **switches) -> ModelConfig:
    """A model of the one-variable curve: the preset `base` with per-head q/k width d_qk; everything else
    (d_model, n_head, the value width) the preset's. At d_qk = d_head it is the preset itself (one run key)."""
    return from_dict(ModelConfig, {**base, "d_qk": d_qk, **switches, "vocab_size": None},
                     prefix=f"critical.one_variable.d_qk {d_qk}")


@dataclass
class CriticalResult:
    """What the critical stage writes."""
    metrics: dict  # metrics/critical.json: the mixed-width curve at the top (as before), the one-variable one under d_qk
    curve: list[dict]  # plots/critical/curve.csv: the mixed-width curve, per d_head: mean, min and max
    rows: list[dict]  # plots/critical/per_seed.csv: the mixed-width curve per seed and d_head
    qk_curve: list[dict]  # plots/critical/qk_curve.csv: the one-variable curve, per d_qk: mean, min and max
    qk_rows: list[dict]  # plots/critical/qk_per_seed.csv: the one-variable curve per seed and d_qk
    references: list[dict]  # plots/critical/references.csv: the chapter's models per seed (gap, logit std at init)
    onset: Optional[tuple[float, float]]  # mixed width: (d_head before, d_head at) the onset; None: not in the grid
    qk_onset: Optional[tuple[float, float]]  # one variable: (d_qk before, d_qk at) the onset; None: not in the grid
    env: dict  # metrics/env/critical.json

    def lines(self) -> list[str]:
        q = self.metrics["d_qk"]
        out = [f"one variable ({q['model']}: d_model {q['d_model']}, n_head {q['n_head']}, v width {q['d_head']}; "
               f"{q['seeds']} seeds):"]
        out += [f"  d_qk {row['d_qk']:4d}: gap {row['gap_loss_final_mean']:.3f} "
                f"[{row['gap_loss_final_min']:.3f}, {row['gap_loss_final_max']:.3f}]  unscaled logit std at init "
                f"{row['unscaled_logit_std_step0_mean']:.3f}" for row in self.qk_curve]
        first = self.qk_curve[0]["d_qk"]
        out.append(f"  onset (the first d_qk whose mean gap's 95% lower bound exceeds d_qk {first}'s upper bound): "
                   + (f"d_qk in ({self.qk_onset[0]:.0f}, {self.qk_onset[1]:.0f}]" if self.qk_onset
                      else "not within the grid"))
        sh, po = q["reading"]["shape"], q["reading"]["paired_onset"]
        out.append("  paired onset: " + (f"d_qk in ({po['after_d_qk']:.0f}, {po['by_d_qk']:.0f}]" if po["reached"]
                                         else "none") + f"; shape: {sh['shape']}")
        out.append(f"mixed width (d_model and n_head move with d_head; {self.metrics['seeds']} seeds):")
        out += [f"  d_head {row['d_head']:4d}: gap {row['gap_loss_final_mean']:.3f} "
                f"[{row['gap_loss_final_min']:.3f}, {row['gap_loss_final_max']:.3f}]  "
                f"entropy unscaled {row['unscaled_entropy_final_mean']:.4f} "
                f"scaled {row['scaled_entropy_final_mean']:.4f}" for row in self.curve]
        first = self.curve[0]["d_head"]
        where = (f"d_head in ({self.onset[0]:.0f}, {self.onset[1]:.0f}]" if self.onset
                 else "not within the grid")
        return out + [f"  onset (the first d_head whose mean gap's 95% lower bound exceeds d_head {first}'s upper "
                      f"bound): {where}"]


def pair_row(sc: dict, un: dict) -> dict:
    """One seed at one grid point: the gaps (unscaled - scaled) and both arms' metrics."""
    return {"gap_loss_final": un["loss_final"] - sc["loss_final"],
            "gap_val_loss_final": un["val_loss_final"] - sc["val_loss_final"],
            **{f"scaled_{k}": sc[k] for k in METRICS}, **{f"unscaled_{k}": un[k] for k in METRICS}}


def curve_stats(df: pd.DataFrame, x: str, extra: tuple[str, ...] = (),
                groups: Optional[dict] = None) -> tuple[dict, list[dict]]:
    """Per grid point x: every column's seed statistics (metrics) and its mean, min and max (the curve's
    CSV rows). groups: {(x, column prefix): the seeds of each mode} where the seeds fall into modes."""
    metrics, curve = {}, []
    for d, g in df.groupby(x):
        entry = {k: int(g[k].iloc[0]) for k in extra}
        row = {x: int(d)}
        seeds = list(g["seed"])
        for col in [c for c in df.columns if c not in ("seed", x, *extra)]:
            arm = "gap" if col.startswith("gap_") else col.split("_", 1)[0]
            modes = (groups or {}).get((int(d), arm), [])
            st = describe(g[col], log=log_scale(col), groups=[[seeds.index(s) for s in m] for m in modes])
            entry[col] = {k: st[k] for k in ("mean", "sd", "min", "max", "ci95_lo", "ci95_hi", "modes", "mode_sd")
                          if k in st}
            row.update({f"{col}_mean": st["mean"], f"{col}_min": st["min"], f"{col}_max": st["max"]})
        metrics[int(d)] = entry
        curve.append(row)
    return metrics, curve


def onset_entry(grid: list[int], gaps: pd.DataFrame, name: str) -> tuple[dict, Optional[tuple[float, float]]]:
    """The onset rule (stats.onset_interval) on a paired gap table (seed x grid), as a metrics entry."""
    where = onset_interval(grid, gaps[grid].to_numpy())
    return ({"reached": int(where is not None), "alpha": ALPHA,
             **({f"after_{name}": where[0], f"by_{name}": where[1]} if where else {})}, where)


def reading(grid: list[int], df: pd.DataFrame, x: str) -> dict:
    """The curve read as it is (docs/CRITICAL.md, "Reading the curve"; fixed before the grid's points 10,
    12 and 14 were run): the paired onset of the gap above the first grid point (stats.paired_onset, Holm
    over the len(grid) - 1 comparisons) with the unscaled logit std at init on either side of it; the gap's
    shape after it (stats.curve_shape); the trend per doubling of x of the gap and of each arm's final
    loss, over the whole grid and from the onset on (stats.trend), Holm over those tests."""
    def table(col):
        return df.pivot(index="seed", columns=x, values=col)[grid].to_numpy()

    where, p_holm = paired_onset(grid, table("gap_loss_final"))
    at = grid.index(int(where[1])) if where else None
    logit = table("unscaled_logit_std_step0").mean(axis=0)
    onset = {"reached": int(at is not None), "alpha": ALPHA,
             **({f"after_{x}": where[0], f"by_{x}": where[1], "logit_std_after": float(logit[at - 1]),
                 "logit_std_by": float(logit[at])} if at is not None else {}),
             "p_holm": {f"{x}{d}": p for d, p in zip(grid[1:], p_holm)}}
    shape = curve_shape(grid, table("gap_loss_final"), at)
    trends = {f"{col}_all": trend(grid, table(col)) for col in SERIES}
    if at is not None and len(grid) - at >= 3:
        trends.update({f"{col}_after_onset": trend(grid[at:], table(col)[:, at:]) for col in SERIES})
    shape.pop("after", None)  # the same test as trends' gap_loss_final_after_onset
    for t, p in zip(trends.values(), holm_adjusted([t["p"] for t in trends.values()])):
        t["p_holm"] = p
    return {"paired_onset": onset, "shape": shape, "trend": trends}


def arm_modes(runs: dict, grid: list[int], seeds: list[int], statistic: str) -> dict:
    """Each arm's seeds at each grid point tested for two modes on `statistic` (stats.find_modes), at
    ALPHA family-wise over the 2 x len(grid) tests (Bonferroni), as the seeds stage tests its variants.
    runs: {(grid point, scaled, seed): summary}."""
    alpha = ALPHA / (2 * len(grid))
    out = {}
    for d in grid:
        for scaled in (True, False):
            out[(d, "scaled" if scaled else "unscaled")] = find_modes(
                {s: runs[(d, scaled, s)][statistic] for s in seeds}, alpha, log_scale(statistic), statistic)
    return out


def planned(train: TrainConfig, cfg: CriticalConfig, device: str = "cpu") -> tuple[list, list, list, list]:
    """The sweep's points and its run specs, in order: the mixed-width curve (d_head, scaled, seed), the
    one-variable curve (d_qk, scaled, seed), the chapter's variants at the one-variable seeds (variant, seed)."""
    ov = cfg.one_variable
    require(ov.model in train.models, "critical.one_variable.model", ov.model,
            "one of train.models: " + ", ".join(sorted(train.models)))
    mixed_base = train.models[train.variants[next(iter(train.variants))]["model"]]
    qk_base = train.models[ov.model]
    mixed = [(d, sc, s) for s in cfg.seeds for d in cfg.d_heads for sc in (True, False)]
    qk = [(d, sc, s) for s in ov.seeds for d in ov.d_qks for sc in (True, False)]
    refs = [(v, s) for s in ov.seeds for v in train.variants]
    arm = lambda sc: "scaled" if sc else "unscaled"  # noqa: E731
    specs = ([train.run(critical_model(mixed_base, d, cfg.min_d_model, scaled=sc), s, device,
                        f"mixed width d_head {d} {arm(sc)} seed {s}") for d, sc, s in mixed]
             + [train.run(qk_model(qk_base, d, scaled=sc), s, device, f"d_qk {d} {arm(sc)} seed {s}")
                for d, sc, s in qk]
             + [train.spec(v, s, device) for v, s in refs])
    return mixed, qk, refs, specs


def planned_runs(train: TrainConfig, cfg: CriticalConfig) -> int:
    """The distinct runs the sweep trains: a spec two designs share (the preset itself at d_qk = its d_head,
    the small preset at the mixed curve's first d_head) is one run in the store."""
    return len({json.dumps(spec.key_material(), sort_keys=True) for spec in planned(train, cfg)[3]})


def run(train: TrainConfig, cfg: CriticalConfig, device: str, engine: EngineConfig) -> CriticalResult:
    """Both designs and the chapter's models, scaled and unscaled at every grid point and seed, as one sweep
    under the train protocol; the gap curves, their onsets, the modes, exercise 1."""
    ov = cfg.one_variable
    mixed_base = train.models[train.variants[next(iter(train.variants))]["model"]]
    qk_base = train.models[ov.model]
    mixed, qk, refs, specs = planned(train, cfg, device)
    runs = run_sweep("critical", specs, corpus_inputs(), engine)
    require_ok(runs, "critical")
    summaries = [r.summary() for r in runs]
    by_mixed = dict(zip(mixed, summaries[:len(mixed)]))
    by_qk = dict(zip(qk, summaries[len(mixed):len(mixed) + len(qk)]))
    by_ref = dict(zip(refs, summaries[len(mixed) + len(qk):]))

    # the mixed-width curve (metrics at the top level, as before this design was added)
    rows = [{"seed": s, "d_head": d, "d_model": critical_model(mixed_base, d, cfg.min_d_model).d_model,
             **pair_row(by_mixed[(d, True, s)], by_mixed[(d, False, s)])} for s in cfg.seeds for d in cfg.d_heads]
    df = pd.DataFrame(rows)
    per_point, curve = curve_stats(df, "d_head", extra=("d_model",))
    metrics = {"seeds": len(cfg.seeds), "runs": len({r.key for r in runs}),  # distinct: a run two points share once
               **{f"d{d}": e for d, e in per_point.items()}}
    first = cfg.d_heads[0]
    gaps = df.pivot(index="seed", columns="d_head", values="gap_loss_final")
    metrics["onset"], where = onset_entry(cfg.d_heads, gaps, "d_head")
    for d in cfg.d_heads[1:]:  # the seeds are shared across d_head: a paired test
        metrics[f"d{d}"][f"gap_vs_d{first}_paired_p"] = paired_t_p(gaps[first], gaps[d])
    metrics["reading"] = reading(cfg.d_heads, df, "d_head")
    if 2 * first in cfg.d_heads:  # exercise 1: halving the heads at the same d_model
        ratio = df[df.d_head == 2 * first].set_index("seed")["unscaled_logit_std_step0"] / \
            df[df.d_head == first].set_index("seed")["unscaled_logit_std_step0"]
        st = describe(ratio)
        metrics["exercise1"] = {"logit_std_ratio_step0": {k: st[k] for k in ("mean", "min", "max")},
                                "gap_loss_final": metrics[f"d{2 * first}"]["gap_loss_final"]}

    # the one-variable curve: only d_qk moves
    modes = arm_modes(by_qk, ov.d_qks, ov.seeds, ov.mode_statistic)
    groups = {}
    for d in ov.d_qks:
        for a in ("scaled", "unscaled"):
            groups[(d, a)] = modes[(d, a)].groups if len(modes[(d, a)].groups) > 1 else []
        groups[(d, "gap")] = gap_groups(modes[(d, "scaled")].groups, modes[(d, "unscaled")].groups, len(ov.seeds))
    qk_rows = [{"seed": s, "d_qk": d, **pair_row(by_qk[(d, True, s)], by_qk[(d, False, s)])}
               for s in ov.seeds for d in ov.d_qks]
    qdf = pd.DataFrame(qk_rows)
    q_point, qk_curve = curve_stats(qdf, "d_qk", groups=groups)
    probe = qk_model(qk_base, ov.d_qks[0])
    q = {"model": ov.model, "d_model": probe.d_model, "n_head": probe.n_head, "d_head": probe.d_head,
         "seeds": len(ov.seeds), **{f"dqk{d}": e for d, e in q_point.items()}}
    qgaps = qdf.pivot(index="seed", columns="d_qk", values="gap_loss_final")
    q["onset"], qk_where = onset_entry(ov.d_qks, qgaps, "d_qk")
    b = q[f"dqk{ov.d_qks[0]}"]["gap_loss_final"]  # the rule reads a rise from here: is the baseline gap itself > 0?
    q["onset"]["baseline_gap_above_zero"] = int(b["ci95_lo"] > 0)
    for d in ov.d_qks[1:]:
        q[f"dqk{d}"][f"gap_vs_dqk{ov.d_qks[0]}_paired_p"] = paired_t_p(qgaps[ov.d_qks[0]], qgaps[d])
    for d in ov.d_qks:
        q[f"dqk{d}"]["modes"] = {a: {"n_modes": len(m.groups), "gap_ratio": m.ratio, "p": m.p, "alpha": m.alpha,
                                     "statistic": m.statistic, "seeds": [list(g) for g in m.groups]}
                                 for (dd, a), m in modes.items() if dd == d}
    q["reading"] = reading(ov.d_qks, qdf, "d_qk")
    metrics["d_qk"] = q

    # the chapter's models as reference points: its variants' gaps, paired by d_head and seed
    references = []
    for s in ov.seeds:
        pairs: dict[int, dict] = {}
        for v in train.variants:
            spec_model = runs[len(mixed) + len(qk) + refs.index((v, s))].spec.model
            pairs.setdefault(spec_model.d_head, {})[spec_model.scaled] = (v, spec_model)
        for d, p in sorted(pairs.items()):
            if set(p) == {True, False}:
                name = train.variants[p[True][0]]["model"]
                references.append({"seed": s, "model": name, "d_head": d, "d_model": p[True][1].d_model,
                                   "n_head": p[True][1].n_head,
                                   **pair_row(by_ref[(p[True][0], s)], by_ref[(p[False][0], s)])})
    return CriticalResult(metrics=metrics, curve=curve, rows=rows, qk_curve=qk_curve, qk_rows=qk_rows,
                          references=references, onset=where, qk_onset=qk_where,
                          env=stage_environment(device, runs))

# ---------------------------------------------------------------- its part of the report (the rest: report/critical_curve.py)

def answer_exercise3(metrics, all_metrics, dists) -> str:
    c = (all_metrics.get("heads") or {}).get("conditional")
    if not c:
        return ""
    above = c["distance_std"] > c["uniform_distance_std"]
    return (f"The most conditional head is l{c['layer']}h{c['head']} (centroid spread {c['distance_std']:.2f} over "
            f"positions), {'above' if above else 'below'} the {c['uniform_distance_std']:.2f} that uniform causal "
            f"attention shows from the growth of i alone: "
            + ("a conditional head exists." if above else "by this measure no head of this model is conditional."))
