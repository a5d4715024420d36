"""The claims' verdict tables of the report (one experiment's conclusions, checksums and published
values: `experiment_markdown`; the conclusions on the chapter's own figures and those rewritten to hold
there: `self_consistency_markdown`) and of `attnrepro claims` (`claims_table`)."""

from __future__ import annotations

import math

from attnrepro.formatting import fmt_number, md_table, table_cell
from typing import Optional

from attnrepro.judge.claims import Claim, ClaimResult, printed

MARK = {"pass": "✅", "fail": "❌", "missing": "❌ missing", "skipped": "⏭ skipped"}
CLASS_WORDS = {"conclusion": "conclusions (the chapter's findings; gated)",
               "checksum": "checksums (true by construction; gated)",
               "value": "published values (informational)"}


def _expr(r: ClaimResult) -> str:
    """A predicate's test: its code (the returned expression, for a one-line predicate)."""
    return "`" + table_cell(r.claim.source) + "`"


def this_run_text(r: ClaimResult) -> str:
    """A claim's "this run" cell: its value against its bound, the seeds it holds on, or why it fails."""
    if r.status == "skipped":
        return "—"
    parts = []
    if r.value is not None and r.bound is not None:
        parts.append(f"{fmt_number(r.value)} vs {fmt_number(r.bound)}")
    elif 0 < len(r.read) <= 4 and not r.passed:  # no single comparison to show: the figures it read
        parts.append(", ".join(f"{k} = {fmt_number(v)}" for k, v in zip(r.read, r.read_values)))
    if r.seeds_n:
        parts.append(r.share_text())
    if r.status == "missing":
        return table_cell(r.detail)
    if r.passed:
        return table_cell("; ".join(parts) or "holds")
    return table_cell("; ".join(p for p in (*parts, "" if r.seeds_n else r.detail) if p) or "fails")


def _value_verdict(r: ClaimResult) -> str:
    if r.status != "fail":
        return MARK.get(r.status, r.status)
    return "outside" if r.band is not None else "off"


def _band(r: ClaimResult) -> str:
    if r.interval is not None:
        return f"Fieller's 95% interval {fmt_number(r.interval[0])} – {fmt_number(r.interval[1])}"
    if r.band is None:
        return r.claim.tol.text() if r.claim.tol else "exact"
    if r.band.modes:  # each mode's interval: their hull would show a value between the modes as inside
        return " or ".join(f"{fmt_number(lo)} – {fmt_number(hi)}" for lo, hi in r.band.mode_intervals())
    lo, hi = r.band.prediction_interval()
    return f"{fmt_number(lo)} – {fmt_number(hi)}"


def _percentile(r: ClaimResult) -> str:
    if r.percentile is None:
        return ""
    lo, hi = r.percentile_range or (r.percentile, r.percentile)
    spread = "" if round(lo) == round(hi) else f" ({lo:.0f}–{hi:.0f} over its rounding interval)"
    return (f"{r.percentile:.0f}{spread}"
            + ("" if r.mode is None else f" (the chapter's run: our mode {r.mode}, by {r.mode_by})"))


def z_text(r: ClaimResult) -> str:
    """A published value's z among our seeds, signed; "" where it has none."""
    if r.z is None:
        return ""
    return "∞" if math.isinf(r.z) else f"{r.z:+.1f}"


