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
from attnrepro.formatting import fmt_number, md_table, zero_note
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

# ---------------------------------------------------------------- its part of the report

def _modes_note(e: dict) -> str:
    """'2 modes (seeds ...)' per arm where an arm's seeds fall into two modes at a grid point, else ''."""
    out = [f"{a}: {v['n_modes']} modes (seeds {' vs '.join(', '.join(map(str, g)) for g in v['seeds'])})"
           for a, v in sorted((e.get("modes") or {}).items()) if v.get("n_modes", 1) > 1]
    return "; ".join(out)


SHAPES = {"plateau": "a rise up to the onset, then a plateau",
          "rising": "a rise up to the onset, and still rising after it",
          "falling": "a rise up to the onset, then falling",
          "undetermined": "a rise up to the onset, then no trend shown either way, though a further change as "
                          "large as that rise is not ruled out",
          "too few points": "an onset too near the grid's end to read a trend after it",
          "no onset": "no onset shown"}


def _trend_text(t: dict) -> str:
    return f"{t['slope']:+.3f} [{t['ci_lo']:+.3f}, {t['ci_hi']:+.3f}] (p {t['p']:.2g}, Holm {t['p_holm']:.2g})"


def reading_summary(r: dict, x: str = "d_qk") -> str:
    """The reading in one clause: the shape, the paired onset with its logit std at init, the step, the trend after."""
    o, sh = r["paired_onset"], r["shape"]
    text = SHAPES[sh["shape"]]
    if o["reached"]:
        text += (f": its onset by the paired rule is {x} in ({o[f'after_{x}']:.0f}, {o[f'by_{x}']:.0f}] (unscaled "
                 f"logit std at init {o['logit_std_after']:.3f} to {o['logit_std_by']:.3f})")
    if "step" in sh:
        text += f", a step of {sh['step']:.3f} [{sh['step_ci_lo']:.3f}, {sh['step_ci_hi']:.3f}] nats"
    after = r["trend"].get("gap_loss_final_after_onset")
    if after:
        text += f", then {_trend_text(after)} nats per doubling"
    return text


def reading_markdown(r: dict, x: str, first: int) -> str:
    """`reading`'s sentences: the paired onset with its logit std at init, the shape, the trends."""
    o, sh, tr = r["paired_onset"], r["shape"], r["trend"]
    if not o["reached"]:
        return (f"By the paired rule no {x} of the grid is shown to have a gap above the first point's (one-sided "
                f"paired t, Holm over the {len(o['p_holm'])} later points): no onset shown. Trends per doubling of "
                f"{x} over the grid, nats [95% interval]: gap {_trend_text(tr['gap_loss_final_all'])}.")
    text = (f"By the paired rule (the first {x} whose gap exceeds that of the grid's first point, one-sided paired t, "
            f"Holm over the {len(o['p_holm'])} later points) the onset is **{x} in ({o[f'after_{x}']:.0f}, "
            f"{o[f'by_{x}']:.0f}]**, where the unscaled logit std at init goes from {o['logit_std_after']:.3f} to "
            f"{o['logit_std_by']:.3f}. Read as it is, the curve shows **{SHAPES[sh['shape']]}**")
    if "step" in sh:
        text += (f": a step of {sh['step']:.3f} [{sh['step_ci_lo']:.3f}, {sh['step_ci_hi']:.3f}] nats from "
                 f"{x} {first}")
    if "most_change_after" in sh and sh["shape"] in ("plateau", "undetermined"):  # a bound, not a rising trend
        text += (f", then at most {sh['most_change_after']:.3f} more either way over the rest of the grid (the "
                 "trend's 95% bounds)")
    text += (f". Trends in nats per doubling of {x} [95% interval, unadjusted; the shape reads it], with their p and "
             f"Holm's over the {len(tr)} trend tests; over the "
             f"whole grid: gap {_trend_text(tr['gap_loss_final_all'])}, scaled loss "
             f"{_trend_text(tr['scaled_loss_final_all'])}, unscaled loss {_trend_text(tr['unscaled_loss_final_all'])}")
    if "gap_loss_final_after_onset" in tr:
        text += (f"; from the onset on: gap {_trend_text(tr['gap_loss_final_after_onset'])}, scaled loss "
                 f"{_trend_text(tr['scaled_loss_final_after_onset'])}, unscaled loss "
                 f"{_trend_text(tr['unscaled_loss_final_after_onset'])}")
    return text + "."


