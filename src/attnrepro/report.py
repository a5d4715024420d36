"""The reproduction report: published vs reproduced, per section, with figures.

`build(...)` evaluates claims.yaml against metrics/*.json and returns the content
of metrics/claims.json, report/REPORT.md and the report's figures (PNG bytes).
Everything is a pure function of its inputs: no dates, sorted iteration, PNGs
written without a Software/date stamp, so the same metrics give byte-identical
outputs.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from .claims import (Claim, Result, claims_metrics, evaluate_all, fmt_number, load_claims, load_envs,
                     load_metrics_dir, totals)

MARK = {"pass": "✅ pass", "fail_gate": "❌ FAIL", "fail_info": "✗ off", "missing": "❌ missing",
        "skipped": "⏭ skipped"}
PNG_META = {"Software": None}


@dataclass
class Report:
    claims_json: dict
    markdown: str
    figures: dict[str, bytes]       # file name under report/figures/ -> PNG bytes (the report's own)
    results: list[Result]


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


def variant_pairs(train_params: dict) -> list[tuple[int, dict[bool, str]]]:
    """[(d_head, {scaled: variant})] sorted by d_head, from params train.models/variants."""
    pairs: dict[int, dict[bool, str]] = {}
    for name, v in (train_params.get("variants") or {}).items():
        shape = train_params["models"][v["model"]]
        pairs.setdefault(shape["d_model"] // shape["n_head"], {})[bool(v["scaled"])] = name
    return sorted(pairs.items())


# ---------------------------------------------------------------- figures

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9})
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata=PNG_META, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


STYLE = {True: ("tab:blue", "scaled (÷√d)"), False: ("tab:red", "unscaled")}


def loss_figure(series: dict[str, dict], pairs, smooth: int) -> bytes | None:
    """Fig 1.2: training loss, one panel per d_head, scaled vs unscaled."""
    pairs = [(d, p) for d, p in pairs if any(v in series for v in p.values())]
    if not pairs:
        return None
    plt = _pyplot()
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
    return _png(fig)


def diagnostics_figure(series: dict[str, dict], pairs) -> bytes | None:
    """Fig 1.4: layer-0 attention entropy and ||J||_F over training, all variants."""
    names = [(d, scaled, p[scaled]) for d, p in pairs for scaled in (False, True) if p.get(scaled) in series]
    if not names:
        return None
    plt = _pyplot()
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
    return _png(fig)


# ---------------------------------------------------------------- markdown

def _status(r: Result) -> str:
    if r.status in ("pass", "missing", "skipped"):
        return MARK[r.status]
    return MARK["fail_gate"] if r.claim.gate else MARK["fail_info"]


def _expr(c: Claim) -> str:
    return "`" + " ".join(c.expr.split()).replace("|", "\\|") + "`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def section_markdown(section: str, results: list[Result]) -> str:
    out = [f"## {section}\n"]
    direction = [r for r in results if r.claim.kind == "direction"]
    value = [r for r in results if r.claim.kind == "value"]
    if direction:
        out += ["**Conclusions** (direction claims, must hold on any machine)\n",
                "| Claim | Test | Reproduced | Gate | Result |", "| --- | --- | --- | --- | --- |"]
        for r in direction:
            shown = _direction_values(r)
            out.append(f"| {_cell(r.claim.text)} | {_expr(r.claim)} | {_cell(shown)} | "
                       f"{'yes' if r.claim.gate else 'no'} | {_status(r)} |")
        out.append("")
    if value:
        out += ["**Numbers** (value claims: published vs reproduced)\n",
                "| Claim | Published | Reproduced | Δ | Tolerance | Gate | Result |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in value:
            c = r.claim
            delta = "—" if r.value is None or math.isnan(r.value) else _signed(r.value - c.published)
            repro = fmt_number(r.value) if r.value is not None else _cell(r.detail or "—")
            out.append(f"| {_cell(c.text)} | {fmt_number(c.published)} | {repro} | {delta} | "
                       f"{c.tolerance_text()} | {'yes' if c.gate else 'no'} | {_status(r)} |")
        out.append("")
    notes = [r for r in results if r.claim.note]
    if notes:
        out.append("Notes:\n")
        out += [f"- `{r.claim.id}`: {_cell(r.claim.note)}" for r in notes]
        out.append("")
    reasons = [r for r in value if r.claim.reason]
    if reasons:
        out += ["<details><summary>Why these tolerances</summary>\n"]
        out += [f"- `{r.claim.id}` ({r.claim.tolerance_text()}): {_cell(r.claim.reason)}" for r in reasons]
        out += ["\n</details>\n"]
    return "\n".join(out) + "\n"


def _direction_values(r: Result) -> str:
    if r.status == "missing":
        return r.detail
    if r.value is not None and r.bound is not None:
        return f"{fmt_number(r.value)} vs {fmt_number(r.bound)}"
    return ", ".join(f"{k.rsplit('.', 2)[-2] + '.' if k.count('.') > 1 else ''}{k.rsplit('.', 1)[-1]} = "
                     f"{fmt_number(v)}" for k, v in r.inputs.items()) or "—"


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + fmt_number(x)


def env_markdown(envs: dict[str, dict]) -> str:
    if not envs:
        return "No environment records (metrics/env/*.json) were found.\n"
    stages = sorted(envs)
    keys = sorted({k for e in envs.values() for k in e})
    rows = []
    for k in keys:
        vals = [envs[s].get(k) for s in stages]
        rows.append((k, vals))
    same = all(len({repr(v) for v in vals if v is not None}) <= 1 for _, vals in rows)
    if same:
        out = [f"All {len(stages)} stages ({', '.join(stages)}) ran on the same machine:\n",
               "| | |", "| --- | --- |"]
        for k, vals in rows:
            v = next(v for v in vals if v is not None)
            out.append(f"| {k} | {_cell(_env_value(k, v))} |")
    else:
        out = ["| | " + " | ".join(stages) + " |", "| --- |" + " --- |" * len(stages)]
        for k, vals in rows:
            out.append(f"| {k} | " + " | ".join("—" if v is None else _cell(_env_value(k, v)) for v in vals) + " |")
    return "\n".join(out) + "\n"


def _env_value(key: str, v) -> str:
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / 2**30:.1f} GiB"
    return str(v)


def _section_number(section: str) -> int:
    """'§2 train: loss' -> 2, so sections follow the spec's order whatever the file order."""
    digits = "".join(ch for ch in section.lstrip("§ ").split(" ")[0] if ch.isdigit())
    return int(digits) if digits else 10**6


