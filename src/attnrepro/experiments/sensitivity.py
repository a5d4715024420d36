"""Paired changes of the choices the chapter leaves unstated (params `sensitivity`), judged with
their own seeds: effects with standard errors, Holm's correction, the "accounts for" rule, the
pre-registered explanations and the joint protocol table.

Everything a verdict needs is computed from the sweep's own runs: the baseline (the protocol as
written: `train` / `failures` params) and every protocol of `sensitivity.choices` and
`sensitivity.combinations` at the same seeds. Nothing is read from the default run's
metrics/dist/, so a rerun of the seeds or failures stage never makes this sweep stale.

The statistics (`paired_effect`, `holm`, `accounts_for`, `joint_table`, `prereg_verdicts`) are
plain functions of numbers; claims.py and report.py call them, so the rule lives here once.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy.stats import t

from attnrepro.config import ConfigError, require
from attnrepro.envinfo import stage_environment
from attnrepro.experiments.failures import SYMPTOMS, FailuresConfig
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs, model_config, optim_config
from attnrepro.files import read_yaml_mapping
from attnrepro.formatting import md_table, number_text, table_cell, zero_note
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import ALPHA, Band, holm_adjusted, holm_detectable, log_scale, t_quantile

SENSITIVITY_FAILURES = "failures_"  # a sensitivity variant failures_<bug> names a model of the failures table
BASELINE = "baseline"  # the protocol as written: the name of the unchanged protocol in the outputs
KINDS = ("optim", "model", "split")  # what a choice changes
SCOPES = ("all", "train", "failures")  # which runs a choice applies to
MIN_SEEDS = 5
PREREGISTRATION = Path("docs/sensitivity_preregistration.yaml")
ROW_KEYS = ("n", "center", "sd", "log", "pi_lo", "pi_hi", "p_holm")  # what accounts_for reads of a row


def sensitivity_target(variant: str) -> tuple[str, str]:
    """(metrics file, variant there) that a sensitivity variant names: ("failures", bug) for
    failures_<bug>, else ("train", variant)."""
    if variant.startswith(SENSITIVITY_FAILURES):
        return "failures", variant[len(SENSITIVITY_FAILURES):]
    return "train", variant


@dataclass
class SensitivityConfig:
    seeds: list[int]
    choices: dict[str, dict]  # name -> {optim: {...}} | {model: {...}} | {split: first}, plus scope
    metrics: dict[str, list[str]]  # train variant or failures_<variant> -> the metrics measured
    combinations: dict[str, list[str]]  # name -> two or more choices together ({} for none)

    def validate(self, prefix: str = "sensitivity") -> None:
        require(len(self.seeds) >= MIN_SEEDS and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds",
                self.seeds, f"at least {MIN_SEEDS} different seeds (each choice is paired with the baseline at each)")
        require(bool(self.choices) and BASELINE not in self.choices, f"{prefix}.choices", sorted(self.choices),
                f"at least one choice, none named '{BASELINE}' (the unchanged protocol's name)")
        require(bool(self.metrics) and all(self.metrics.values()), f"{prefix}.metrics", self.metrics,
                "at least one variant, each with at least one metric")
        for name, c in self.choices.items():
            where = f"{prefix}.choices.{name}"
            kinds = [k for k in (c or {}) if k in KINDS] if isinstance(c, dict) else []
            require(isinstance(c, dict) and len(kinds) == 1 and set(c) <= {*KINDS, "scope"}, where, c,
                    "one of {optim: {...}}, {model: {...}}, {split: first}, with an optional scope")
            require(c.get("scope", "all") in SCOPES, f"{where}.scope", c.get("scope"), " | ".join(SCOPES))
            kind = kinds[0]
            if kind == "split":
                require(c["split"] == "first", f"{where}.split", c["split"], "first")
            else:
                require(isinstance(c[kind], dict) and bool(c[kind]), f"{where}.{kind}", c[kind],
                        f"a mapping of {'OptimConfig' if kind == 'optim' else 'ModelConfig'} fields")
        for name, parts in (self.combinations or {}).items():
            where = f"{prefix}.combinations.{name}"
            require(name not in self.choices and name != BASELINE, where, name,
                    "a name that is neither a choice nor the baseline")
            require(isinstance(parts, list) and len(parts) >= 2 and len(set(parts)) == len(parts)
                    and all(p in self.choices for p in parts), where, parts, "two or more different choices")
            self.protocol(name)  # no two parts set the same field
            require(any(self.applies(name, v) for v in self.metrics), where, parts,
                    "choices whose scopes share at least one measured variant")

    def protocol(self, name: str) -> dict:
        """The changes of a protocol: {optim: {...}, model: {...}, split: bool, scope: {scopes}}."""
        if name == BASELINE:
            return {"optim": {}, "model": {}, "split": False, "scope": set(SCOPES[1:])}
        parts = self.combinations.get(name, [name]) if self.combinations else [name]
        out: dict = {"optim": {}, "model": {}, "split": False, "scope": set(SCOPES[1:])}
        for p in parts:
            c = self.choices[p]
            for kind in ("optim", "model"):
                clash = set(out[kind]) & set(c.get(kind, {}))
                if clash:
                    raise ConfigError(f"sensitivity.combinations.{name}: {', '.join(sorted(clash))} set by two of "
                                      f"its choices")
                out[kind].update(c.get(kind, {}))
            out["split"] = out["split"] or "split" in c
            scope = c.get("scope", "all")
            out["scope"] &= set(SCOPES[1:]) if scope == "all" else {scope}
        return out

    def protocols(self) -> list[str]:
        return [BASELINE, *self.choices, *(self.combinations or {})]

    def applies(self, name: str, variant: str) -> bool:
        """Does protocol `name` change the runs of `variant`? (The baseline applies everywhere.)"""
        return sensitivity_target(variant)[0] in self.protocol(name)["scope"]

    def planned(self) -> list[tuple[str, str, int]]:
        """(variant, protocol, seed) of every run the sweep schedules."""
        return [(v, p, s) for p in self.protocols() for v in self.metrics if self.applies(p, v) for s in self.seeds]


_TRAIN_METRIC = re.compile(r"(loss_final|loss_last_step|loss_start|val_loss_final|grad_norm_final"
                           r"|(entropy|logit_std|jacobian_fro)_(final|final_l(?P<a>\d+)|step(?P<step>\d+))"
                           r"|(init|trained)_(q_std|k_std|logit_std|w_qkv_fro)_l(?P<b>\d+))")


def train_metric(name: str, diag_steps: Sequence[int], n_layer: int) -> bool:
    """Is `name` a metric that a train-protocol run's summary records (run.task_lm.chapter_summary)? Checked
    before any run starts, without reading another stage's outputs."""
    m = _TRAIN_METRIC.fullmatch(name)
    if m is None:
        return False
    layer = m.group("a") or m.group("b")
    return (m.group("step") is None or int(m.group("step")) in diag_steps) and (layer is None or int(layer) < n_layer)


