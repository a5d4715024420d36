"""The reproduction report: the chapter's conclusions, checksums and published values
against this run and its seed distributions, per experiment, with figures.

`build(...)` evaluates claims.yaml against metrics/ and returns the content of
metrics/claims.json, metrics/claims_summary.json, report/REPORT.md, report/REPORT.html (the
same report, figures embedded; `markdown_to_html`) and the report's figures (PNG bytes).
REPORT.md is laid out like a paper: the verdict, the headline, then one section per experiment
in the chapter's order (`SECTIONS`: design, cost, answer, figures, tables), the machine records
last.
Everything is a pure function of its inputs: no dates, sorted iteration, PNGs
written without a Software/date stamp, so the same metrics give byte-identical
outputs.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .experiments import sensitivity as sens
from .claims import (CLASSES, ClaimResult, claims_json, counts, evaluate_all, fmt_number, load, load_dists, load_envs,
                     printed,
                     load_metrics_dir)
from .check import detectable_shifts
from .config import require
from .reference import FLOAT_ORDER
from .report_html import markdown_to_html, resolver
from .stats import Band, percentile_of


@dataclass
class Report:
    claims_json: dict  # metrics/claims.json: every claim (a plain output)
    summary: dict  # metrics/claims_summary.json: the counts per class (the DVC metric)
    markdown: str
    figures: dict[str, bytes]  # file name under report/figures/ -> PNG bytes (the report's own)
    results: list[ClaimResult]
    html: str = ""  # report/REPORT.html: the same report, figures embedded as data URIs

    def lines(self, out: str) -> list[str]:
        """The stage's summary line (`out`: the report folder)."""
        s = self.summary
        return [f"conclusions {s['conclusion']['passed']}/{s['conclusion']['n']} hold, checksums "
                f"{s['checksum']['passed']}/{s['checksum']['n']}, published values {s['value']['passed']}/"
                f"{s['value']['n']} inside our band ({s['value']['unexplained']} unexplained); "
                f"{s['conclusion']['skipped'] + s['value']['skipped']} skipped (need a GPU) -> {out}/REPORT.md"]


@dataclass
class ReportConfig:
    """params `report` (no defaults: params.yaml is the only source of values)."""

    claims: str  # the only place published numbers live
    smooth: int  # moving-average window of the training-loss figure

    def validate(self, prefix: str = "report") -> None:
        require(self.smooth > 0, f"{prefix}.smooth", self.smooth, "a positive integer")
        require(Path(self.claims).is_file(), f"{prefix}.claims", self.claims, "an existing claims file")


# ---------------------------------------------------------------- series

def read_series(path: Path) -> dict[str, list[float]]:
    """A CSV of numeric columns -> {column: [values]}; empty cells become nan."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    cols: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            try:
                cols.setdefault(k, []).append(float(v) if v not in ("", None) else math.nan)
            except ValueError:
                cols.setdefault(k, []).append(math.nan)
    return cols


def moving_average(xs: list[float], window: int) -> list[float]:
    out, acc, q = [], 0.0, []
    for x in xs:
        q.append(x)
        acc += x
        if len(q) > window:
            acc -= q.pop(0)
        out.append(acc / len(q))
    return out


# ---------------------------------------------------------------- figures

def _figures():
    """attnrepro.figures (its saver: one dpi, no metadata), imported only when a figure is drawn
    (`attnrepro claims` imports this module for its tables)."""
    from . import figures

    figures.plt.rcParams.update({"font.size": 9})
    return figures


STYLE = {True: ("tab:blue", "scaled (÷√d)"), False: ("tab:red", "unscaled")}


def loss_figure(series: dict[str, dict], pairs, smooth: int) -> bytes | None:
    """Fig 1.2: training loss, one panel per d_head, scaled vs unscaled."""
    pairs = [(d, p) for d, p in pairs if any(v in series for v in p.values())]
    if not pairs:
        return None
    fg = _figures()
    plt = fg.plt
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 3.6), sharey=True, squeeze=False)
    for ax, (d_head, pair) in zip(axes[0], pairs):
        for scaled in (False, True):
            name = pair.get(scaled)
            if name not in series:
                continue
            s = series[name]
            color, label = STYLE[scaled]
            ax.plot(s["step"], s["loss"], color=color, alpha=0.2, lw=0.6)
            ax.plot(s["step"], moving_average(s["loss"], smooth), color=color, lw=1.5,
                    label=f"{label} ({name})")
        ax.set_title(f"d_head = {d_head}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel(f"training loss (moving average of {smooth} steps)")
    fig.suptitle("Training loss with and without 1/√d_k (chapter Fig 1.2)")
    return fg.save(fig)


def diagnostics_figure(series: dict[str, dict], pairs) -> bytes | None:
    """Fig 1.4: layer-0 attention entropy and ||J||_F over training, all variants."""
    names = [(d, scaled, p[scaled]) for d, p in pairs for scaled in (False, True) if p.get(scaled) in series]
    if not names:
        return None
    fg = _figures()
    plt = fg.plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for col, (key, title) in enumerate([("entropy_l0", "normalized attention entropy (layer 0)"),
                                        ("jacobian_fro_l0", "softmax Jacobian ||J||_F (layer 0)")]):
        ax = axes[col]
        for d_head, scaled, name in names:
            s = series[name]
            pts = [(x, y) for x, y in zip(s["step"], s.get(key, [])) if not math.isnan(y) and y > 0]
            if not pts:
                continue
            color, label = STYLE[scaled]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color,
                    ls="-" if d_head == pairs[-1][0] else "--", lw=1.3, label=f"d_head {d_head} {label}")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("Attention saturation over training (chapter Fig 1.4)")
    return fg.save(fig)


# ---------------------------------------------------------------- markdown

MARK = {"pass": "✅", "fail": "❌", "missing": "❌ missing", "skipped": "⏭ skipped"}
CLASS_WORDS = {"conclusion": "conclusions (the chapter's findings; gated)",
               "checksum": "checksums (true by construction; gated)",
               "value": "published values (informational)"}


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _expr(r: ClaimResult) -> str:
    """A predicate's test: its code (the returned expression, for a one-line predicate)."""
    return "`" + _cell(r.claim.source) + "`"


def _where(r: ClaimResult) -> str:
    if r.status == "skipped":
        return "—"
    parts = []
    if r.value is not None and r.bound is not None:
        parts.append(f"{fmt_number(r.value)} vs {fmt_number(r.bound)}")
    elif 0 < len(r.read) <= 4 and not r.passed:  # no single comparison to show: the figures it read
        parts.append(", ".join(f"{k} = {fmt_number(v)}" for k, v in zip(r.read, r.read_values)))
    if r.seeds_n:
        parts.append(f"{r.seeds_held}/{r.seeds_n} seeds" + ("" if r.mean_holds else ", not the mean"))
    if r.status == "missing":
        return _cell(r.detail)
    if r.passed:
        return _cell("; ".join(parts) or "holds")
    return _cell("; ".join(p for p in (*parts, "" if r.seeds_n else r.detail) if p) or "fails")


def _value_verdict(r: ClaimResult) -> str:
    if r.status != "fail":
        return MARK.get(r.status, r.status)
    return "outside" if r.band is not None else "off"


def _band(r: ClaimResult) -> str:
    if r.band is None:
        return r.claim.tol.text() if r.claim.tol else "exact"
    if r.band.modes:  # each mode's interval: their hull would show a value between the modes as inside
        return " or ".join(f"{fmt_number(lo)} – {fmt_number(hi)}" for lo, hi in r.band.mode_intervals())
    lo, hi = r.band.prediction_interval()
    return f"{fmt_number(lo)} – {fmt_number(hi)}"


def _num(x) -> str:
    return "not a number" if x is None else f"{x:.4g}"


def _zero(lo: float, hi: float) -> str:
    """Every interval that includes zero says so (issue 17)."""
    return " (includes 0)" if lo <= 0 <= hi else ""


def _percentile(r: ClaimResult) -> str:
    if r.percentile is None:
        return ""
    lo, hi = r.percentile_range or (r.percentile, r.percentile)
    spread = "" if round(lo) == round(hi) else f" ({lo:.0f}–{hi:.0f} over its rounding interval)"
    return (f"{r.percentile:.0f}{spread}"
            + ("" if r.mode is None else f" (the chapter's run: our mode {r.mode}, by {r.mode_by})"))


def _z(r: ClaimResult) -> str:
    if r.z is None:
        return ""
    return "∞" if math.isinf(r.z) else f"{r.z:+.1f}"


