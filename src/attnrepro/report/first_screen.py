"""The chapter's headline figures against ours: the table that opens REPORT.md and the README's results.

Each comparison uses the band its kind calls for, named where it is used:

    a published figure of one run   our 95% prediction interval of one run (PI), and its percentile among our seeds
    a mean against a mean           the 95% interval of the mean (the choices arms' differences)
    a ratio of means                Fieller's 95% interval over the paired seeds

The chapter's figures are single runs, so every row but the ratio is a PI. The cells are the choices
arms' headline cells (experiments.choices.cells), read on each reference seed of metrics/dist/train.json;
a cell whose value claim has modes keeps the claims' band (judge.claims.band), so the table and the
appendix agree. Where the chapter's figure misses our PI the row says why, in a few words: the claim's
explanation, and the protocol-choice arms whose PI holds it (their per-seed plots/choices/<arm>.csv).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from attnrepro.experiments import choices
from attnrepro.formatting import fmt_number, md_table
from attnrepro.judge.claims import ClaimResult, band, printed
from attnrepro.stats import Band, fieller_ratio, percentile_of

PI = "95% prediction interval of one run"
CI = "95% interval of the mean"
FIELLER = "Fieller's 95% interval"

LABELS = {"loss_final": "final loss", "gap_d": "loss gap", "entropy_step": "layer-0 entropy at step",
          "jacobian_fall_orders": "‖J‖'s fall over training, the large unscaled model (orders)",
          "trained_logit_std_l0": "trained logit std", "trained_w_qkv_fro_l0": "trained ‖W_qkv‖",
          "jacobian_fro_step": "‖J‖ at step", "gap_ratio": "ratio of the mean gaps"}


@dataclass
class Row:
    cell: str  # a choices cell: <variant>.<metric>, gap_d<d>, jacobian_fall_orders, gap_ratio
    chapter: float
    mean: float  # ours over the seeds (geometric for a log cell; the ratio of the mean gaps)
    lo: float
    hi: float
    band: str  # PI or FIELLER
    printed: str  # the chapter's figure as it prints it (a derived one: to three digits, and from what)
    percentile: Optional[float]  # the chapter's figure among our seeds (None for the ratio)
    reason: str = ""  # where the chapter's figure misses our band: why, as far as measured

    @property
    def inside(self) -> bool:
        return self.lo <= self.chapter <= self.hi


def label(cell: str) -> str:
    """A cell in words: 'final loss, d32_unscaled', 'loss gap at d_head 256', ..."""
    variant, _, metric = cell.rpartition(".")
    for key, words in LABELS.items():
        if metric.startswith(key):
            rest = metric[len(key):].removesuffix("_l0")
            text = f"{words} {rest}".strip() if key.endswith("step") else words
            if key == "gap_d":
                text = f"loss gap at d_head {rest}"
            return f"{text}, {variant}" if variant else text
    return cell


def metric_key(cell: str) -> Optional[str]:
    """The train metric a cell is (its value claim's), or None for a derived cell."""
    if cell.startswith("gap_d"):
        return f"train.comparison.{cell}_loss_final"
    return f"train.{cell}" if "." in cell else None


def seed_cells(dist: Mapping, pairs, steps: Sequence[int]) -> list[dict[str, float]]:
    """Each reference seed's headline cells (metrics/dist/train.json); a seed lacking one of the variants or
    diagnostics they read (a partial workspace) is left out."""
    out = []
    for _, run in sorted(dist.get("runs", {}).items()):
        try:
            out.append(choices.cells(run, pairs, steps))
        except (KeyError, TypeError, ZeroDivisionError):
            continue
    return out


def rows(dists: Mapping[str, dict], pairs, steps: Sequence[int], claims, results: Sequence[ClaimResult] = (),
         arms: Optional[Mapping[str, Mapping[str, list[dict]]]] = None) -> list[Row]:
    """The table's rows, in the choices' cell order, the ratio after the gaps. arms: per-seed cells of each
    protocol-choice arm (experiments.choices.read_seeds), to name the arms that hold a figure ours misses."""
    per_seed = seed_cells(dists.get("train", {}), pairs, steps) if pairs and steps else []
    if len(per_seed) < 2:
        return []
    pub = choices.published_cells(claims)
    shown = {c.metric: printed(c) for c in claims if c.cls == "value" and c.published is not None}
    by_metric = {r.claim.metric: r for r in results if r.claim.cls == "value"}
    out = []
    for cell in sorted(per_seed[0], key=order):
        if cell not in pub:
            continue
        values = [s[cell] for s in per_seed]
        key = metric_key(cell)
        b = (band(dists, key) if key else None) or Band.of(values, log=choices.log_cell(cell))
        lo, hi = b.prediction_interval()
        mean = sum(values) / len(values) if not b.log else math.exp(sum(map(math.log, values)) / len(values))
        text = shown.get(key) or f"{pub[cell]:.3g} (from two of its figures)"
        row = Row(cell, pub[cell], mean, lo, hi, PI, text, percentile_of(values, pub[cell]))
        if not row.inside:
            row.reason = reason(by_metric.get(key), cell, pub[cell], arms or {})
        out.append(row)
    gaps = sorted((c for c in per_seed[0] if c.startswith("gap_d")), key=lambda c: int(c[5:]))
    ratio = next((c for c in claims if c.id.startswith("train.gap_ratio.")), None)
    if ratio is not None and len(gaps) >= 2:
        num, den = [s[gaps[-1]] for s in per_seed], [s[gaps[0]] for s in per_seed]
        lo, hi = fieller_ratio(num, den)
        at = max(i for i, r in enumerate(out) if r.cell.startswith("gap_d")) + 1
        out.insert(at, Row("gap_ratio", ratio.published, sum(num) / sum(den), lo, hi, FIELLER, printed(ratio), None))
    return out


def order(cell: str) -> tuple:
    """The chapter's order: the choices' groups; within one, by d_head, unscaled first."""
    digits = "".join(ch if ch.isdigit() else " " for ch in cell.split("_l0")[0]).split()
    return choices.cell_order(cell)[0], int(digits[0]) if digits else 0, "_scaled" in cell


def reason(result: Optional[ClaimResult], cell: str, chapter: float, arms: Mapping[str, Mapping[str, list[dict]]]) -> str:
    """Why the chapter's figure misses our PI, in a few words: its value claim's explanation (the unstated
    choice that accounts for it, or the evidence's first clause), and the arms whose PI holds it."""
    parts = []
    if result is not None and result.explanation:
        if result.claim.moved_by and not result.explanation.startswith("unexplained"):
            parts.append("moved by " + ", ".join(sorted({m.rsplit(".", 1)[-1] for m in result.claim.moved_by}))
                         + " (sensitivity sweep)")
        else:
            parts.append(result.explanation.split(";")[0])
    holding = [name for name, sides in arms.items()
               if (pi := choices.prediction_interval(sides.get(choices.ARM, []), cell)) and pi[0] <= chapter <= pi[1]]
    if holding:
        parts.append("held by the PI of the arm" + ("s " if len(holding) > 1 else " ") + ", ".join(holding))
    return "; ".join(parts) or "no measured cause"


def markdown(table: Sequence[Row], n_seeds: int) -> list[str]:
    """The table: the chapter's figure, ours (mean and band), the chapter's percentile, and why it misses."""
    if not table:
        return []
    lines = [f"The chapter's headline figures (single runs) against ours over {n_seeds} paired seeds: our mean and "
             f"the {PI} (the ratio: {FIELLER}), and where the chapter's figure lies among our seeds:\n"]
    body = [[label(r.cell), r.printed, f"{fmt_number(_round(r.mean))} [{fmt_number(_round(r.lo))}, "
             f"{fmt_number(_round(r.hi))}]" + (" (Fieller)" if r.band == FIELLER else ""),
             "—" if r.percentile is None else f"{r.percentile:.0f}",
             "inside" if r.inside else f"outside: {r.reason}"] for r in table]
    return lines + md_table(["figure", "chapter", "ours: mean [band]", "chapter's percentile", "verdict"], body) + [""]


def _round(x: float) -> float:
    """Three significant digits: a band over ten seeds carries no more."""
    return float(f"{x:.3g}") if math.isfinite(x) else x