def one_variable_markdown(q: dict, mixed: dict) -> list[str]:
    """The one-variable curve: design, cost, table, its reading and onset (metrics critical.d_qk)."""
    rows = sorted((int(k[3:]), v) for k, v in q.items() if k.startswith("dqk") and k[3:].isdigit())
    first = rows[0][0]
    grid = ", ".join(str(d) for d, _ in rows)
    new = 2 * q["seeds"] * sum(d != q["d_head"] for d, _ in rows)  # d_qk = d_head: the seeds stage's own runs
    o = q["onset"]
    where = (f"d_qk in ({o['after_d_qk']:.0f}, {o['by_d_qk']:.0f}]" if o.get("reached")
             else "not within the grid")
    base = ("the d_qk-{0} gap itself is above zero (its 95% lower bound > 0)".format(first)
            if o.get("baseline_gap_above_zero") else f"the d_qk-{first} gap is not distinguishable from zero")
    out = [f"**One variable** (the curve the onset is read on; design, cost and the grid's history in "
           "`docs/CRITICAL.md`): the "
           f"chapter's {q['model']} model (d_model {q['d_model']}, {q['n_head']} head, value width {q['d_head']}) with "
           f"only its per-head query/key width d_qk moving over {grid}, so the scaled arm divides by √d_qk and the "
           "value path, head count and every other weight stay the same; "
           f"{q['seeds']} paired seeds per point, scaled and unscaled ({2 * len(rows) * q['seeds']} runs; {new} to "
           f"train where the store holds the seeds stage's d_head-{q['d_head']} runs). Both arms move with d_qk, so "
           "the gap is the difference of two moving curves; each is shown with its 95% interval over the seeds.\n"]
    header = ["d_qk", "gap [95% CI]", "scaled loss [95% CI]", "unscaled loss [95% CI]", "unscaled logit std at init",
              "final entropy: unscaled l0, l1; scaled l0", f"Holm p, gap > d_qk {first}", "modes"]
    r = q["reading"]
    p_holm = r["paired_onset"]["p_holm"]

    def ci(v):
        return f"{v['mean']:.3f} [{v['ci95_lo']:.3f}, {v['ci95_hi']:.3f}]"
    table = []
    for d, v in rows:
        g = v["gap_loss_final"]
        l1 = v.get("unscaled_entropy_final_l1")
        table.append([d, ci(g) + zero_note(g["ci95_lo"], g["ci95_hi"]), ci(v["scaled_loss_final"]),
                      ci(v["unscaled_loss_final"]), f"{v['unscaled_logit_std_step0']['mean']:.3f}",
                      fmt_number(round(v["unscaled_entropy_final"]["mean"], 5))
                      + ("" if l1 is None else f", {fmt_number(round(l1['mean'], 5))}")
                      + f"; {v['scaled_entropy_final']['mean']:.3f}",
                      f"{p_holm[f'd_qk{d}']:.2g}" if f"d_qk{d}" in p_holm else "", _modes_note(v) or "one"])
    out += md_table(header, table)
    out += ["", reading_markdown(r, "d_qk", first)]
    m = mixed["paired_onset"]
    out.append("The mixed-width curve by the same rule: " + (
        f"d_head in ({m['after_d_head']:.0f}, {m['by_d_head']:.0f}], logit std at init "
        f"{m['logit_std_after']:.3f} to {m['logit_std_by']:.3f}" if m["reached"] else "no onset in its grid")
        + " (its design moves d_model and n_head too: the two onsets agree in logit scale only where these "
        "intervals meet).")
    out.append(f"\nThe earlier rule (the first d_qk whose mean gap's 95% lower bound exceeds the d_qk-{first} gap's "
               f"upper bound; unpaired, conservative): {where}; {base}. Modes: each arm's seeds at each d_qk tested on "
               "their step-222 entropy (stats.find_modes, Bonferroni over the grid), as in the seeds stage.")
    return out


