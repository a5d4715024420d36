"""The reproduction report: the chapter's conclusions, checksums and published values
against this run and its seed distributions, per experiment, with figures.

`build(...)` evaluates claims.yaml against metrics/ and returns the content of
metrics/claims.json, metrics/claims_summary.json, report/REPORT.md and the report's
figures (PNG bytes).
Everything is a pure function of its inputs: no dates, sorted iteration, PNGs
written without a Software/date stamp, so the same metrics give byte-identical
outputs.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .experiments.sensitivity import sensitivity_target
from .claims import (CLASSES, MOVE_SD, ClaimResult, claims_json, counts, evaluate_all, load, load_dists, load_envs,
                     load_metrics_dir)
from .config import require
from .expr import fmt_number


@dataclass
class Report:
    claims_json: dict  # metrics/claims.json: every claim (a plain output)
    summary: dict  # metrics/claims_summary.json: the counts per class (the DVC metric)
    markdown: str
    figures: dict[str, bytes]  # file name under report/figures/ -> PNG bytes (the report's own)
    results: list[ClaimResult]

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
    return "`" + _cell(r.claim.expr) + "`"


def _where(r: ClaimResult) -> str:
    if r.status == "skipped":
        return "—"
    parts = []
    if r.value is not None and r.bound is not None:
        parts.append(f"{fmt_number(r.value)} vs {fmt_number(r.bound)}")
    if r.seeds_n:
        parts.append(f"{r.seeds_held}/{r.seeds_n} seeds" + ("" if r.mean_holds else ", not the mean"))
    if r.status == "missing":
        return _cell(r.detail)
    if r.passed:
        return _cell("; ".join(parts) or "holds")
    return _cell("; ".join(p for p in (*parts, r.detail) if p) or "fails")


def _value_verdict(r: ClaimResult) -> str:
    if r.status != "fail":
        return MARK.get(r.status, r.status)
    return "outside" if r.band is not None else "off"


def _band(r: ClaimResult) -> str:
    if r.band is None:
        return r.claim.tol.text() if r.claim.tol else "exact"
    lo, hi = r.band.prediction_interval()
    return f"{fmt_number(lo)} – {fmt_number(hi)}"


def _z(r: ClaimResult) -> str:
    if r.z is None:
        return ""
    return "∞" if math.isinf(r.z) else f"{r.z:+.1f}"


def experiment_markdown(title: str, results: list[ClaimResult]) -> str:
    out = [f"## {title}\n"]
    for cls in ("conclusion", "checksum"):
        rs = [r for r in results if r.claim.cls == cls]
        if not rs:
            continue
        out += [f"**{CLASS_WORDS[cls].capitalize()}**\n", "| claim | test | this run | result |", "| --- | --- | --- | --- |"]
        for r in rs:
            test = _expr(r) if not r.claim.is_cell else f"`{_cell(r.claim.expr)}` = {fmt_number(r.claim.published)} ({r.claim.tol.text()})"
            label = r.claim.text if not r.claim.is_cell else r.claim.id.split(".", 2)[-1]
            out.append(f"| {_cell(label)} | {test} | {_where(r) if not r.claim.is_cell else fmt_number(r.value)} | "
                       f"{MARK.get(r.status, r.status)} |")
        out.append("")
    values = [r for r in results if r.claim.cls == "value"]
    tables: dict[str, list[ClaimResult]] = {}
    for r in values:
        tables.setdefault(r.claim.id.split(".")[1], []).append(r)
    for rs in tables.values():
        c = rs[0].claim
        out += [f"**{_cell(c.text)}**" + (f" — {_cell(c.note)}" if c.note else "") + "\n",
                "| cell | published | this run | our band (95% PI over seeds) or tolerance | z | verdict | explanation |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rs:
            cell = r.claim.id.split(".", 2)[-1]
            out.append(f"| {_cell(cell)} | {fmt_number(r.claim.published)} | {fmt_number(r.value) if r.value is not None else _cell(r.detail)} | "
                       f"{_band(r)} | {_z(r)} | {_value_verdict(r)} | {_cell(r.explanation)} |")
        out.append("")
    return "\n".join(out) + "\n"


def claims_table(results: list[ClaimResult], show_all: bool) -> str:
    """The `attnrepro claims` table: gated and failing claims (every claim with show_all)."""
    shown = [r for r in results if show_all or r.claim.gate or r.status != "pass"]
    out = ["| claim | class | published | this run | band or tolerance | z | result |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in shown:
        c = r.claim
        pub = fmt_number(c.published) if c.is_cell else _expr(r)
        val = fmt_number(r.value) if c.is_cell and r.value is not None else _where(r)
        band = _band(r) if c.is_cell else ""
        out.append(f"| {c.id} | {c.cls} | {pub} | {val} | {band} | {_z(r)} | {r.status} |")
    return "\n".join(out) + "\n"


def env_markdown(envs: dict[str, dict]) -> str:
    if not envs:
        return "No environment records (metrics/env/*.json) were found.\n"
    stages = sorted(envs)
    keys = sorted({k for e in envs.values() for k in e})
    rows = [(k, [envs[s].get(k) for s in stages]) for k in keys]
    if all(len({repr(v) for v in vals if v is not None}) <= 1 for _, vals in rows):
        out = [f"All {len(stages)} stages ({', '.join(stages)}) ran on the same machine:\n", "| | |", "| --- | --- |"]
        out += [f"| {k} | {_cell(_env_value(k, next(v for v in vals if v is not None)))} |" for k, vals in rows]
    else:
        out = ["| | " + " | ".join(stages) + " |", "| --- |" + " --- |" * len(stages)]
        out += [f"| {k} | " + " | ".join("—" if v is None else _cell(_env_value(k, v)) for v in vals) + " |"
                for k, vals in rows]
    return "\n".join(out) + "\n"


def _env_value(key: str, v) -> str:
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / 2**30:.1f} GiB"
    return str(v)


def headline_markdown(seeds: dict, exp) -> str:
    """This repository's measured gaps with their seed intervals, next to the chapter's."""
    if not seeds:
        return ""
    pub = {c.id.rsplit(".", 1)[-1]: c.published for c in exp.claims if c.id.startswith("train.gaps.")}
    n = seeds.get("n_seeds")
    lines = [f"Measured over {n} paired seeds (mean, 95% confidence interval of the mean), the chapter's figure in "
             "brackets:\n"]
    for key, label in (("gap_d32_loss_final", "loss gap at d_head 32"), ("gap_d256_loss_final", "loss gap at d_head 256")):
        s = seeds.get(key)
        if s:
            lines.append(f"- {label}: **{fmt_number(round(s['mean'], 3))}** [{fmt_number(round(s['ci95_lo'], 3))}, "
                         f"{fmt_number(round(s['ci95_hi'], 3))}] ({fmt_number(pub.get(key))})")
    r = seeds.get("gap_ratio_of_means_loss_final")
    if r:
        lines.append(f"- ratio of the mean gaps: **{r['value']:.2f}×** [{r['ci95_lo']:.2f}, {r['ci95_hi']:.2f}] "
                     f"(bootstrap over seeds; {fmt_number(pub.get('gap_ratio_loss_final'))}×)")
    return "\n".join(lines) + "\n"


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def centroid_markdown(m: dict) -> str:
    """Exercise 3: where each head's attention centroid sits, and how much it moves between positions."""
    c = m.get("conditional")
    if not c:
        return ""
    heads = sorted(k for k in m if k.startswith("l") and "h" in k and isinstance(m[k], dict))
    out = ["## Exercise 3: the attention centroid per head (§1.20.3)\n",
           "dist_i = Σ_j (i − j) p_ij per query row; its mean and its standard deviation over the positions "
           f"(`stages/heads.py`). Uniform causal attention spreads by {c['uniform_distance_std']:.2f} from the "
           "growth of i alone; a head whose centroid spreads more is \"conditional\" (near for some queries, far "
           "for others).\n", "| head | centroid distance | its sd over positions | previous-token weight |",
           "| --- | --- | --- | --- |"]
    out += [f"| {h} | {m[h]['distance']:.2f} | {m[h]['distance_std']:.2f} | {m[h]['prev']:.3f} |" for h in heads]
    out.append(f"\nMost conditional: **l{c['layer']}h{c['head']}** (sd {c['distance_std']:.2f}, "
               f"{'above' if c['distance_std'] > c['uniform_distance_std'] else 'not above'} the uniform baseline).")
    return "\n".join(out) + "\n\n"