def planned_runs(params: Mapping) -> int:
    """The runs the sensitivity sweep schedules, from params.yaml's `sensitivity` section."""
    s = params["sensitivity"]
    cfg = SensitivityConfig(seeds=s["seeds"], choices=s["choices"], metrics=s["metrics"],
                            combinations=s.get("combinations") or {})
    return len(cfg.planned())


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


# ---------------------------------------------------------------- statistics

def _on_analysis_scale(x: float, log: bool) -> float:
    return math.log(x) if log else float(x)


def _finite(d: dict) -> dict:
    return {k: v for k, v in d.items() if not isinstance(v, float) or math.isfinite(v)}


def protocol_band(values: Sequence[float], log: bool, alpha: float = ALPHA) -> dict:
    """One protocol's seed band of a metric: n, centre and sd on the analysis scale (log for attention
    statistics and scales), `mean` the centre on the metric's own scale (the geometric mean on the log
    scale), and the 1 - alpha prediction interval of one new run (pi_lo, pi_hi)."""
    b = Band.of(list(values), log=log)
    lo, hi = b.prediction_interval(alpha)
    return _finite({"n": b.n, "center": b.mean, "sd": b.sd, "log": int(log),
                    "mean": math.exp(b.mean) if log else b.mean, "pi_lo": lo, "pi_hi": hi})