def report_markdown(metrics: dict) -> str:
    """Exercises 1-2: the one-variable curve (where present), then the mixed-width curve, labelled."""
    if not metrics:
        return ""
    out = []
    if metrics.get("d_qk"):
        out += one_variable_markdown(metrics["d_qk"], metrics["reading"]) + [""]
    rows = sorted((int(k[1:]), v) for k, v in metrics.items() if k.startswith("d") and k[1:].isdigit())
    first = rows[0][0]
    out += [f"**Mixed width** (not one variable): the chapter's protocol at every d_head of its suggested grid, "
            f"{metrics['seeds']} seeds each (mean [min, max]), with d_model the smallest multiple of d_head ≥ 128 and "
            "n_head = d_model / d_head, so d_model and n_head move with d_head (`stages/critical.py`).\n"]
    header = ["d_head", "d_model", "gap (unscaled − scaled)", "unscaled entropy", "scaled entropy",
              "unscaled logit std, trained", f"p, gap vs d_head {first} (paired t)"]
    table = []
    for d, v in rows:
        g, ue, se, ul = v["gap_loss_final"], v["unscaled_entropy_final"], v["scaled_entropy_final"], \
            v["unscaled_trained_logit_std_l0"]
        p = v.get(f"gap_vs_d{first}_paired_p")
        table.append([d, v["d_model"], f"{g['mean']:.3f} [{g['min']:.3f}, {g['max']:.3f}]",
                      fmt_number(round(ue["mean"], 5)), f"{se['mean']:.3f}", f"{ul['mean']:.4g}",
                      "" if p is None else f"{p:.2g}"])
    out += md_table(header, table)
    o = metrics["onset"]
    widths = sorted({v["d_model"] for _, v in rows})
    rule = (f"the first d_head whose mean gap's 95% lower bound exceeds the d_head-{first} gap's upper bound, "
            "reported at the grid's resolution")
    out.append(f"\nOnset of the mixed-width curve by the earlier, unpaired rule ({rule}; the paired rule's is in the "
               "one-variable paragraph above and shaded in the figure): "
               + (f"d_head in ({o['after_d_head']:.0f}, {o['by_d_head']:.0f}]." if o.get("reached")
                  else "not within the grid.")
               + f" This curve mixes variables: d_model ({', '.join(map(str, widths))}) and n_head move with d_head, "
               "so it is not a one-variable answer (plots/critical/gap_vs_logit_std.png: the gap against the logit "
               "scale at init, for both designs, with the chapter's two models as separate reference points).")
    e1 = metrics.get("exercise1")
    if e1:
        r = e1["logit_std_ratio_step0"]
        out.append(f"Exercise 1 (d_head {2 * first}: half the heads at the same d_model): the unscaled logit std at "
                   f"step 0 is {r['mean']:.3f}× that of d_head {first} (√2 = 1.414); the gap is "
                   f"{e1['gap_loss_final']['mean']:.3f} [{e1['gap_loss_final']['min']:.3f}, {e1['gap_loss_final']['max']:.3f}].")
    return "\n".join(out) + "\n\n"


def answer(metrics, all_metrics, dists) -> str:
    if not metrics or "onset" not in metrics:
        return ""
    q = metrics.get("d_qk")
    if q and "reading" in q:  # the one-variable curve answers the exercise; the mixed-width one is context
        return (f"With only the q/k width moving ({q['model']} model, {q['seeds']} seeds) the gap shows "
                f"{reading_summary(q['reading'])}. Both arms and the mixed-width curve are in the section below.")
    rows = sorted((int(k[1:]), v) for k, v in metrics.items() if k.startswith("d") and k[1:].isdigit())
    o = metrics["onset"]
    first, last = rows[0], rows[-1]
    text = (f"Over {metrics.get('seeds')} seeds the mean gap goes from {first[1]['gap_loss_final']['mean']:.3f} at d_head "
            f"{first[0]} to {last[1]['gap_loss_final']['mean']:.3f} at d_head {last[0]}")
    if o.get("reached"):
        text += (f"; its onset lies in d_head ({o['after_d_head']:.0f}, {o['by_d_head']:.0f}] (the first grid point "
                 "whose gap's 95% lower bound exceeds the first point's upper bound; no finer than the grid)")
    else:
        text += "; no grid point's gap rises beyond the first point's seed noise"
    drops = [(a[0], b[0]) for a, b in zip(rows, rows[1:])
             if b[1]["gap_loss_final"]["mean"] < a[1]["gap_loss_final"]["mean"]]
    if drops:
        text += (". The mean gap falls again from d_head " + ", ".join(f"{a} to {b}" for a, b in drops)
                 + " (the grid changes d_model and n_head with d_head): read the onset no finer than the grid")
    else:
        text += ". The mean gap rises monotonically over the grid"
    return text + "."


def answer_exercise3(metrics, all_metrics, dists) -> str:
    c = (all_metrics.get("heads") or {}).get("conditional")
    if not c:
        return ""
    above = c["distance_std"] > c["uniform_distance_std"]
    return (f"The most conditional head is l{c['layer']}h{c['head']} (centroid spread {c['distance_std']:.2f} over "
            f"positions), {'above' if above else 'below'} the {c['uniform_distance_std']:.2f} that uniform causal "
            f"attention shows from the growth of i alone: "
            + ("a conditional head exists." if above else "by this measure no head of this model is conditional."))