def experiment_markdown(title: str | None, results: list[ClaimResult]) -> str:
    """One experiment's claims tables (conclusions, checksums, one table per published-values entry),
    under a `## title` heading unless title is None (the report's sections give their own)."""
    out = [f"## {title}\n"] if title else []
    for cls in ("conclusion", "checksum"):
        rs = [r for r in results if r.claim.cls == cls]
        if not rs:
            continue
        out += [f"**{CLASS_WORDS[cls].capitalize()}**\n", "| claim | test | this run | result |", "| --- | --- | --- | --- |"]
        for r in rs:
            test = _expr(r) if not r.claim.is_cell else f"`{_cell(r.claim.metric)}` = {printed(r.claim)} ({r.claim.tol.text()})"
            label = r.claim.text if not r.claim.is_cell else r.claim.id.split(".", 2)[-1]
            mark = "❌ not reproduced" if cls == "conclusion" and r.status == "fail" else MARK.get(r.status, r.status)
            out.append(f"| {_cell(label)} | {test} | {_where(r) if not r.claim.is_cell else fmt_number(r.value)} | "
                       f"{mark} |")
        out.append("")
    values = [r for r in results if r.claim.cls == "value"]
    tables: dict[str, list[ClaimResult]] = {}
    for r in values:
        tables.setdefault(r.claim.id.split(".")[1], []).append(r)
    for rs in tables.values():
        c = rs[0].claim
        out += [f"**{_cell(c.text)}**" + (f" — {_cell(c.note)}" if c.note else "") + "\n",
                "| cell | published | this run | percentile of the published figure among our seeds | "
                "our band (95% PI over seeds) or tolerance | z | verdict | explanation |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rs:
            cell = r.claim.id.split(".", 2)[-1] + (f" (ours: {r.matched})" if r.matched else "")
            out.append(f"| {_cell(cell)} | {printed(r.claim)} | {fmt_number(r.value) if r.value is not None else _cell(r.detail)} | "
                       f"{_percentile(r)} | {_band(r)} | {_z(r)} | {_value_verdict(r)} | {_cell(r.explanation)} |")
        out.append("")
    return "\n".join(out) + "\n"


def claims_table(results: list[ClaimResult], show_all: bool) -> str:
    """The `attnrepro claims` table: gated and failing claims (every claim with show_all)."""
    shown = [r for r in results if show_all or r.claim.gate or r.status != "pass"]
    out = ["| claim | class | published | this run | band or tolerance | z | result |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in shown:
        c = r.claim
        pub = printed(c) if c.is_cell else _expr(r)
        val = fmt_number(r.value) if c.is_cell and r.value is not None else _where(r)
        band = _band(r) if c.is_cell else ""
        out.append(f"| {c.id} | {c.cls} | {pub} | {val} | {band} | {_z(r)} | {r.status} |")
    return "\n".join(out) + "\n"


def _short(key: str, v) -> str:
    """An environment value as a table shows it: git revisions cut to 7 characters, sizes in GiB."""
    if key == "git_revision" and isinstance(v, str) and len(v) > 7:
        return v[:7]
    return _env_value(key, v)


def env_markdown(envs: dict[str, dict]) -> str:
    """The machine records of every stage, compacted: what all stages share in one table, then only
    the fields that differ, one row per stage (git revisions cut to 7 characters)."""
    if not envs:
        return "No environment records (metrics/env/*.json) were found.\n"
    stages = sorted(envs)
    keys = sorted({k for e in envs.values() for k in e})
    same = [k for k in keys if len({repr(envs[s].get(k)) for s in stages}) == 1]
    differ = [k for k in keys if k not in same]
    out = [f"Shared by all {len(stages)} stages ({', '.join(stages)}):\n", "| field | value |", "| --- | --- |"]
    out += [f"| {k} | {_cell(_short(k, envs[stages[0]].get(k)) if envs[stages[0]].get(k) is not None else '—')} |"
            for k in same]
    if differ:
        out += ["", "Fields that differ between stages:\n", "| stage | " + " | ".join(differ) + " |",
                "| --- |" + " --- |" * len(differ)]
        out += [f"| {s} | " + " | ".join("—" if envs[s].get(k) is None else _cell(_short(k, envs[s][k])) for k in differ)
                + " |" for s in stages]
    return "\n".join(out) + "\n"


def _common(envs: dict[str, dict], key: str):
    """The value most stages record for `key` (ties: the smallest repr), and the stages that differ."""
    vals = {s: _short(key, e[key]) for s, e in envs.items() if e.get(key) is not None}  # as shown
    if not vals:
        return None, []
    tally: dict[str, int] = {}
    for v in vals.values():
        tally[v] = tally.get(v, 0) + 1
    best = min(tally, key=lambda r: (-tally[r], r))
    value = next(envs[s][key] for s, v in sorted(vals.items()) if v == best)
    return value, sorted(s for s, v in vals.items() if v != best)


def machine_line(envs: dict[str, dict]) -> str:
    """The machine in one line: CPU, cores, RAM, device, torch and its threads, Python, numpy (the
    value most stages record; stages that differ named in brackets)."""
    if not envs:
        return "not recorded (no metrics/env/*.json)"

    def part(key: str, fmt) -> str:
        v, odd = _common(envs, key)
        if v is None:
            return ""
        extra = "; ".join(f"{s}: {_short(key, envs[s][key])}" for s in odd)
        return fmt(v) + (f" ({extra})" if extra else "")

    cuda, _ = _common(envs, "cuda_available")
    items = [part("cpu", str), part("cpu_capability", str), part("cpu_cores_logical", lambda v: f"{v} logical cores"),
             part("ram_bytes", lambda v: f"{_env_value('ram_bytes', v)} RAM"),
             "no CUDA" if not cuda else part("cuda_version", lambda v: f"CUDA {v}"),
             part("torch", lambda v: f"torch {v}"), part("torch_threads", lambda v: f"{v} torch thread(s)"),
             part("python", lambda v: f"Python {v}"), part("numpy", lambda v: f"numpy {v}")]
    return ", ".join(i for i in items if i)


def _env_value(key: str, v) -> str:
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / 2**30:.1f} GiB"
    return str(v)


def headline_markdown(seeds: dict, dist: dict, exp) -> str:
    """This repository's measured gaps with their seed intervals, next to the chapter's: where the
    chapter's figure sits among our seeds (its percentile), and each variant's modes."""
    if not seeds:
        return ""
    pub = {c.id.rsplit(".", 1)[-1]: c.published for c in exp.claims
           if c.id.startswith(("train.gaps.", "train.gap_ratio."))}
    runs = dist.get("runs", {})
    n = seeds.get("n_seeds")
    lines = [f"Measured over {n} paired seeds (mean, 95% confidence interval of the mean), the chapter's figure in "
             "brackets with its percentile among our seeds:\n"]
    for key, label in (("gap_d32_loss_final", "loss gap at d_head 32"), ("gap_d256_loss_final", "loss gap at d_head 256"),
                       ("gap_d32_val_loss_final", "validation-loss gap at d_head 32"),
                       ("gap_d256_val_loss_final", "validation-loss gap at d_head 256")):
        s = seeds.get(key)
        if not s:
            continue
        ours = [r["comparison"][key] for r in runs.values() if key in r.get("comparison", {})]
        where = ""
        if key in pub and ours:
            where = f" ({fmt_number(pub[key])}: percentile {percentile_of(ours, pub[key]):.0f} of our {len(ours)} seeds)"
        zero = "; **the interval includes 0**" if s["ci95_lo"] <= 0 <= s["ci95_hi"] else ""
        lines.append(f"- {label}: **{fmt_number(round(s['mean'], 3))}** [{fmt_number(round(s['ci95_lo'], 3))}, "
                     f"{fmt_number(round(s['ci95_hi'], 3))}]{zero}{where}")
    r = seeds.get("gap_ratio_of_means_loss_final")
    if r:
        p = pub.get("gap_ratio_of_means_loss_final")
        lines.append(f"- ratio of the mean gaps: **{r['value']:.2f}×** [{r['ci95_lo']:.2f}, {r['ci95_hi']:.2f}] "
                     f"(bootstrap over seeds; the chapter: {'—' if p is None else fmt_number(p)}×)")
        per_seed = [x["comparison"]["gap_ratio_loss_final"] for x in runs.values()
                    if math.isfinite(x.get("comparison", {}).get("gap_ratio_loss_final", math.nan))]
        if per_seed and p is not None:  # the chapter's ratio is of one run's gaps: a per-seed ratio
            lines.append(f"- each seed's own ratio: median {statistics.median(per_seed):.2f}×, from "
                         f"{min(per_seed):.2f}× to {max(per_seed):.2f}× (the chapter's {fmt_number(p)}×, one run's "
                         f"ratio: percentile {percentile_of(per_seed, p):.0f} of our {len(per_seed)} seeds)")
    modes = seeds.get("modes", {})
    if modes:
        lines += ["", "Modes: each variant's seeds tested for two modes on the layer-0 entropy at step 222 (the largest "
                  "gap between sorted values against one normal sample, family-wise alpha 0.05 over the variants; "
                  "`stats.find_modes`):\n", "| variant | modes | p | share of seeds per mode [exact 95%] | "
                  "final loss per mode |", "| --- | --- | --- | --- | --- |"]
        for v, m in modes.items():
            ms = [m[k] for k in sorted(m) if k.startswith("mode")]
            share = "; ".join(f"{x['n']}: {100 * x['frac']:.0f}% [{100 * x['frac_ci95_lo']:.0f}, "
                              f"{100 * x['frac_ci95_hi']:.0f}]" for x in ms)
            loss = "; ".join(f"{x['loss_final_mean']:.3f}" for x in ms)
            lines.append(f"| {v} | {m['n_modes']} | {m['p']:.2g} | {share} | {loss} |")
    return "\n".join(lines) + "\n"


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def centroid_markdown(m: dict) -> str:
    """Exercise 3: where each head's attention centroid sits, and how much it moves between positions."""
    c = m.get("conditional")
    if not c:
        return ""
    heads = sorted(k for k in m if k.startswith("l") and "h" in k and isinstance(m[k], dict))
    out = ["dist_i = Σ_j (i − j) p_ij per query row; its mean and its standard deviation over the positions "
           f"(`stages/heads.py`). Uniform causal attention spreads by {c['uniform_distance_std']:.2f} from the "
           "growth of i alone; a head whose centroid spreads more is \"conditional\" (near for some queries, far "
           "for others).\n", "| head | centroid distance | its sd over positions | previous-token weight |",
           "| --- | --- | --- | --- |"]
    out += [f"| {h} | {m[h]['distance']:.2f} | {m[h]['distance_std']:.2f} | {m[h]['prev']:.3f} |" for h in heads]
    out.append(f"\nMost conditional: **l{c['layer']}h{c['head']}** (sd {c['distance_std']:.2f}, "
               f"{'above' if c['distance_std'] > c['uniform_distance_std'] else 'not above'} the uniform baseline).")
    return "\n".join(out) + "\n\n"


def _modes_note(e: dict) -> str:
    """'2 modes (seeds ...)' per arm where an arm's seeds fall into two modes at a grid point, else ''."""
    out = [f"{a}: {v['n_modes']} modes (seeds {' vs '.join(', '.join(map(str, g)) for g in v['seeds'])})"
           for a, v in sorted((e.get("modes") or {}).items()) if v.get("n_modes", 1) > 1]
    return "; ".join(out)


def critical_one_variable_markdown(q: dict) -> list[str]:
    """The one-variable curve: design, cost, table and onset (metrics critical.d_qk)."""
    rows = sorted((int(k[3:]), v) for k, v in q.items() if k.startswith("dqk") and k[3:].isdigit())
    first = rows[0][0]
    grid = ", ".join(str(d) for d, _ in rows)
    new = 2 * q["seeds"] * sum(d != q["d_head"] for d, _ in rows)  # d_qk = d_head: the seeds stage's own runs
    o = q["onset"]
    where = (f"**d_qk in ({o['after_d_qk']:.0f}, {o['by_d_qk']:.0f}]**" if o.get("reached")
             else "**not within the grid** (no d_qk's gap rises beyond that seed noise)")
    base = ("the d_qk-{0} gap itself is above zero (its 95% lower bound > 0): the rule reads a rise from a gap "
            "already there".format(first) if o.get("baseline_gap_above_zero")
            else f"the d_qk-{first} gap is not distinguishable from zero")
    out = [f"**One variable** (the curve the onset is read on; design, cost, and the first grid's result that "
           "extended it down argued in `docs/CRITICAL.md`): the "
           f"chapter's {q['model']} model (d_model {q['d_model']}, {q['n_head']} head, value width {q['d_head']}) with "
           f"only its per-head query/key width d_qk moving over {grid}, so the scaled arm divides by √d_qk and the "
           "value path, head count and every other weight stay the same; "
           f"{q['seeds']} paired seeds per point, scaled and unscaled ({2 * len(rows) * q['seeds']} runs; {new} to "
           f"train where the store holds the seeds stage's d_head-{q['d_head']} runs; what they took is the section's "
           f"cost above). Onset (the first d_qk whose mean gap's 95% lower bound exceeds the d_qk-{first} gap's upper "
           f"bound, never finer than the grid): {where}; {base}. Modes: each arm's seeds at each d_qk tested on "
           "their step-222 entropy (stats.find_modes, Bonferroni over the grid), as in the seeds stage.\n",
           "| d_qk | gap (unscaled − scaled) [95% CI] | min, max | unscaled logit std at init | unscaled entropy "
           f"| scaled entropy | p, gap vs d_qk {first} (paired t) | modes |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d, v in rows:
        g, ue, se, ul = (v["gap_loss_final"], v["unscaled_entropy_final"], v["scaled_entropy_final"],
                         v["unscaled_logit_std_step0"])
        p = v.get(f"gap_vs_dqk{first}_paired_p")
        out.append(f"| {d} | {g['mean']:.3f} [{g['ci95_lo']:.3f}, {g['ci95_hi']:.3f}]{_zero(g['ci95_lo'], g['ci95_hi'])} "
                   f"| {g['min']:.3f}, "
                   f"{g['max']:.3f} | {ul['mean']:.3f} | {fmt_number(round(ue['mean'], 5))} | {se['mean']:.3f} | "
                   f"{'' if p is None else f'{p:.2g}'} | {_modes_note(v) or 'one'} |")
    return out


def critical_markdown(m: dict) -> str:
    """Exercises 1-2: the one-variable curve (where present), then the mixed-width curve, labelled."""
    if not m:
        return ""
    out = []
    if m.get("d_qk"):
        out += critical_one_variable_markdown(m["d_qk"]) + [""]
    rows = sorted((int(k[1:]), v) for k, v in m.items() if k.startswith("d") and k[1:].isdigit())
    first = rows[0][0]
    out += [f"**Mixed width** (not one variable): the chapter's protocol at every d_head of its suggested grid, "
            f"{m['seeds']} seeds each (mean [min, max]), with d_model the smallest multiple of d_head ≥ 128 and "
            "n_head = d_model / d_head, so d_model and n_head move with d_head (`stages/critical.py`).\n",
            "| d_head | d_model | gap (unscaled − scaled) | unscaled entropy | scaled entropy | unscaled logit std, trained "
            f"| p, gap vs d_head {first} (paired t) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for d, v in rows:
        g, ue, se, ul = v["gap_loss_final"], v["unscaled_entropy_final"], v["scaled_entropy_final"], \
            v["unscaled_trained_logit_std_l0"]
        p = v.get(f"gap_vs_d{first}_paired_p")
        out.append(f"| {d} | {v['d_model']} | {g['mean']:.3f} [{g['min']:.3f}, {g['max']:.3f}] | "
                   f"{fmt_number(round(ue['mean'], 5))} | {se['mean']:.3f} | {ul['mean']:.4g} | "
                   f"{'' if p is None else f'{p:.2g}'} |")
    o = m["onset"]
    widths = sorted({v["d_model"] for _, v in rows})
    rule = (f"the first d_head whose mean gap's 95% lower bound exceeds the d_head-{first} gap's upper bound, "
            "reported at the grid's resolution")
    out.append(f"\nOnset of the mixed-width curve ({rule}): "
               + (f"d_head in ({o['after_d_head']:.0f}, {o['by_d_head']:.0f}]." if o.get("reached")
                  else "not within the grid.")
               + f" This curve mixes variables: d_model ({', '.join(map(str, widths))}) and n_head move with d_head, "
               "so it is not a one-variable answer (plots/critical/gap_vs_logit_std.png: the gap against the logit "
               "scale at init, for both designs, with the chapter's two models as separate reference points).")
    e1 = m.get("exercise1")
    if e1:
        r = e1["logit_std_ratio_step0"]
        out.append(f"Exercise 1 (d_head {2 * first}: half the heads at the same d_model): the unscaled logit std at "
                   f"step 0 is {r['mean']:.3f}× that of d_head {first} (√2 = 1.414); the gap is "
                   f"{e1['gap_loss_final']['mean']:.3f} [{e1['gap_loss_final']['min']:.3f}, {e1['gap_loss_final']['max']:.3f}].")
    return "\n".join(out) + "\n\n"


def qknorm_markdown(m: dict) -> str:
    if not m:
        return ""
    steps = sorted({k for v in m.values() for k in v if k.startswith("entropy_step")}, key=lambda k: int(k[12:]))
    out = ["Mean [min, max] over seeds; the plain scaled and unscaled models are the references (`stages/qknorm.py`).\n",
           "| form | seeds | loss final | val loss | logit std at init | " + " | ".join(f"entropy, step {k[12:]}" for k in steps)
           + " | entropy, end | ‖J‖_F, end |", "| --- " * (7 + len(steps)) + "|"]

    def cell(s, digits=3):
        return f"{s['mean']:.{digits}g} [{s['min']:.{digits}g}, {s['max']:.{digits}g}]"

    for name, v in m.items():
        out.append(f"| {name} | {v['seeds']} | {cell(v['loss_final'], 4)} | {cell(v['val_loss_final'], 4)} | "
                   f"{cell(v['logit_std_step0'])} | " + " | ".join(cell(v[k]) for k in steps)
                   + f" | {cell(v['entropy_final'])} | {cell(v['jacobian_fro_final'])} |")
    return "\n".join(out) + "\n\n"


def power_markdown(dists: dict, exp, float_order: dict) -> str:
    """How large a change the check catches (check.detectable_shifts): the headline metrics one by one,
    the other banded metrics summarised per stage."""
    rows = detectable_shifts(dists, exp.headline, float_order, exp.is_timing)
    if not rows:
        return "No seed distributions yet (metrics/dist/).\n\n"

    def units(r, k):
        x = r[k] * r["sd"]
        return f"×{math.exp(x):.3g}" if r["log"] else f"±{x:.3g}"

    out = ["The smallest shift of a metric's expected value that `attnrepro check` fails at least half the time, "
           "in reference seed sd and in the metric's units (×: a factor, for metrics judged on the log scale): a "
           "one-seed rerun against the prediction interval (metrics on their float-order tolerance, where the same "
           "seed drifts at most 0.01 sd between float orders: 0.1 sd), a five-seed rerun at other seeds by "
           "Welch's test of its mean, and at the reference's first five seeds by the test the check picks there: "
           "paired by seed where the metric's drift between float orders (docs/float_order.json, measured on one "
           "seed: a rough estimate) makes it the stronger, else Welch's; each at the first step of Holm's "
           "correction within its family (check.detectable_shifts). "
           f"{sum(r['float_order'] for r in rows)} of {len(rows)} metrics on their float-order tolerance, "
           f"{sum(r['paired'] for r in rows)} paired at the reference's seeds.\n",
           "| headline metric | seeds | 1-seed rerun: sd | units | 5 other seeds: sd | units | 5 reference seeds: sd "
           "| units |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r["headline"]):
        out.append(f"| {r['metric']} | {r['n']} | {r['one_seed_sd']:.2f} | {units(r, 'one_seed_sd')} | "
                   f"{r['five_seeds_sd']:.2f} | {units(r, 'five_seeds_sd')} | "
                   f"{r['five_reference_seeds_sd']:.2f}{' (paired)' if r['paired'] else ''} | "
                   f"{units(r, 'five_reference_seeds_sd')} |")
    out += ["", "| other banded metrics | count | 1-seed rerun: median sd (range) | 5 other seeds: median sd (range) "
            "| 5 reference seeds: median sd (range) |",
            "| --- | --- | --- | --- | --- |"]
    by_file: dict[str, list[dict]] = {}
    for r in (r for r in rows if not r["headline"]):
        by_file.setdefault(r["metric"].split(".")[0], []).append(r)

    def spread(rs, k):
        x = sorted(r[k] for r in rs)
        return f"{x[len(x) // 2]:.2f} ({x[0]:.2f}–{x[-1]:.2f})"

    for file, rs in sorted(by_file.items()):
        out.append(f"| {file} | {len(rs)} | {spread(rs, 'one_seed_sd')} | {spread(rs, 'five_seeds_sd')} | "
                   f"{spread(rs, 'five_reference_seeds_sd')}, {sum(r['paired'] for r in rs)} paired |")
    return "\n".join(out) + "\n\n"


def sensitivity_published(claims) -> dict[tuple[str, str], tuple[float, float]]:
    """(sensitivity variant, metric) -> (published figure, half a unit of its last digit), for every
    value cell of claims.yaml (`claims`: its Claims) that names one metric of the train or failures stage."""
    out = {}
    for c in claims:
        if c.cls != "value" or c.published is None:
            continue
        parts = c.metric.split(".")
        if len(parts) == 3 and parts[0] in ("train", "failures"):
            v = parts[1] if parts[0] == "train" else sens.SENSITIVITY_FAILURES + parts[1]
            out[(v, parts[2])] = (c.published, c.published_half)
    return out


def _sens_cells(m: dict) -> dict:
    return sens.cells(m) if isinstance(m, dict) else {}


def sensitivity_markdown(m: dict, exp, prereg_path: Path = sens.PREREGISTRATION) -> str:
    """The paired effects with Holm's correction and each choice's verdict, the pre-registered
    explanations (held / failed / not testable) and the joint protocol table."""
    table = _sens_cells(m)
    if not table:
        return ("metrics/sensitivity.json predates the paired design (no baseline band per cell): rerun the "
                "sensitivity stage.\n\n" if m else "")
    published = sensitivity_published(exp.claims)
    d = m.get("design", {})
    alpha = d.get("alpha", 0.05)
    out = [f"Paired effects (choice − baseline at the same seed; mean over {d.get('seeds', '?')} seeds, on the log "
           "scale for attention statistics and scales, ± its standard error, 95% t interval), Holm's adjusted p over "
           f"all {d.get('cells', '?')} cells, and whether the choice accounts for our deviation from the published "
           "figure (significant after Holm, toward it, not past the published figure's own band: "
           "experiments.sensitivity.accounts_for).\n",
           "| cell | baseline | published | choice | choice's mean | effect ± se [95% CI] | p_holm | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (v, metric), rows in sorted(table.items()):
        base = rows[sens.BASELINE]
        pub = published.get((v, metric))
        for c, r in rows.items():
            if c == sens.BASELINE:
                continue
            verdict = "—" if pub is None else sens.accounts_for(base, r, pub[0], pub[1], alpha)
            if verdict == "accounts":
                verdict = "**accounts**"
            if all(k in r for k in ("diff", "se", "ci_lo", "ci_hi", "p_holm")):
                effect = (f"{r['diff']:+.3g} ± {r['se']:.2g} [{r['ci_lo']:+.3g}, {r['ci_hi']:+.3g}]"
                          f"{_zero(r['ci_lo'], r['ci_hi'])}")
                p_holm = f"{r['p_holm']:.2g}"
            else:  # _finite dropped them: a run's value is not a number
                effect, p_holm = "not a number (a run diverged)", "—"
            out.append(f"| {v}.{metric} | {_num(base.get('mean'))} | {'—' if pub is None else f'{pub[0]:.4g}'} | "
                       f"{c} | {_num(r.get('mean'))} | {effect} | {p_holm} | {verdict} |")
    out.append("")
    if Path(prereg_path).is_file():
        verdicts = sens.prereg_verdicts(sens.load_prereg(prereg_path), m, published, alpha)
        n = {k: sum(x["verdict"] == k for x in verdicts) for k in ("held", "failed", "not testable")}
        out += [f"Pre-registered explanations ({prereg_path}, committed before the sweep ran): "
                f"{n['held']} held, {n['failed']} failed, {n['not testable']} not testable.\n",
                "| cell | choice | verdict | gap closed | reason given in advance |", "| --- | --- | --- | --- | --- |"]
        for x in verdicts:
            verdict = x["verdict"] + (f" ({x['why']})" if x["why"] else "")
            share = "—" if x.get("closes") is None else f"{100 * x['closes']:.0f}%"
            out.append(f"| {x['cell']} | {x['choice']} | {verdict} | {share} | {_cell(x['reason'])} |")
        out.append("")
    else:
        out += [f"No pre-registration at {prereg_path} (run from the repository's root): the pre-registered "
                "explanations are not judged here.\n"]
    joint = sens.joint_table(m, published)
    if joint:
        out += ["Protocols judged jointly: over the cells with a published figure, how many published figures fall "
                "inside each protocol's seed band (the rounding interval meets its 95% prediction interval; a "
                "failures-only choice leaves the train cells at the baseline's band) and the joint score Σ z², z = "
                "(published − centre) / sd of that protocol's seeds (lower: closer), and the same sum in the "
                "baseline's sd (a fixed yardstick per cell: a choice that only adds seed noise widens its own band "
                "and lowers its own Σz², never this one).\n",
                "| protocol | cells changed | inside | joint score Σz² | Σz² in the baseline's sd |",
                "| --- | --- | --- | --- | --- |"]
        for j in joint:
            out.append(f"| {j['protocol']} | {j['changed']} | {j['inside']} of {j['cells']} | {j['score']:.4g} "
                       f"| {j['score_base_sd']:.4g} |")
    return "\n".join(out) + "\n\n"


# ---------------------------------------------------------------- sections (the chapter's order)

@dataclass(frozen=True)
class Section:
    key: str  # the claims.yaml experiment (and metrics/<key>.json) it reports
    title: str
    chapter: str  # where the chapter runs it
    plots: tuple[str, ...]  # plots/<stage>/ folders whose PNGs it shows
    design: str  # the protocol in a sentence or two (numbers come from metrics, never typed here)


SECTIONS: tuple[Section, ...] = (
    Section("corpus", "Corpus", "§1.18.1", ("corpus",),
            "The chapter's training text: the first poems of the complete Tang poems (全唐诗) from the hash-pinned npm "
            "copy of the chinese-poetry collection, tokenized by character into a fixed vocabulary (<pad>, <unk> and the "
            "most frequent characters); the last tenth of the token stream is the validation split."),
    Section("train", "The controlled comparison: scaled against unscaled, over seeds", "§1.1-1.4, §1.7.7, §1.12",
            ("train", "seeds"),
            "TinyGPT at d_head 32 (four heads) and d_head 256 (one head), each with and without 1/√d_k, trained on the "
            "same batches from the same initialisation (the chapter's §1.18 recipe); the reference distribution repeats "
            "the four variants over paired seeds (scaled and unscaled share each seed's init draw and batch order), and "
            "records the layer-0 entropy, logit std and softmax Jacobian norm during training."),
    Section("init_sweep", "How large are q·k at initialisation?", "§1.3, §1.7, §1.19.1", ("init_sweep",),
            "A one-layer, one-head TinyGPT at d_head = d_model from 32 to 512, untrained: the standard deviation of the "
            "raw q·k logits averaged over random token batches, against the footnote's √d and the variance-propagation "
            "prediction v·√d (v = d·σ²)."),
    Section("heads", "What the eight heads of the small model do", "§1.8.5-1.8.6", ("heads",),
            "The trained d_head-32 scaled model on fixed validation sequences: each head's entropy, diagonal, "
            "previous-token weight and mean distance, its attention maps, and the loss increase when it is ablated; "
            "heads are compared with the published ones after a one-to-one matching within each layer."),
    Section("kv_cache", "The KV cache: memory accounting", "§1.8.7-1.8.8, §1.11.5", ("kv_cache",),
            "The KV-cache formula 2·layers·kv_heads·d_head·length·bytes for the chapter's model shapes (MHA, GQA, MQA), "
            "checked against the bytes a real cache for TinyGPT allocates; generation with and without the cache must "
            "give identical tokens; per-token latency against context length."),
    Section("failures", "Injected bugs and their symptoms", "§1.11, §1.13", ("failures",),
            "The small model trained briefly with each of the chapter's attention bugs (mask filled with 0, scaling after "
            "the softmax, no max subtraction, division by d_k) next to the correct attention, same seed and batches; the "
            "symptoms recorded, and the health checks of §1.13 run on every variant."),
    Section("latency", "What O(n²) costs in time", "§1.14.2", ("latency",),
            "Causal attention forward passes (SDPA and a naive version that materialises the n×n matrix) at growing "
            "sequence lengths, warm-up then timed repetitions; on a machine without CUDA a CPU sweep at smaller n."),
    Section("precision", "Numerical precision: fp32, fp16, bf16", "§1.6.4, §1.11.3, §1.16-1.17", ("precision",),
            "Format limits (torch.finfo), the naive against the stable softmax, exp overflow of logits at the chapter's "
            "measured scales, the real attention forward in each format, the additive-mask pitfall, bf16 accumulation, "
            "and parity of the manual attention and its backward with SDPA and autograd in float64."),
    Section("critical", "Exercises 1-2: the critical d_head", "§1.20.1-2", ("critical",),
            "The train protocol, scaled and unscaled, over seeds: with only the query/key width d_qk of one model "
            "moving (one variable), and at every d_head of the chapter's grid with d_model and n_head moving too "
            "(mixed width): where does the loss gap start to rise?"),
    Section("exercise3", "Exercise 3: the attention centroid per head", "§1.20.3", (),
            "For each head of the small model, the centroid distance dist_i = Σ_j (i − j) p_ij of every query row, its "
            "mean and its spread over positions; a head that spreads more than uniform attention is \"conditional\"."),
    Section("qknorm", "QK-norm at d_head 256", "§1.7.8, §1.26.5", ("qknorm",),
            "The large model with q and k normalised per head (LayerNorm, or unit L2 with a learned gain), with and "
            "without 1/√d_k, against the plain scaled and unscaled models, over seeds: had QK-norm been used, would the "
            "failed experiment have failed?"),
    Section("sensitivity", "Sensitivity to the source's unstated choices", "beyond the chapter", ("sensitivity",),
            "Paired changes of the settings the chapter leaves unstated (docs/PROTOCOL.md): the weight-decay value and "
            "the validation split for every run, and the failures table's schedule, block size and init for its runs "
            "only; each choice, and the combinations params list, against the protocol as written at the same seeds. "
            "Effects with their own paired standard errors, Holm's correction over all cells, the no-overshoot rule, "
            "the pre-registered explanations (docs/sensitivity_preregistration.yaml) and the protocols judged jointly."),
    Section("reversal", "Companion: digit reversal", "companion chapter", ("reversal",),
            "A two-block transformer learns to reverse six digits; four heads, one head, and four heads without the "
            "causal mask; accuracy, the reverse-alignment weight of each layer, and what the mask prevents."),
    Section("charlm", "Companion: a tiny character LM", "companion chapter", ("charlm",),
            "A four-block character-level model trained on eight sentences; loss curves, attention maps and its "
            "greedy and sampled continuations."),
)


def _g(d, path: str):
    """d['a']['b'] for path 'a.b', or None."""
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _f(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _claims_sentence(rs: list[ClaimResult]) -> str:
    """How this section's claims came out, in words."""
    parts = []
    for cls, word in (("conclusion", "conclusions hold"), ("checksum", "checksums hold"),
                      ("value", "published values lie inside our band or tolerance")):
        xs = [r for r in rs if r.claim.cls == cls and r.status != "skipped"]
        if xs:
            parts.append(f"{sum(r.passed for r in xs)} of {len(xs)} {word}")
    failed = [r.claim.id for r in rs if r.claim.cls == "conclusion" and r.status == "fail"]
    text = ("Claims: " + "; ".join(parts) + ".") if parts else ""
    if failed:
        text += " Not reproduced: " + ", ".join(f"`{c}`" for c in failed) + "."
    return text


def _answer_corpus(m, M, D) -> str:
    if not m:
        return ""
    return (f"The pinned text has {m.get('poems')} poems, {m.get('distinct_chars')} distinct characters and "
            f"{m.get('tokens', '—'):,} tokens (a line break encodes as <unk>, §1.18.1); the {m.get('vocab_size')}-token vocabulary covers "
            f"{100 * m['coverage']:.1f}% of the characters ({100 * m.get('unk_rate', 0):.1f}% of tokens are <unk>); "
            f"{m.get('train_tokens', 0):,} tokens train, {m.get('val_tokens', 0):,} validate.")


def _answer_train(m, M, D) -> str:
    s = M.get("seeds", {})
    out = []
    g32, g256, ratio = s.get("gap_d32_loss_final"), s.get("gap_d256_loss_final"), s.get("gap_ratio_of_means_loss_final")
    if g32 and g256:
        zero = "includes" if g32["ci95_lo"] <= 0 <= g32["ci95_hi"] else "excludes"
        out.append(f"Over {s.get('n_seeds')} paired seeds removing 1/√d_k costs d_head 256 {g256['mean']:.3f} nat "
                   f"[{g256['ci95_lo']:.3f}, {g256['ci95_hi']:.3f}] of final training loss and d_head 32 "
                   f"{g32['mean']:.3f} [{g32['ci95_lo']:.3f}, {g32['ci95_hi']:.3f}] (its interval {zero} 0)"
                   + (f"; the large model's gap is {ratio['value']:.2f}× the small one's [{ratio['ci95_lo']:.2f}, "
                      f"{ratio['ci95_hi']:.2f}]." if ratio else "."))
    u = m.get("d256_unscaled", {}) if m else {}
    sc = m.get("d256_scaled", {}) if m else {}
    if "entropy_step222" in u and "entropy_final" in u:
        out.append(f"In this run the unscaled d_head-256 attention has collapsed by step 222 (layer-0 entropy "
                   f"{u['entropy_step222']:.2g}, {u['entropy_final']:.2g} at the end"
                   + (f", against {sc['entropy_final']:.2f} with the scaling" if "entropy_final" in sc else "") + ")"
                   + (f" and its logits grew to a std of {u['logit_std_final']:.4g}" if "logit_std_final" in u else "")
                   + ": the attention saturates and stops learning, as the chapter says.")
    return " ".join(out)


def _answer_init_sweep(m, M, D) -> str:
    fit = m.get("fit") if m else None
    if not fit:
        return ""
    ds = sorted((int(k[1:]), v) for k, v in m.items() if k.startswith("d") and k[1:].isdigit())
    lo, hi = ds[0], ds[-1]
    return (f"At initialisation the logit std grows from {lo[1]['logit_std']:.3g} (d_head {lo[0]}) to "
            f"{hi[1]['logit_std']:.3g} (d_head {hi[0]}), a log-log slope of {fit['slope_measured']:.2f}: the "
            f"variance-propagation prediction (slope {fit['slope_varprop']:g}, off by at most "
            f"{100 * (10 ** fit['max_abs_log10_ratio_varprop'] - 1):.0f}%) "
            f"{'fits better than' if fit.get('varprop_fits_better') else 'does not fit better than'} the footnote's √d "
            f"(slope {fit['slope_footnote']:g}); the unscaled softmax entropy falls to {hi[1]['entropy']:.3g} at "
            f"d_head {hi[0]}.")


def _answer_heads(m, M, D) -> str:
    heads = {k: v for k, v in (m or {}).items() if k.startswith("l") and "h" in k and isinstance(v, dict)
             and "prev" in v}
    if not heads:
        return ""
    prev = max(heads, key=lambda h: (heads[h]["prev"], h))
    abl = max(heads, key=lambda h: (heads[h].get("ablation_delta", 0), h))
    d = m.get("layer1_minus_layer0_distance")
    return (f"The heads differ (entropies spread by {m.get('entropy_spread', 0):.3f}); {prev} is the clearest "
            f"previous-token head (weight {heads[prev]['prev']:.3f}); ablating {abl} costs the most "
            f"({heads[abl]['ablation_delta']:.3f} nat)"
            + ("" if d is None else f"; layer 1 looks {'farther' if d > 0 else 'no farther'} than layer 0 "
               f"(mean distance {d:+.3f} tokens)") + "." + _heads_over_seeds(D.get("heads") or {}))


def _heads_over_seeds(dist: dict) -> str:
    """How the same variant's heads come out at the other seeds (metrics/dist/heads.json)."""
    runs = list((dist.get("runs") or {}).values())
    if not runs:
        return ""
    n = len(runs)
    prev = sum(r["max_prev"] > 0.3 for r in runs)
    farther = sum(r["layer1_minus_layer0_distance"] > 0 for r in runs)
    return (f" Over {n} seeds of the same model (each seed's heads matched to this run's by their statistics): a "
            f"head with previous-token weight above 0.3 in {prev}, layer 1 farther than layer 0 in {farther}, "
            f"the largest previous-token weight {min(r['max_prev'] for r in runs):.3f} to "
            f"{max(r['max_prev'] for r in runs):.3f}: which roles a trained model's heads take varies with the seed.")


def _answer_kv_cache(m, M, D) -> str:
    if not m:
        return ""
    out = []
    c, gen = m.get("cache", {}), m.get("generation", {})
    if c:
        out.append(f"A real cache for the large TinyGPT allocates {c['nbytes_measured']:,} bytes, "
                   f"{'exactly' if c.get('match') else 'not'} what the formula gives ({c['nbytes_formula']:,})")
    if gen:
        out.append(f"generation with and without it gives {'identical' if gen.get('greedy_identical') else 'different'} "
                   f"greedy tokens ({gen.get('greedy_mismatches')} mismatches)")
    shapes = [(k.rsplit("_", 1)[-1].upper(), v) for k, v in sorted(m.items()) if k.startswith("llama2_70b_")]
    if shapes:
        out.append("at the Llama-2-70B shape the cache takes " + ", ".join(
            f"{v['kv_bytes_per_token'] / 1e6:.3g} MB per token ({v['kv_gb_n4096']:.3g} GB at 4096) with {name}"
            for name, v in shapes))
    return ("; ".join(out) + ".") if out else ""


def _answer_failures(m, M, D) -> str:
    if not m:
        return ""
    variants = sorted(m)
    fired = {v: sorted(k[6:] for k, x in m[v].items() if k.startswith("check_") and not k.endswith("_value") and x)
             for v in variants}
    caught = [v for v in variants if v != "correct" and m[v].get("caught_by_intended")]
    bugs = [v for v in variants if v != "correct"]
    out = [f"{len(caught)} of {len(bugs)} injected bugs are caught by the health check meant for them"]
    out.append("; ".join(f"{v}: {', '.join(fired[v]) or 'no check fires'}" for v in variants))
    c = m.get("correct", {})
    same = [v for v in bugs if m[v].get("loss_final") == c.get("loss_final")]
    if same:
        out.append(f"{', '.join(same)} {'trains' if len(same) == 1 else 'train'} exactly like the correct model "
                   f"(final loss {c.get('loss_final'):.4g}): only the health checks tell "
                   f"{'it' if len(same) == 1 else 'them'} apart ("
                   + "; ".join(f"{v}: {', '.join(fired[v]) or 'none'}" for v in same) + ")")
    return ". ".join(out) + "."


def _answer_latency(m, M, D) -> str:
    if not m:
        return ""
    setup = m.get("setup", {})
    impls = {k: v for k, v in sorted(m.items()) if isinstance(v, dict) and "exponent" in v}
    if not impls:
        return ""
    where = "on CUDA" if setup.get("cuda") else "on the CPU (no CUDA on this machine: the published GPU timings are not measured)"
    text = (f"Measured {where}: time grows as n^" + ", ".join(f"{v['exponent']:.2f} for {k}" for k, v in impls.items())
            + " over the measured lengths")
    ns = sorted(set.intersection(*[{int(k[1:].split("_")[0]) for k in v if re.fullmatch(r"n\d+_mean_ms", k)}
                                   for v in impls.values()]))
    if ns:
        n = ns[-1]
        t = {k: v[f"n{n}_mean_ms"] for k, v in impls.items()}
        slow, fast = max(t, key=lambda k: (t[k], k)), min(t, key=lambda k: (t[k], k))
        text += (f"; at n = {n} one forward takes {t[fast]:.3g} ms with {fast} and {t[slow]:.3g} ms with {slow} "
                 f"({t[slow] / t[fast]:.1f}×)")
    return text + "."


def _answer_precision(m, M, D) -> str:
    if not m:
        return ""
    out = []
    o = m.get("overflow", {})
    if o:
        out.append(f"exp of float32 logits overflows in {o['unscaled_inf']} of {o['size']} entries at std "
                   f"{o['unscaled_std']:g} and {o['scaled_inf']} at std {o['scaled_std']:g}")
    sm = m.get("softmax", {})
    if sm:
        nan = [d for d in ("fp32", "fp16", "bf16") if sm.get(f"{d}_naive_nan")]
        out.append(f"the naive softmax gives nan in {', '.join(nan) or 'no format'} where the stable one does not")
    par = m.get("parity", {})
    if par:
        out.append(f"the manual attention and its backward agree with SDPA and autograd in float64 to "
                   f"{max(par.values()):.2g}")
    ft = m.get("forward_trained", {})
    if ft:
        bad = sorted(k for k, v in ft.items() if v and "stable" in k)
        out.append(f"with trained-scale q and k the stable forward stays finite in "
                   f"{'every' if not bad else 'all but ' + str(len(bad))} format/d_head case")
    text = "; ".join(out) + "."
    return (text[0].upper() + text[1:]) if out else ""


def _answer_critical(m, M, D) -> str:
    if not m or "onset" not in m:
        return ""
    q = m.get("d_qk")
    if q and "onset" in q:  # the one-variable curve answers the exercise; the mixed-width one is context
        pts = sorted((int(k[3:]), v) for k, v in q.items() if k.startswith("dqk") and k[3:].isdigit())
        o = q["onset"]
        text = (f"With only the q/k width moving ({q['model']} model, {q['seeds']} seeds) the mean gap goes from "
                f"{pts[0][1]['gap_loss_final']['mean']:.3f} at d_qk {pts[0][0]} to "
                f"{pts[-1][1]['gap_loss_final']['mean']:.3f} at d_qk {pts[-1][0]}; ")
        text += (f"its onset lies in d_qk ({o['after_d_qk']:.0f}, {o['by_d_qk']:.0f}] (the first grid point whose "
                 f"gap's 95% lower bound exceeds the d_qk-{pts[0][0]} gap's upper bound; no finer than the grid)"
                 if o.get("reached") else "no grid point's gap rises beyond the first point's seed noise")
        return text + ". The mixed-width curve (d_model and n_head moving with d_head) is shown beside it."
    rows = sorted((int(k[1:]), v) for k, v in m.items() if k.startswith("d") and k[1:].isdigit())
    o = m["onset"]
    first, last = rows[0], rows[-1]
    text = (f"Over {m.get('seeds')} seeds the mean gap goes from {first[1]['gap_loss_final']['mean']:.3f} at d_head "
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


def _answer_exercise3(m, M, D) -> str:
    c = (M.get("heads") or {}).get("conditional")
    if not c:
        return ""
    above = c["distance_std"] > c["uniform_distance_std"]
    return (f"The most conditional head is l{c['layer']}h{c['head']} (centroid spread {c['distance_std']:.2f} over "
            f"positions), {'above' if above else 'below'} the {c['uniform_distance_std']:.2f} that uniform causal "
            f"attention shows from the growth of i alone: "
            + ("a conditional head exists." if above else "by this measure no head of this model is conditional."))


def _answer_qknorm(m, M, D) -> str:
    if not m:
        return ""
    ok = {k: v for k, v in m.items() if "entropy_final" in v and "loss_final" in v}
    if not ok:
        return ""
    saved = sorted(k for k, v in ok.items() if v["entropy_final"]["min"] > 0.1)
    collapsed = sorted(k for k, v in ok.items() if v["entropy_final"]["max"] < 0.1)
    best = min(ok, key=lambda k: (ok[k]["loss_final"]["mean"], k))
    return (f"Final attention stays spread (entropy above 0.1 on every seed) for {', '.join(saved) or 'none'}; it "
            f"ends saturated (below 0.1 on every seed) for {', '.join(collapsed) or 'none'}. The lowest mean final "
            f"loss is {best}'s ({ok[best]['loss_final']['mean']:.3f}).")


def _answer_sensitivity(m, M, D, claims=()) -> str:
    if not _sens_cells(m):
        return ""
    published = sensitivity_published(claims)
    joint = sens.joint_table(m, published)
    if not joint:
        return ""
    base = next(j for j in joint if j["protocol"] == sens.BASELINE)
    best = min(joint, key=lambda j: (j["score"], j["protocol"]))
    fixed = min(joint, key=lambda j: (j["score_base_sd"], j["protocol"]))
    most = max(joint, key=lambda j: (j["inside"], -j["score"]))
    sig = sum(1 for rows in _sens_cells(m).values() for c, r in rows.items()
              if c != sens.BASELINE and r.get("significant"))
    d = m.get("design", {})
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


def _answer_reversal(m, M, D) -> str:
    models = {k: v for k, v in (m or {}).items() if isinstance(v, dict) and "digit_acc" in v}
    if not models:
        return ""
    return ("; ".join(f"{k}: digit accuracy {100 * v['digit_acc']:.1f}%, sequences {100 * v.get('seq_acc', 0):.1f}%, "
                      f"layer-0 reverse alignment {100 * v.get('align_l0', 0):.1f}%" for k, v in sorted(models.items()))
            + (f". Without the mask, altering future answer digits changes prefix logits by up to "
               f"{models['no_mask']['prefix_change_mask_off']:.3g} (with the mask: "
               f"{models['no_mask'].get('prefix_change_mask_on', 0):g})." if "prefix_change_mask_off" in
               models.get("no_mask", {}) else "."))


def _answer_charlm(m, M, D) -> str:
    if not m or "train_loss_final" not in m:
        return ""
    return (f"{m.get('params', 0):,} parameters; the loss falls from {m.get('initial_loss', float('nan')):.4f} to "
            f"{m['train_loss_final']:.4f} (validation {m.get('val_loss_final', float('nan')):.4f}) in "
            f"{m.get('final_step')} steps; greedy continuations reproduce "
            f"{100 * m.get('greedy_verbatim_frac', 0):.0f}% of the training text verbatim: it memorises its "
            f"{m.get('sentences')} sentences.")


ANSWERS = {"corpus": _answer_corpus, "train": _answer_train, "init_sweep": _answer_init_sweep,
           "heads": _answer_heads, "kv_cache": _answer_kv_cache, "failures": _answer_failures,
           "latency": _answer_latency, "precision": _answer_precision, "critical": _answer_critical,
           "exercise3": _answer_exercise3, "qknorm": _answer_qknorm, "sensitivity": _answer_sensitivity,
           "reversal": _answer_reversal, "charlm": _answer_charlm}


def answer(key: str, metrics: dict, dists: dict, results: list[ClaimResult]) -> str:
    """The section's one-paragraph answer, written from the numbers (never typed figures); metrics a
    partial workspace lacks leave their sentence out."""
    try:
        extra = ([r.claim for r in results],) if key == "sensitivity" else ()
        text = ANSWERS[key](metrics.get(key) or {}, metrics, dists, *extra)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        text = ""  # a metrics file of another layout: the claims sentence still answers
    claims = _claims_sentence([r for r in results if r.claim.experiment == key])
    return " ".join(t for t in (text, claims) if t) or "No metrics for this experiment yet."


def runs_count(key: str, metrics: dict, dists: dict) -> tuple[int | None, str]:
    """The training runs behind a section, counted from what metrics record, and how."""
    m = metrics.get(key) or {}
    if key == "train":
        v = [k for k in m if k != "comparison" and isinstance(m[k], dict)]
        n = (metrics.get("seeds") or {}).get("n_seeds")
        if n:
            return len(v) * n, f"{len(v)} variants × {n} seeds (this run's seed among them)"
        return (len(v), f"{len(v)} variants") if v else (None, "")
    if key == "failures":
        runs = (dists.get("failures") or {}).get("runs") or {}
        n = len(runs) or 1
        return (len(m) * n, f"{len(m)} variants × {n} seed(s)") if m else (None, "")
    if key == "critical":
        d = [k for k in m if k.startswith("d") and k[1:].isdigit()]
        q = m.get("d_qk") or {}
        w = [k for k in q if k.startswith("dqk") and k[3:].isdigit()]
        if d and m.get("seeds") and w and q.get("seeds"):
            return (m.get("runs") or len(d) * 2 * m["seeds"] + len(w) * 2 * q["seeds"],
                    f"{len(w)} d_qk × scaled/unscaled × {q['seeds']} seeds (one variable), {len(d)} d_head × "
                    f"scaled/unscaled × {m['seeds']} seeds (mixed width) and the chapter's variants at the one-variable "
                    "seeds (reference points), a run two of these share counted once; one another stage shares is "
                    "trained once")
        if d and m.get("seeds"):
            return len(d) * 2 * m["seeds"], f"{len(d)} d_head × scaled/unscaled × {m['seeds']} seeds"
    if key == "qknorm":
        seeds = {v.get("seeds") for v in m.values() if isinstance(v, dict)}
        if m and len(seeds) == 1 and None not in seeds:
            n = seeds.pop()
            return len(m) * n, f"{len(m)} forms and references × {n} seeds (references shared through the run store)"
    if key == "sensitivity":
        d = m.get("design") if isinstance(m, dict) else None
        if d and d.get("runs"):
            return d["runs"], (f"{d['protocols']} protocols (the baseline, choices, combinations) × the variants each "
                               f"applies to × {d['seeds']} paired seeds; the baseline's runs at shared seeds are the "
                               "seeds and failures stages' own")
    if key == "reversal":
        models = [k for k, v in m.items() if isinstance(v, dict) and "digit_acc" in v]
        return (len(models), f"{len(models)} models of {_g(m, 'config.steps')} steps") if models else (None, "")
    if key == "charlm":
        return (1, f"1 model of {m.get('final_step')} steps") if m else (None, "")
    return None, ""


NO_TRAINING = {"corpus": "no training", "init_sweep": "no training (forward passes at initialisation)",
               "heads": "no training (probes of the trained small model)", "kv_cache": "no training",
               "latency": "no training (timed forward passes)", "precision": "no training",
               "exercise3": "no training (from the heads stage's probes)"}


COST_STAGES = {"train": ("train", "seeds")}  # a section whose runs come from more than its own stage


def run_hours(envs: dict, stages) -> Optional[tuple[int, float]]:
    """(runs, hours of the runs' own wall time when they were trained) from the stages' environment
    records; None where no record has them."""
    recs = [envs[s] for s in stages if "run_wall_seconds" in envs.get(s, {})]
    if not recs:
        return None
    return sum(e["runs"] for e in recs), sum(e["run_wall_seconds"] for e in recs) / 3600


def cost_line(key: str, metrics: dict, dists: dict, envs: Optional[dict] = None) -> str:
    n, how = runs_count(key, metrics, dists)
    what = NO_TRAINING.get(key) or (f"{n} training run{'s' if n != 1 else ''} ({how})" if n
                                    else "training runs not counted in metrics/")
    spent = run_hours(envs or {}, COST_STAGES.get(key, (key,)))
    if spent:
        return (f"**Cost.** {what}; {spent[1]:.2f} h of run wall time over {spent[0]} runs (each run's own time "
                "when it was trained, on one core; metrics/env records it).")
    extra = ""
    if key == "kv_cache":
        lat = _g(metrics, "kv_cache.latency") or {}
        if "gen_cached_s" in lat and "gen_uncached_s" in lat:
            extra = (f"; its timed generations took {lat['gen_cached_s']:.2f} s with the cache and "
                     f"{lat['gen_uncached_s']:.2f} s without")
    return f"**Cost.** {what}; wall time not recorded in metrics/{extra}."


def per_seed_markdown(dist: dict, this: dict, keys: list[str], prefix: str) -> str:
    """Each seed's value of the headline metrics `keys` ('<prefix>.<variant>.<metric>'), with this run,
    the mean and the sd over seeds."""
    runs = dist.get("runs") or {}
    keys = [k[len(prefix) + 1:] for k in keys if k.startswith(prefix + ".")]
    rows = [k for k in keys if any(_g(r, k) is not None for r in runs.values())]
    if not runs or not rows:
        return ""
    seeds = sorted(runs, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    out = [f"Per seed: the headline metrics of `{prefix}` for each of the {len(seeds)} seeds of metrics/dist/{prefix}.json "
           "(mean and sd over those seeds):\n",
           "| metric | this run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | sd |",
           "| --- | --- |" + " --- |" * len(seeds) + " --- | --- |"]
    for k in rows:
        vals = [_g(runs[s], k) for s in seeds]
        xs = [v for v in vals if isinstance(v, (int, float))]
        b = Band.of(xs) if xs else None
        mean, sd = (b.mean if b else None), (b.sd if b and b.n > 1 else None)
        out.append(f"| {k} | {_f(_g(this, k), 4)} | " + " | ".join(_f(v, 4) for v in vals)
                   + f" | {_f(mean, 4)} | {_f(sd, 3)} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the report

def build(claims_path: Path, metrics_dir: Path, plots_dir: Path, pairs, smooth: int = 20,
          exclude_plots: tuple[str, ...] = ("report",), plots_href: str = "../plots") -> Report:
    """pairs: [(d_head, {scaled: variant})]; plots_href: plots_dir as seen from the report's folder."""
    exp = load(claims_path)
    metrics = load_metrics_dir(metrics_dir)
    dists = load_dists(metrics_dir / "dist")
    envs = load_envs(metrics_dir / "env")
    results = evaluate_all(exp, metrics, dists, envs)
    c = counts(results)
    series = {}
    for _, pair in pairs:
        for name in pair.values():
            f = plots_dir / "train" / f"{name}.csv"
            if f.exists():
                series[name] = read_series(f)
    figures: dict[str, bytes] = {}
    for name, fig in (("train_loss.png", loss_figure(series, pairs, smooth)),
                      ("train_diagnostics.png", diagnostics_figure(series, pairs))):
        if fig:
            figures[name] = fig
    embedded = [(png.parent.name, png.name) for png in sorted(plots_dir.glob("*/*.png"))
                if png.parent.name not in exclude_plots]
    # each section's own metrics file, nested as its stage writes it (and the seed summaries)
    metrics = {k: _read(metrics_dir / f"{k}.json") for k in sorted({s.key for s in SECTIONS} | {"seeds"})}
    seeds = metrics.get("seeds") or {}
    train_dist = dists.get("train", {})

    total = [runs_count(s.key, metrics, dists) for s in SECTIONS]
    counted = sum(n for n, _ in total if n)
    md = ["# attnrepro: reproduction report\n",
          "The chapter's conclusions, checksums and published numbers (claims.yaml) against this run "
          "(metrics/) and the reference seed distributions (metrics/dist/), one section per experiment in the "
          "chapter's order. Generated by the `report` stage; same metrics, same bytes.\n",
          "## Verdict\n",
          "The reproduction check is `attnrepro check` (this run against the committed reference: exact on the "
          "reference's machine, within seed bands elsewhere; it needs git, so it is not run here). What this report "
          "states is the claims' verdicts:\n",
          "| class | claims | hold / inside | fail / outside | skipped |", "| --- | --- | --- | --- | --- |"]
    for cls in CLASSES:
        md.append(f"| {CLASS_WORDS[cls]} | {c[cls]['n']} | {c[cls]['passed']} | {c[cls]['failed']} | {c[cls]['skipped']} |")
    nr = [r for r in results if r.claim.cls == "conclusion" and r.status == "fail"]
    if nr:
        md += ["", "Conclusions of the chapter **not reproduced** here (each stated at the chapter's strength; our figure "
               "beside the chapter's):\n"]
        md += [f"- `{r.claim.id}`: {_cell(r.claim.text)} — ours: {_where(r)}" for r in nr]
    else:
        md += ["", "Every conclusion of the chapter that this machine can test holds here."]
    spent = run_hours(envs, sorted(envs))
    md += ["", (f"**Compute spent:** {spent[1]:.1f} h of run wall time over {spent[0]} training runs (each run's own "
                "time when it was trained; a run shared by two stages through the run store counts in both).\n")
           if spent else
           (f"**Compute spent:** not recorded (these environment records predate run times); {counted} training runs "
            "counted from metrics/ (some shared between stages through the run store; sensitivity's not counted).\n"),
           f"**Machine:** {machine_line(envs)} (every field per stage: the appendix).\n"]
    head = headline_markdown(seeds, train_dist, exp)
    if head:
        md += ["## Headline\n", head]
    md += ["## How to read a published value\n",
           "Where our runs have seeds, first by its **percentile among our seeds** "
           "(0 or 100: beyond all of them; with n seeds it moves in steps of 100/n, a tie counting half), and where a "
           "variant's seeds fall into modes, by the mode the chapter's run was in (read once per variant off the "
           "chapter's published value of the statistic the modes were found on; unknown where it prints none). Then by "
           "our band: the published figure, with "
           "the rounding interval of its printed digits, is \"inside\" when it meets the 95% prediction interval of one "
           "run over our seeds (per mode where there are modes; z: seed standard deviations from our mean, or with "
           "modes from the chapter's mode where its diagnostic names one, else the nearest, in within-mode sd; on the "
           "log scale for attention statistics), \"off\" when it misses its tolerance where no seed "
           "distribution exists. Head portraits are judged after matching our heads to the published ones one-to-one "
           "within a layer (Hungarian assignment over their statistics). "
           f"Published values outside without an explanation measured here: **{c['value']['unexplained']}** (marked "
           "\"unexplained\" below).\n"]

    shown: set[tuple[str, str]] = set()
    own = {"train": [("figures/train_loss.png", "Training loss, d_head 32 and 256, with and without scaling",
                      "train_loss.png"),
                     ("figures/train_diagnostics.png", "Layer-0 attention entropy and softmax Jacobian norm over training",
                      "train_diagnostics.png")]}
    extras = {"critical": lambda: critical_markdown(metrics.get("critical") or {}),
              "exercise3": lambda: centroid_markdown(metrics.get("heads") or {}),
              "qknorm": lambda: qknorm_markdown(metrics.get("qknorm") or {}),
              "sensitivity": lambda: sensitivity_markdown(metrics.get("sensitivity") or {}, exp),
              "train": lambda: per_seed_markdown(train_dist, metrics.get("train") or {}, exp.headline, "train"),
              "failures": lambda: per_seed_markdown(dists.get("failures", {}), metrics.get("failures") or {},
                                                    exp.headline, "failures")}
    sections = list(SECTIONS) + [Section(k, exp.sections[k], "", (), "") for k in exp.sections
                                 if k not in {s.key for s in SECTIONS} and any(r.claim.experiment == k for r in results)]
    for number, sec in enumerate(sections, 1):
        rs = [r for r in results if r.claim.experiment == sec.key]
        md.append(f"## {number}. {sec.title}" + (f" ({sec.chapter})" if sec.chapter else "") + "\n")
        if sec.design:
            md.append(f"**Design.** {sec.design}\n")
        md.append(cost_line(sec.key, metrics, dists, envs) + "\n")
        md.append(f"**Answer.** {answer(sec.key, metrics, dists, results)}\n")
        figs = [(src, alt) for src, alt, name in own.get(sec.key, []) if name in figures]
        if sec.key == "train" and not series:
            md.append("No training curves yet (plots/train/*.csv missing).\n")
        for stage in sec.plots:
            for st, name in embedded:
                if st == stage:
                    figs.append((f"{plots_href}/{st}/{name}", f"{st}: {name}"))
                    shown.add((st, name))
        md += [f"![{alt}]({src})\n" for src, alt in figs]
        if sec.key in extras:
            md.append(extras[sec.key]())
        if rs:
            md.append(experiment_markdown(None, rs))
    rest = [e for e in embedded if e not in shown]
    if rest:
        md.append("## Other figures\n")
        md += [f"![{st}: {name}]({plots_href}/{st}/{name})\n" for st, name in rest]
    md += ["## Gate power\n", power_markdown(dists, exp, _read(Path(FLOAT_ORDER)).get("ratio", {}))]
    md += ["## Appendix: machine records\n", env_markdown(envs)]
    summary = {cls: {k: v for k, v in c[cls].items()} for cls in CLASSES}
    markdown = "\n".join(md).rstrip() + "\n"
    markdown = re.sub(r"\n{3,}", "\n\n", markdown)
    page = markdown_to_html(markdown, resolver(figures, plots_dir, plots_href))
    return Report(claims_json(results), summary, markdown, figures, results, page)


def run(cfg: ReportConfig, train, attention, out: str | Path) -> Report:
    """The `report` stage's report of metrics/ and plots/ (in the working folder) for the report folder
    `out` (figure links relative to it). train: params `train` (experiments.protocol.TrainConfig: the
    scaled/unscaled pairs of the loss figures); attention: params `attention` (audit.load.AttentionConfig):
    with an implementation other than the builtin, REPORT.md ends with its audit."""
    from .audit.cli import report_section  # the audit is imported only when a report is built
    from .audit.load import BUILTIN
    from .experiments.comparison import pairs_by_dhead

    pairs = sorted(pairs_by_dhead(train).items())
    plots_href = Path(os.path.relpath(Path("plots").resolve(), Path(out).resolve())).as_posix()
    rep = build(Path(cfg.claims), Path("metrics"), Path("plots"), pairs, smooth=cfg.smooth, plots_href=plots_href)
    if attention.impl not in BUILTIN:  # the builtin's report stays as it was
        rep.markdown += "\n" + report_section(attention.impl)
        rep.html = markdown_to_html(rep.markdown, resolver(rep.figures, Path("plots"), plots_href))
    return rep