def build(claims_path: Path, metrics_dir: Path, plots_dir: Path, train_params: dict, smooth: int = 20,
          exclude_plots: tuple[str, ...] = ("report",), plots_href: str = "../plots") -> Report:
    """plots_href: plots_dir as seen from the report's folder (the links to the stages' figures)."""
    claims = load_claims(claims_path)
    metrics = load_metrics_dir(metrics_dir)
    envs = load_envs(metrics_dir / "env")
    results = evaluate_all(claims, metrics, envs)
    t = totals(results)

    pairs = variant_pairs(train_params)
    series = {}
    for _, pair in pairs:
        for name in pair.values():
            f = plots_dir / "train" / f"{name}.csv"
            if f.exists():
                series[name] = read_series(f)
    figures: dict[str, bytes] = {}
    fig = loss_figure(series, pairs, smooth)
    if fig:
        figures["train_loss.png"] = fig
    fig = diagnostics_figure(series, pairs)
    if fig:
        figures["train_diagnostics.png"] = fig
    # the stages' own figures are linked where they lie, not copied
    embedded = [(png.parent.name, png.name) for png in sorted(plots_dir.glob("*/*.png"))
                 if png.parent.name not in exclude_plots]

    sections: dict[str, list[Result]] = {}
    for r in sorted(results, key=lambda r: _section_number(r.claim.section)):
        sections.setdefault(r.claim.section, []).append(r)

    md = ["# attnrepro: reproduction report\n",
          "Published figures of the source (claims.yaml) against this run's metrics (metrics/*.json). "
          "Generated by the `report` stage; same metrics, same bytes.\n",
          f"**{t['passed']} of {t['n']} claims pass**, {t['failed']} fail ({t['missing']} of them missing a "
          f"metric), {t['skipped']} skipped. Gated claims (the chapter's conclusions and exact checksums): "
          f"**{t['gated_passed']} of {t['gated']} pass**"
          + (f", {t['gated_failed']} fail." if t["gated_failed"] else ".") + "\n",
          "Value claims are informational: \"✗ off\" means the number is outside the stated tolerance "
          "(a different corpus copy, CPU instead of the author's GPU, another torch build), "
          "not that the pipeline is broken. \"❌\" marks a gated claim that failed or a metric that is "
          "missing. \"⏭ skipped\" claims need a GPU run.\n",
          "## Summary\n", "| Section | Claims | Passed | Failed | Skipped | Gated failed |",
          "| --- | --- | --- | --- | --- | --- |"]
    for section, rs in sections.items():
        st = totals(rs)
        md.append(f"| {section} | {st['n']} | {st['passed']} | {st['failed']} | {st['skipped']} | "
                  f"{st['gated_failed']} |")
    md.append("")
    for section, rs in sections.items():
        md.append(section_markdown(section, rs))

    md.append("## Figures\n")
    if "train_loss.png" in figures:
        md.append("![Training loss, d_head 32 and 256, with and without scaling](figures/train_loss.png)\n")
    if "train_diagnostics.png" in figures:
        md.append("![Layer-0 attention entropy and softmax Jacobian norm over training]"
                  "(figures/train_diagnostics.png)\n")
    if not series:
        md.append("No training curves yet (plots/train/*.csv missing).\n")
    for stage in sorted({s for s, _ in embedded}):
        md.append(f"### From stage `{stage}`\n")
        for _, name in [e for e in embedded if e[0] == stage]:
            md.append(f"![{stage}: {name}]({plots_href}/{stage}/{name})\n")
    md += ["## Machine\n", env_markdown(envs)]
    return Report(claims_metrics(results), "\n".join(md).rstrip() + "\n", figures, results)