def critical_markdown(m: dict) -> str:
    """Exercises 1-2: the loss gap and the entropies against d_head."""
    if not m:
        return ""
    rows = sorted((int(k[1:]), v) for k, v in m.items() if k.startswith("d") and k[1:].isdigit())
    first = rows[0][0]
    out = ["## Exercises 1-2: the critical d_head (§1.20.1-2)\n",
           f"The chapter's protocol at every d_head, {m['seeds']} seeds each (mean [min, max]); the model family "
           "keeps the chapter's two models at its ends (`stages/critical.py`).\n",
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
    if o.get("reached"):
        hi = f"{o['ci95_hi']:.0f}" if "ci95_hi" in o else "beyond the grid"
        out.append(f"\nOnset (the mean gap has risen {o['rise_nats']} nat above its d_head-{first} value): "
                   f"**d_head {o['d_head']:.0f}**, 95% bootstrap interval over seeds [{o.get('ci95_lo', float('nan')):.0f}, {hi}].")
    else:
        out.append(f"\nThe mean gap does not rise {o['rise_nats']} nat above its d_head-{first} value within the grid.")
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
    out = ["## QK-norm at d_head 256 (§1.7.8, §1.26.5)\n",
           "Mean [min, max] over seeds; the plain scaled and unscaled models are the references (`stages/qknorm.py`).\n",
           "| form | seeds | loss final | val loss | logit std at init | " + " | ".join(f"entropy, step {k[12:]}" for k in steps)
           + " | entropy, end | ‖J‖_F, end |", "| --- " * (7 + len(steps)) + "|"]

    def cell(s, digits=3):
        return f"{s['mean']:.{digits}g} [{s['min']:.{digits}g}, {s['max']:.{digits}g}]"

    for name, v in m.items():
        out.append(f"| {name} | {v['seeds']} | {cell(v['loss_final'], 4)} | {cell(v['val_loss_final'], 4)} | "
                   f"{cell(v['logit_std_step0'])} | " + " | ".join(cell(v[k]) for k in steps)
                   + f" | {cell(v['entropy_final'])} | {cell(v['jacobian_fro_final'])} |")
    return "\n".join(out) + "\n\n"


def sensitivity_markdown(m: dict, exp) -> str:
    """The one-factor table: choice -> effect on each deviating metric, in units of seed sd."""
    if not m:
        return ""
    published = {c.expr: c.published for c in exp.claims if c.cls == "value"}
    choices = sorted({c for v in m.values() for e in v.values() for c in e})
    out = ["## Sensitivity to the source's unstated choices\n",
           "Effect of changing one choice, in units of the seed standard deviation of the plain protocol "
           "(mean paired difference over seeds; log scale for attention statistics). ▲/▼: the published figure lies "
           f"above/below our baseline; **bold**: the choice moves the metric more than {MOVE_SD} sd toward it. A choice "
           "explains a deviation in the tables above (claims.yaml `moved_by`) only if it also moves it at least half-way "
           "there.\n",
           "| metric | ours (baseline) | published | " + " | ".join(choices) + " |", "| --- " * (3 + len(choices)) + "|"]
    for variant, metrics in m.items():
        for metric, effects in metrics.items():
            key = ".".join((*sensitivity_target(variant), metric))
            pub = published.get(key)
            base = next(iter(effects.values()))["baseline"]
            arrow = "" if pub is None else ("▲" if pub > base else "▼")
            cells = []
            for c in choices:
                e = effects[c]["effect_sd"]
                toward = pub is not None and abs(e) > MOVE_SD and (e > 0) == (pub > base)
                cells.append(f"**{e:+.1f}**" if toward else f"{e:+.1f}")
            out.append(f"| {variant}.{metric} | {base:.4g} | {'' if pub is None else f'{pub:.4g} {arrow}'} | "
                       + " | ".join(cells) + " |")
    return "\n".join(out) + "\n\n"


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
    seeds = _read(metrics_dir / "seeds.json")

    md = ["# attnrepro: reproduction report\n",
          "The chapter's conclusions, checksums and published numbers (claims.yaml) against this run "
          "(metrics/) and the reference seed distributions (metrics/dist/). Generated by the `report` stage; "
          "same metrics, same bytes.\n",
          headline_markdown(seeds, exp),
          "| class | claims | hold / inside | fail / outside | skipped |", "| --- | --- | --- | --- | --- |"]
    for cls in CLASSES:
        md.append(f"| {CLASS_WORDS[cls]} | {c[cls]['n']} | {c[cls]['passed']} | {c[cls]['failed']} | {c[cls]['skipped']} |")
    md += ["", f"Published values outside our band without an explanation measured here: **{c['value']['unexplained']}** "
           "(marked \"unexplained\" below). A value is \"outside\" when the published figure falls outside the 95% "
           "prediction interval of one run over our seeds (z: seed standard deviations from our mean, on the log scale "
           "for attention statistics), \"off\" when it misses its tolerance where no seed distribution exists.\n"]
    order = list(exp.sections)
    for exp_name in order:
        rs = [r for r in results if r.claim.experiment == exp_name]
        if rs:
            md.append(experiment_markdown(exp.sections[exp_name], rs))
    md.append(centroid_markdown(_read(metrics_dir / "heads.json")))
    md.append(critical_markdown(_read(metrics_dir / "critical.json")))
    md.append(qknorm_markdown(_read(metrics_dir / "qknorm.json")))
    md.append(sensitivity_markdown(_read(metrics_dir / "sensitivity.json"), exp))
    md.append("## Figures\n")
    if "train_loss.png" in figures:
        md.append("![Training loss, d_head 32 and 256, with and without scaling](figures/train_loss.png)\n")
    if "train_diagnostics.png" in figures:
        md.append("![Layer-0 attention entropy and softmax Jacobian norm over training](figures/train_diagnostics.png)\n")
    if not series:
        md.append("No training curves yet (plots/train/*.csv missing).\n")
    for stage in sorted({s for s, _ in embedded}):
        md.append(f"### From stage `{stage}`\n")
        md += [f"![{stage}: {name}]({plots_href}/{stage}/{name})\n" for _, name in [e for e in embedded if e[0] == stage]]
    md += ["## Machine\n", env_markdown(envs)]
    summary = {cls: {k: v for k, v in c[cls].items()} for cls in CLASSES}
    return Report(claims_json(results), summary, "\n".join(md).rstrip() + "\n", figures, results)


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
    return rep