def paired_effect(ours: Sequence[float], base: Sequence[float], log: bool, alpha: float = ALPHA) -> dict:
    """The mean paired difference of `ours` from `base` (seed i of each shares its init draw and batches),
    on the analysis scale: diff, its standard error se = sd(differences) / sqrt(n), the 1 - alpha t
    interval (ci_lo, ci_hi, n - 1 degrees of freedom) and the two-sided paired t-test's p."""
    require(len(ours) == len(base) and len(ours) >= 2, "sensitivity pairs", (len(ours), len(base)),
            "two equally long lists of at least 2 paired values")
    d = [_on_analysis_scale(o, log) - _on_analysis_scale(b, log) for o, b in zip(ours, base)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = float(2 * t.sf(abs(mean / se), n - 1))
    half = t_quantile(1 - alpha / 2, n - 1) * se
    return {"diff": mean, "se": se, "ci_lo": mean - half, "ci_hi": mean + half, "p": p}


def analyse(values: Mapping[tuple[str, str, str], Sequence[float]], cfg: SensitivityConfig,
            alpha: float = ALPHA) -> tuple[dict, list[dict]]:
    """metrics/sensitivity.json and its rows from every run's value: values[(variant, metric, protocol)]
    = one value per seed of cfg.seeds (in that order). Every protocol's band; each non-baseline
    protocol's paired effect, its effect in units of the baseline's own seed sd, and Holm's adjusted
    p over ALL cells tested (variant x metric x protocol other than the baseline)."""
    out: dict = {}
    rows: list[dict] = []
    for v, names in cfg.metrics.items():
        for m in names:
            base = values[(v, m, BASELINE)]
            # a zero (a fully one-hot row's entropy) has no log: the cell falls back to the linear scale
            log = log_scale(m) and all(x > 0 for p in cfg.protocols() if p == BASELINE or cfg.applies(p, v)
                                       for x in values[(v, m, p)])
            cell = out.setdefault(v, {}).setdefault(m, {})
            cell[BASELINE] = protocol_band(base, log, alpha)
            for p in cfg.protocols()[1:]:
                if not cfg.applies(p, v):
                    continue
                ours = values[(v, m, p)]
                e = paired_effect(ours, base, log, alpha)
                sd = cell[BASELINE].get("sd", 0.0)
                e["effect_sd"] = e["diff"] / sd if sd else (0.0 if e["diff"] == 0 else math.copysign(math.inf, e["diff"]))
                cell[p] = {**protocol_band(ours, log, alpha), **e}
                rows.append({"variant": v, "metric": m, "choice": p})
    # Holm, not Benjamini-Hochberg: an explained cell is a claim read one at a time, so the error to
    # bound is any false explanation, not their share; and Holm holds under any dependence, which the
    # cells have (several metrics of the same runs)
    adjusted = holm_adjusted([out[r["variant"]][r["metric"]][r["choice"]]["p"] for r in rows])
    for r, q in zip(rows, adjusted):
        row = out[r["variant"]][r["metric"]][r["choice"]]
        row["p_holm"], row["significant"] = q, int(q < alpha)
        out[r["variant"]][r["metric"]][r["choice"]] = _finite(row)
        r.update({k: row.get(k) for k in ("diff", "se", "ci_lo", "ci_hi", "p", "p_holm", "significant",
                                          "effect_sd", "mean", "log")})
        r["baseline"] = out[r["variant"]][r["metric"]][BASELINE].get("mean")  # absent: a value not finite
    out["design"] = {"seeds": len(cfg.seeds), "cells": len(rows), "alpha": alpha, "correction": "holm",
                     "protocols": len(cfg.protocols()), "runs": len(cfg.planned())}
    return out, rows


def cells(m: Mapping) -> dict[tuple[str, str], dict]:
    """(variant, metric) -> {protocol: row} of a metrics/sensitivity.json (the design entry left out)."""
    return {(v, k): rows for v, ms in m.items() if v != "design" and isinstance(ms, dict)
            for k, rows in ms.items() if isinstance(rows, dict) and BASELINE in rows}


# ---------------------------------------------------------------- the "accounts for" rule

def _meets(lo: float, hi: float, published: float, half: float) -> bool:
    return published - half <= hi and lo <= published + half


def accounts_for(base: Mapping, row: Mapping, published: float, half: float = 0.0, alpha: float = ALPHA) -> str:
    """Does one choice account for our deviation from a published figure? Returns "accounts" or why not:
    "no deviation", "not significant", "away", "overshoots" (or "missing" where a number is absent).

    base, row: the baseline's and the choice's entries of metrics/sensitivity.json for the cell (n,
    center, sd, log, pi_lo, pi_hi; the row's p_holm). published, half: the figure and half a unit of
    its last printed digit.

    - a deviation: the published figure's rounding interval misses the baseline's prediction interval
      (else there is nothing to account for: "no deviation");
    - (a) significant: Holm's adjusted p of the paired effect below alpha;
    - (b) toward: the choice's centre moves from the baseline's toward the published figure;
    - (c) no overshoot: the choice's centre stays on our side of the far edge of the published
      figure's own band, published +/- (half + w), w the choice's own prediction half-width
      t(1 - alpha/2, n - 1) * sd * sqrt(1 + 1/n), all on the analysis scale; and it ends closer to
      the published figure than the baseline's centre (a noisy choice's wide band must not let a
      centre that lands further past the figure than the baseline sits short of it count).

    Why that band: the published figure is one run of the chapter's protocol. Were the choice that
    protocol, the figure would be one draw from the choice's seed distribution, so any centre within w
    of it (either side, and anywhere in its rounding interval) predicts it; a centre beyond that far
    edge predicts the published figure on the other side of it, i.e. the choice trades our deviation
    for an opposite one. A move toward that stops short still counts (the choice accounts for part of
    the deviation); `closes` in the report says how much of it.
    """
    if any(k not in base for k in ("center", "pi_lo", "pi_hi", "log")) or any(
            k not in row for k in ("center", "sd", "n", "p_holm")):
        return "missing"
    if _meets(base["pi_lo"], base["pi_hi"], published, half):
        return "no deviation"
    log = bool(base["log"])
    if log and published - half <= 0:
        return "missing"
    if row["p_holm"] >= alpha:
        return "not significant"
    target = _on_analysis_scale(published, log)
    up = target > base["center"]
    if (row["center"] > base["center"]) != up or row["center"] == base["center"]:
        return "away"
    w = t_quantile(1 - alpha / 2, int(row["n"]) - 1) * row["sd"] * math.sqrt(1 + 1 / row["n"])
    edge = _on_analysis_scale(published + half, log) + w if up else _on_analysis_scale(published - half, log) - w
    if ((row["center"] > edge) if up else (row["center"] < edge)) or \
            abs(row["center"] - target) >= abs(base["center"] - target):
        return "overshoots"
    return "accounts"


def closes(base: Mapping, row: Mapping, published: float) -> Optional[float]:
    """The share of the gap from the baseline's centre to the published figure that the choice closes
    (1: all of it; above 1: past it), on the analysis scale."""
    log = bool(base.get("log"))
    if "center" not in base or "center" not in row or (log and published <= 0):
        return None
    gap = _on_analysis_scale(published, log) - base["center"]
    return (row["center"] - base["center"]) / gap if gap else None


# ---------------------------------------------------------------- protocols judged jointly

def joint_table(m: Mapping, published: Mapping[tuple[str, str], tuple[float, float]],
                protocols: Optional[Sequence[str]] = None) -> list[dict]:
    """Per protocol (baseline, each choice, each combination): over the cells the sweep measures that
    have a published figure, how many published figures fall inside that protocol's seed band (the
    rounding interval meets the prediction interval) and the joint score, the sum over cells of
    ((published - centre) / sd)^2 on the analysis scale, with sd that protocol's seed sd (`score`) and
    with the baseline's (`score_base_sd`: a fixed yardstick per cell, so a choice that only adds seed
    noise cannot lower it; a band that is not finite, from a run that diverged, scores inf). A protocol that
    does not apply to a variant
    (a failures-only choice on a train variant) leaves its runs as the baseline's, so every row counts
    the same cells."""
    all_cells = {k: v for k, v in cells(m).items() if k in published}
    names = list(protocols) if protocols else sorted({p for rows in all_cells.values() for p in rows},
                                                     key=lambda p: (p != BASELINE, p))
    out = []
    for p in names:
        inside, score, fixed, changed, n = 0, 0.0, 0.0, 0, 0
        for key, rows in sorted(all_cells.items()):
            r = rows.get(p, rows[BASELINE])
            changed += p in rows and p != BASELINE
            pub, half = published[key]
            log = bool(r.get("log"))
            if log and pub <= 0:
                continue
            n += 1
            if "center" not in r or "center" not in rows[BASELINE]:  # a run's value not finite: far from anything
                score, fixed = math.inf, math.inf
                continue
            inside += _meets(r.get("pi_lo", -math.inf), r.get("pi_hi", math.inf), pub, half)
            dz = _on_analysis_scale(pub, log) - r["center"]
            score += _squared_z(dz, r.get("sd", 0.0))
            fixed += _squared_z(dz, rows[BASELINE].get("sd", 0.0))
        out.append({"protocol": p, "cells": n, "changed": changed, "inside": inside, "score": score,
                    "score_base_sd": fixed})
    return out


def _squared_z(dz: float, sd: float) -> float:
    return (dz / sd) ** 2 if sd else (0.0 if dz == 0 else math.inf)


# ---------------------------------------------------------------- pre-registration

def load_prereg(path: Path = PREREGISTRATION) -> list[dict]:
    """The pre-registered explanations: [{cell: <variant>.<metric>, choice, reason}, ...]."""
    doc = read_yaml_mapping(path, "the pre-registration file is missing")
    entries = doc.get("entries") or []
    for i, e in enumerate(entries):
        require(isinstance(e, dict) and {"cell", "choice", "reason"} <= set(e) and e["cell"].count(".") == 1,
                f"{path}: entries[{i}]", e, "{cell: <variant>.<metric>, choice: <choice>, reason: text}")
    return entries


def prereg_family(entries: Sequence[Mapping], m: Mapping) -> dict[tuple[str, str], float]:
    """Holm's adjusted p of each measured pre-registered (cell, choice) over those entries alone, from
    each row's raw p: the entries as their own family, not among every cell of the sweep."""
    table = cells(m)
    rows = {(e["cell"], e["choice"]): table[tuple(e["cell"].split("."))][e["choice"]] for e in entries
            if e["choice"] in table.get(tuple(e["cell"].split(".")), {})}
    return dict(zip(rows, holm_adjusted([r.get("p", math.nan) for r in rows.values()])))


def prereg_verdicts(entries: Sequence[Mapping], m: Mapping,
                    published: Mapping[tuple[str, str], tuple[float, float]], alpha: float = ALPHA,
                    family: Optional[Mapping[tuple[str, str], float]] = None) -> list[dict]:
    """Per pre-registered entry: held (the choice accounts for the cell's deviation), failed (measured,
    and it does not: why) or not testable (why: not measured, no published figure, no deviation left
    at the baseline). Significance as the stage wrote it (Holm over every cell), or, given `family`
    (prereg_family), over the pre-registered entries alone."""
    table = cells(m)
    out = []
    for e in entries:
        v, metric = e["cell"].split(".")
        rows = table.get((v, metric))
        res = {**e, "verdict": "not testable", "why": ""}
        if rows is None:
            res["why"] = "the sweep does not measure this cell"
        elif e["choice"] not in rows:
            res["why"] = "the choice is not run for this variant"
        elif (v, metric) not in published:
            res["why"] = "no published figure"
        else:
            pub, half = published[(v, metric)]
            row = rows[e["choice"]] if family is None else {**rows[e["choice"]],
                                                             "p_holm": family[(e["cell"], e["choice"])]}
            why = accounts_for(rows[BASELINE], row, pub, half, alpha)
            res["closes"] = closes(rows[BASELINE], rows[e["choice"]], pub)
            if why == "accounts":
                res["verdict"] = "held"
            elif why in ("no deviation", "missing"):
                res["why"] = "no deviation at the baseline" if why == "no deviation" else "a number is missing"
            else:
                res["verdict"], res["why"] = "failed", why
        out.append(res)
    return out


# ---------------------------------------------------------------- the stage

@dataclass
class SensitivityResult:
    """What the sensitivity stage writes."""
    metrics: dict  # metrics/sensitivity.json: <variant>.<metric>.<protocol>: band, paired effect, p_holm
    rows: list[dict]  # plots/sensitivity/effects.csv: one row per variant, metric and choice
    env: dict  # metrics/env/sensitivity.json

    def table(self) -> str:
        """diff / se and Holm's p per (variant, metric) and choice."""
        lines = []
        for r in self.rows:
            if r["diff"] is None or r["se"] is None:  # dropped as not finite
                lines.append(f"{r['variant']}.{r['metric']} {r['choice']}: not finite")
                continue
            lines.append(f"{r['variant']}.{r['metric']} {r['choice']}: {r['diff']:+.4g} ± {r['se']:.2g} "
                         f"(p_holm {r['p_holm']:.2g}{', significant' if r['significant'] else ''})")
        return "\n".join(lines)


def run(train: "TrainConfig", failures: "FailuresConfig", cfg: SensitivityConfig, device: str,
        engine: "EngineConfig") -> SensitivityResult:
    """Every protocol (the baseline, each choice, each combination) for every variant of
    sensitivity.metrics it applies to, at every seed of sensitivity.seeds (one sweep per input set).
    The baseline is the `train` / `failures` protocol as params state it, so its runs are the seeds and
    failures stages' own at shared seeds (same spec, one run in the store). Params are checked before
    any run starts."""
    for v, names in cfg.metrics.items():
        file, name = sensitivity_target(v)
        require(name in (failures.variants if file == "failures" else train.variants), "sensitivity.metrics", v,
                f"a train variant or {SENSITIVITY_FAILURES}<a failures variant>")
        if file == "failures":
            bad = [m for m in names if m not in SYMPTOMS]
            what = f"a symptom a failures run records ({', '.join(SYMPTOMS)})"
        else:
            n_layer = model_config(train.models, train.variants[name], f"train.variants.{name}").n_layer
            bad = [m for m in names if not train_metric(m, train.diag_steps, n_layer)]
            what = "a metric a train run records (metrics/train.json's keys)"
        if bad:
            raise ConfigError(f"sensitivity.metrics.{v}: {', '.join(bad)} is not {what}")
    for name in cfg.protocols()[1:]:
        optim = cfg.protocol(name)["optim"]
        if optim:
            optim_config(train, f"sensitivity.choices.{name}.optim", **optim)
    inputs = corpus_inputs()
    alt = first_split(inputs)

    def spec(variant: str, protocol: dict, seed: int, label: str):
        model, optim = protocol["model"], protocol["optim"]
        file, name = sensitivity_target(variant)
        if file == "failures":
            return failures.spec(name, seed, device, model=model, label=label, **optim)
        v = {**train.variants[name], **model}
        return train.run(model_config(train.models, v, f"sensitivity.{variant}"), seed, device, label, **optim)

    keys = cfg.planned()
    specs = {k: spec(k[0], cfg.protocol(k[1]), k[2], f"{k[0]} {k[1]} seed {k[2]}") for k in keys}  # all checked first
    records = {}
    for split in (False, True):  # the runs of each input set are one sweep
        sub = [k for k in keys if cfg.protocol(k[1])["split"] == split]
        if sub:
            recs = run_sweep(f"sensitivity{' (first split)' if split else ''}", [specs[k] for k in sub],
                             alt if split else inputs, engine)
            require_ok(recs, "sensitivity")
            records.update(zip(sub, recs))

    values = {}
    for v, names in cfg.metrics.items():
        for p in cfg.protocols():
            if not cfg.applies(p, v):
                continue
            summaries = [records[(v, p, s)].summary() for s in cfg.seeds]
            for m in names:
                if any(m not in s for s in summaries):
                    raise ConfigError(f"sensitivity.metrics.{v}: {m} is not a metric its runs record")
                values[(v, m, p)] = [float(s[m]) for s in summaries]
    metrics, rows = analyse(values, cfg)
    return SensitivityResult(metrics=metrics, rows=rows, env=stage_environment(device, list(records.values())))

# ---------------------------------------------------------------- its part of the report

def published_figures(claims) -> dict[tuple[str, str], tuple[float, float]]:
    """(sensitivity variant, metric) -> (published figure, half a unit of its last digit), for every
    value cell of claims.yaml (`claims`: its Claims) that names one metric of the train or failures stage."""
    out = {}
    for c in claims:
        if c.cls != "value" or c.published is None:
            continue
        parts = c.metric.split(".")
        if len(parts) == 3 and parts[0] in ("train", "failures"):
            v = parts[1] if parts[0] == "train" else SENSITIVITY_FAILURES + parts[1]
            out[(v, parts[2])] = (c.published, c.published_half)
    return out


def _cells_or_empty(metrics: dict) -> dict:
    return cells(metrics) if isinstance(metrics, dict) else {}


def report_markdown(metrics: dict, exp, prereg_path: Path = PREREGISTRATION) -> str:
    """The paired effects with Holm's correction and each choice's verdict, the pre-registered
    explanations (held / failed / not testable) and the joint protocol table."""
    table = _cells_or_empty(metrics)
    if not table:
        return ("metrics/sensitivity.json predates the paired design (no baseline band per cell): rerun the "
                "sensitivity stage.\n\n" if metrics else "")
    published = published_figures(exp.claims)
    d = metrics.get("design", {})
    alpha = d.get("alpha", 0.05)
    out = [f"Paired effects (choice − baseline at the same seed; mean over {d.get('seeds', '?')} seeds, on the log "
           "scale for attention statistics and scales, ± its standard error, 95% t interval), Holm's adjusted p over "
           f"all {d.get('cells', '?')} cells, and whether the choice accounts for our deviation from the published "
           "figure (significant after Holm, toward it, not past the published figure's own band: "
           "experiments.sensitivity.accounts_for).\n"]
    effects = []
    for (v, metric), rows in sorted(table.items()):
        base = rows[BASELINE]
        pub = published.get((v, metric))
        for c, r in rows.items():
            if c == BASELINE:
                continue
            verdict = "—" if pub is None else accounts_for(base, r, pub[0], pub[1], alpha)
            if verdict == "accounts":
                verdict = "**accounts**"
            if all(k in r for k in ("diff", "se", "ci_lo", "ci_hi", "p_holm")):
                effect = (f"{r['diff']:+.3g} ± {r['se']:.2g} [{r['ci_lo']:+.3g}, {r['ci_hi']:+.3g}]"
                          f"{zero_note(r['ci_lo'], r['ci_hi'])}")
                p_holm = f"{r['p_holm']:.2g}"
            else:  # _finite dropped them: a run's value is not a number
                effect, p_holm = "not a number (a run diverged)", "—"
            effects.append([f"{v}.{metric}", number_text(base.get("mean")), "—" if pub is None else f"{pub[0]:.4g}",
                            c, number_text(r.get("mean")), effect, p_holm, verdict])
    out += md_table(["cell", "baseline", "published", "choice", "choice's mean", "effect ± se [95% CI]", "p_holm",
                     "verdict"], effects)
    out.append("")
    if Path(prereg_path).is_file():
        entries = load_prereg(prereg_path)
        family = prereg_family(entries, metrics)
        verdicts = prereg_verdicts(entries, metrics, published, alpha)
        own = prereg_verdicts(entries, metrics, published, alpha, family)
        n, k = ({v: sum(x["verdict"] == v for x in vs) for v in ("held", "failed", "not testable")}
                for vs in (verdicts, own))
        seeds = d.get("seeds", 0)
        power = (f" At {seeds} paired seeds a cell is found with 80% power when its paired effect is at least "
                 f"{holm_detectable(seeds, len(family)):.2g} sd of its paired differences in the pre-registered "
                 f"family, {holm_detectable(seeds, d['cells']):.2g} among all cells (Holm's strictest threshold, "
                 "stats.holm_detectable; checked by simulation in the tests)." if seeds > 1 and family else "")
        out += [f"Pre-registered explanations ({prereg_path}, committed before the sweep ran): as pre-registered, "
                f"significance by Holm over all {d.get('cells', '?')} cells, {n['held']} held, {n['failed']} failed, "
                f"{n['not testable']} not testable. Over their own family ({len(family)} tests, the exploratory "
                f"cells apart; a correction chosen after these results were seen), {k['held']} held, {k['failed']} "
                f"failed. claims.yaml cites as `moved_by` only the held ones (tests/test_claims.py keeps it so).{power}\n"]
        rows = []
        for x, y in zip(verdicts, own):
            verdict, mine = (z["verdict"] + (f" ({z['why']})" if z["why"] else "") for z in (x, y))
            share = "—" if x.get("closes") is None else f"{100 * x['closes']:.0f}%"
            rows.append([x["cell"], x["choice"], verdict, mine, share, table_cell(x["reason"])])
        out += md_table(["cell", "choice", "verdict (Holm, all cells)", "own family", "gap closed",
                         "reason given in advance"], rows)
        out.append("")
    else:
        out += [f"No pre-registration at {prereg_path} (run from the repository's root): the pre-registered "
                "explanations are not judged here.\n"]
    joint = joint_table(metrics, published)
    if joint:
        out += ["Protocols judged jointly: over the cells with a published figure, how many published figures fall "
                "inside each protocol's seed band (the rounding interval meets its 95% prediction interval; a "
                "failures-only choice leaves the train cells at the baseline's band) and the joint score Σ z², z = "
                "(published − centre) / sd of that protocol's seeds (lower: closer), and the same sum in the "
                "baseline's sd (a fixed yardstick per cell: a choice that only adds seed noise widens its own band "
                "and lowers its own Σz², never this one).\n"]
        out += md_table(["protocol", "cells changed", "inside", "joint score Σz²", "Σz² in the baseline's sd"],
                        [[j["protocol"], j["changed"], f"{j['inside']} of {j['cells']}", f"{j['score']:.4g}",
                          f"{j['score_base_sd']:.4g}"] for j in joint])
    return "\n".join(out) + "\n\n"


def answer(metrics, all_metrics, dists, claims=()) -> str:
    if not _cells_or_empty(metrics):
        return ""
    published = published_figures(claims)
    joint = joint_table(metrics, published)
    if not joint:
        return ""
    base = next(j for j in joint if j["protocol"] == BASELINE)
    best = min(joint, key=lambda j: (j["score"], j["protocol"]))
    fixed = min(joint, key=lambda j: (j["score_base_sd"], j["protocol"]))
    most = max(joint, key=lambda j: (j["inside"], -j["score"]))
    sig = sum(1 for rows in _cells_or_empty(metrics).values() for c, r in rows.items()
              if c != BASELINE and r.get("significant"))
    d = metrics.get("design", {})
    return (f"{sig} of {d.get('cells', '?')} cells move significantly after Holm's correction. The baseline (the "
            f"protocol as written) puts {base['inside']} of {base['cells']} published figures inside its seed band "
            f"(joint score {base['score']:.3g}); "
            + (f"the protocol with the most inside is {most['protocol']} ({most['inside']}), "
               if most["inside"] > base["inside"] else "no protocol tried puts more inside; ")
            + f"the lowest joint score is {best['protocol']}'s ({best['score']:.3g}), and in the baseline's sd "
            f"{fixed['protocol']}'s ({fixed['score_base_sd']:.3g}, the baseline's {base['score_base_sd']:.3g}). "
            + ("No protocol tried reconciles the chapter as a whole (puts every published figure inside its band). "
               if most["inside"] < most["cells"] else f"{most['protocol']} reconciles every cell measured. ")
            + "What it does not show: that the chapter used that protocol (other unstated settings, and the stated "
            "ones we kept, could move the same cells), anything about cells the sweep does not measure, or effects "
            "smaller than its 5 paired seeds resolve after the correction; the joint score weighs a cell by our "
            "seed sd, so a cell with a tiny sd dominates it.")
