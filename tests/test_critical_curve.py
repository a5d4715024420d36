"""The critical curve's fitted model (report.critical_curve) on synthetic seeds of known shape, and its figures:
generated where docs/ and the README print them, typed nowhere else (issue 63)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnrepro.files import read_json
from attnrepro.report import critical_curve as C
from attnrepro.report import readme

REPO = Path(__file__).resolve().parents[1]
GRID = [8, 10, 12, 14, 16, 32, 48, 64, 80, 96, 128, 192, 256]
GENERATED = re.compile(r"<!-- (\w+):begin.*?<!-- \1:end -->", re.S)


def seeds(gap, n=5, offset_sd=0.1, noise=0.03, seed=0) -> pd.DataFrame:
    """Per seed and d_qk: gap(d_qk) plus a seed offset shared by every point and per-point noise."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame([{"seed": s, "d_qk": d, "gap_loss_final": gap(d) + off + noise * rng.standard_normal()}
                         for s, off in enumerate(offset_sd * rng.standard_normal(n)) for d in GRID])


def test_the_fit_recovers_a_known_logistic_within_its_intervals():
    truth = {"low": 0.1, "high": 0.8, "mid": 4.0, "width": 0.5}
    f = C.fit(seeds(lambda d: C.logistic(math.log2(d), *truth.values())), "d_qk")
    p = f["params"]
    for k, v in (("low", truth["low"]), ("high", truth["high"]), ("mid", truth["mid"]),
                 ("log_width", math.log(truth["width"])), ("x90", truth["mid"] + C.RISE / 2 * truth["width"])):
        assert p[k]["ci_lo"] <= v <= p[k]["ci_hi"], (k, p[k], v)
    assert p["high"]["value"] == pytest.approx(0.8, abs=0.1) and C.levels_off(f)
    assert f["at_bound"] == [] and f["residual_sd"] == pytest.approx(f["within_sd"], rel=0.2)


def test_a_curve_still_rising_at_the_grids_end_is_not_said_to_level_off():
    f = C.fit(seeds(lambda d: 0.1 * math.log2(d)), "d_qk")
    assert not C.levels_off(f)
    assert "not shown to end within the grid" in C.model_text(f)


def test_the_one_onset_rule_is_the_paired_one_on_both_designs():
    m = read_json(REPO / "metrics" / "critical.json")
    text = C.report_markdown(m, C.fits(REPO / "plots")) + C.doc_markdown(m, C.fits(REPO / "plots"))
    interval = lambda o, x: f"{x} in ({o[f'after_{x}']:.0f}, {o[f'by_{x}']:.0f}]"  # noqa: E731
    for (paired, unpaired), x in (((m["d_qk"]["reading"]["paired_onset"], m["d_qk"]["onset"]), "d_qk"),
                                  ((m["reading"]["paired_onset"], m["onset"]), "d_head")):
        assert interval(paired, x) in text
        if unpaired["reached"] and interval(unpaired, x) != interval(paired, x):  # the superseded rule: printed nowhere
            assert interval(unpaired, x) not in text


def current_figures() -> set[str]:
    """The critical curve's figures as the code prints them: both onsets, every fitted parameter with its
    interval, the one-variable gap at each d_qk."""
    m = read_json(REPO / "metrics" / "critical.json")
    fits = C.fits(REPO / "plots")
    out = {re.sub(r"\*\*(.*?)\*\* .*", r"\1", C.onset_text(r, x)) for r, x in ((m["d_qk"]["reading"], "d_qk"),
                                                                                (m["reading"], "d_head"))}
    for f in fits.values():
        p = f["params"]
        out |= {C._iv(p["high"]), C._iv(p["low"]), C._iv(p["mid"], C._pow2), C._iv(p["x90"], C._pow2)}
    out |= {f"{v['gap_loss_final']['mean']:.3f}" for _, v in C.points(m["d_qk"], "dqk")}
    return out


def test_no_figure_of_the_critical_curve_is_typed_outside_a_generated_block():
    """docs/CRITICAL.md said "between 0.68 and 0.90" long after d_qk 96 had moved to 0.918: the curve's figures are
    generated (scripts/update_readme.py), and none appears in docs/ or the README outside a generated block."""
    figures = current_figures()
    assert len(figures) > 15
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        typed = GENERATED.sub("", path.read_text(encoding="utf-8"))
        found = sorted(f for f in figures if re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", typed))
        assert not found, f"{path.relative_to(REPO)} types {found}: generate them (report.readme.DOCS) or remove them"


def test_docs_generated_blocks_match_the_working_trees_metrics():
    for path in readme.DOCS:
        text = (REPO / path).read_text(encoding="utf-8")
        assert readme.render_doc(REPO, path, text) == text, f"{path}: run python scripts/update_readme.py"