def experiment_markdown(title: str | None, results: list[ClaimResult],
                        classes: tuple[str, ...] = ("conclusion", "checksum", "value")) -> str:
    """One experiment's claims tables of `classes` (conclusions, checksums, one table per published-values
    entry), under a `## title` heading unless title is None (the report's sections give their own)."""
    out = [f"## {title}\n"] if title else []
    for cls in [c for c in ("conclusion", "checksum") if c in classes]:
        rs = [r for r in results if r.claim.cls == cls]
        if not rs:
            continue
        out.append(f"**{CLASS_WORDS[cls].capitalize()}**\n")
        rows = []
        for r in rs:
            test = _expr(r) if not r.claim.is_cell else f"`{table_cell(r.claim.metric)}` = {printed(r.claim)} ({r.claim.tol.text()})"
            label = r.claim.text if not r.claim.is_cell else r.claim.id.split(".", 2)[-1]
            mark = "❌ not reproduced" if cls == "conclusion" and r.status == "fail" else MARK.get(r.status, r.status)
            rows.append([table_cell(label), test, this_run_text(r) if not r.claim.is_cell else fmt_number(r.value), mark])
        out += md_table(["claim", "test", "this run", "result"], rows)
        out.append("")
    values = [r for r in results if r.claim.cls == "value" and "value" in classes]
    tables: dict[str, list[ClaimResult]] = {}
    for r in values:
        tables.setdefault(r.claim.id.split(".")[1], []).append(r)
    for rs in tables.values():
        c = rs[0].claim
        out.append(f"**{table_cell(c.text)}**" + (f" — {table_cell(c.note)}" if c.note else "") + "\n")
        header = ["cell", "published", "this run", "percentile of the published figure among our seeds",
                  "our band (95% PI over seeds) or tolerance", "z", "verdict", "explanation"]
        rows = []
        for r in rs:
            cell = r.claim.id.split(".", 2)[-1] + (f" (ours: {r.matched})" if r.matched else "")
            rows.append([table_cell(cell), printed(r.claim),
                         fmt_number(r.value) if r.value is not None else table_cell(r.detail),
                         _percentile(r), _band(r), z_text(r), _value_verdict(r), table_cell(r.explanation)])
        out += md_table(header, rows)
        out.append("")
    return "\n".join(out) + "\n"


def _verdict(r: ClaimResult) -> str:
    return ("holds" if r.passed else "does not hold") + f" ({this_run_text(r)})"


def self_consistency_markdown(checked: list[tuple[Claim, Optional[bool], str]],
                              rewritten: list[tuple[ClaimResult, ClaimResult]]) -> tuple[list[str], list[str]]:
    """The report's lines and the appendix's table: the chapter's conclusions on its own published figures
    (judge.claims.on_published: each holds, fails, or names the figure it lacks) and each conclusion rewritten
    to hold there (judge.claims.revised), with why and its verdict before and after, on these metrics."""
    judged = [(c, ok) for c, ok, _ in checked if ok is not None]
    failing = [c.id for c, ok in judged if not ok]
    report = [f"**On the chapter's own figures** (its published values as the metrics): {len(judged) - len(failing)} "
              f"of the {len(judged)} conclusions they are enough to evaluate hold"
              + (f"; not: {', '.join(f'`{c}`' for c in failing)}" if failing else "")
              + f". {len(checked) - len(judged)} need a figure the chapter does not print (the appendix names it).\n"]
    appendix = []
    if rewritten:
        report.append("**Rewritten to what the chapter's text and figures say together** (verdict on these metrics "
                      "before → after; what each asked before: the appendix): "
                      + "; ".join(f"`{new.claim.id}` ({'holds' if old.passed else 'does not hold'} → "
                                  f"{'holds' if new.passed else 'does not hold'})" for old, new in rewritten) + ".\n")
        appendix = ["**Conclusions rewritten** (what each asked before, and its verdict on these metrics then → now):\n",
                    *[f"- `{new.claim.id}`: was {new.claim.why}; {_verdict(old)} → {_verdict(new)}."
                      for old, new in rewritten], ""]
    rows = [[c.id, "—" if ok is None else ("holds" if ok else "❌ does not hold"),
             f"the chapter prints no `{missing}`" if ok is None else ""] for c, ok, missing in checked]
    return report, appendix + md_table(["conclusion", "on the chapter's figures", "not evaluable"], rows) + [""]


def claims_table(results: list[ClaimResult], show_all: bool) -> str:
    """The `attnrepro claims` table: gated and failing claims (every claim with show_all)."""
    shown = [r for r in results if show_all or r.claim.gate or r.status != "pass"]
    rows = []
    for r in shown:
        c = r.claim
        pub = printed(c) if c.is_cell else _expr(r)
        val = fmt_number(r.value) if c.is_cell and r.value is not None else this_run_text(r)
        band = _band(r) if c.is_cell else ""
        rows.append([c.id, c.cls, pub, val, band, z_text(r), r.status])
    out = md_table(["claim", "class", "published", "this run", "band or tolerance", "z", "result"], rows)
    return "\n".join(out) + "\n"
