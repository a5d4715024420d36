"""The report's first screen: the chapter's single-run figures against our prediction interval of one run,
the ratio against Fieller's interval, the generated texts' band labels, and the first 30 lines of REPORT.md."""

import math
import re
from pathlib import Path

import pytest
from scipy.stats import t as student_t

from attnrepro.judge.claims import load
from attnrepro.report import first_screen as F
from attnrepro.stats import fieller_ratio, percentile_of

REPO = Path(__file__).resolve().parents[1]
PAIRS = {32: {True: "d32_scaled", False: "d32_unscaled"}, 256: {True: "d256_scaled", False: "d256_unscaled"}}
STEPS = (0, 222, 1480)


def run(seed: int) -> dict:
    """One seed's summaries of the four variants, all the cells' inputs, varying with the seed."""
    wobble = (seed % 5 - 2) / 10
    out = {}
    for d, pair in PAIRS.items():
        for scaled, v in pair.items():
            big_unscaled = d == 256 and not scaled
            out[v] = {"loss_final": 4.0 + 0.1 * wobble + (1.0 + 0.2 * wobble if big_unscaled else 0.0)
                      + (0.15 if not scaled else 0.0),
                      "entropy_step222": 0.002 * (1 + wobble) if big_unscaled else 0.6,
                      "jacobian_fro_step0": 0.3, "jacobian_fro_step1480": 0.001 * (1 + wobble),
                      "trained_logit_std_l0": 3000 * (1 + wobble), "trained_w_qkv_fro_l0": 26 + wobble}
    return out


def dists(n: int = 10) -> dict:
    return {"train": {"runs": {str(s): run(s) for s in range(n)}}}


def test_each_single_run_figure_meets_the_prediction_interval_of_one_run():
    exp = load(REPO / "claims.yaml")
    rows = {r.cell: r for r in F.rows(dists(), PAIRS, STEPS, exp.claims)}
    gap = rows["gap_d256"]
    gaps = [run(s)["d256_unscaled"]["loss_final"] - run(s)["d256_scaled"]["loss_final"] for s in range(10)]
    m = sum(gaps) / 10
    sd = math.sqrt(sum((g - m) ** 2 for g in gaps) / 9)
    half = student_t.ppf(0.975, 9) * sd * math.sqrt(1 + 1 / 10)  # one run's, not the mean's (sd / sqrt(n))
    assert (gap.lo, gap.hi) == pytest.approx((m - half, m + half))
    assert gap.band == F.PI and gap.chapter == 0.95 and gap.percentile == percentile_of(gaps, 0.95)
    # the fall is the chapter's two figures' (0.2975 -> 0.00008), against our per-seed falls
    assert rows["jacobian_fall_orders"].chapter == pytest.approx(math.log10(0.2975 / 8e-05))
    assert not rows["jacobian_fall_orders"].inside and rows["jacobian_fall_orders"].reason == "no measured cause"
    # a log cell's band is on the log scale: its ends are a factor apart, and the mean is geometric
    e = rows["d256_unscaled.entropy_step222"]
    assert e.lo > 0 and e.mean == pytest.approx(math.exp(sum(math.log(0.002 * (1 + (s % 5 - 2) / 10))
                                                              for s in range(10)) / 10))


def test_the_ratio_of_means_gets_fiellers_interval_and_follows_the_gaps():
    exp = load(REPO / "claims.yaml")
    rows = F.rows(dists(), PAIRS, STEPS, exp.claims)
    cells = [r.cell for r in rows]
    assert cells.index("gap_ratio") == cells.index("gap_d256") + 1
    ratio = rows[cells.index("gap_ratio")]
    num = [run(s)["d256_unscaled"]["loss_final"] - run(s)["d256_scaled"]["loss_final"] for s in range(10)]
    den = [run(s)["d32_unscaled"]["loss_final"] - run(s)["d32_scaled"]["loss_final"] for s in range(10)]
    assert (ratio.lo, ratio.hi) == pytest.approx(fieller_ratio(num, den))
    assert ratio.band == F.FIELLER and ratio.percentile is None and ratio.printed == "5.6"


def test_a_miss_names_the_arms_whose_prediction_interval_holds_the_figure():
    exp = load(REPO / "claims.yaml")
    steep = [dict(run(s), d256_unscaled=dict(run(s)["d256_unscaled"], jacobian_fro_step1480=8e-5 * (1 + (s % 3) / 10)))
             for s in range(10)]
    from attnrepro.experiments import choices
    arm_cells = [choices.cells(r, PAIRS, STEPS) for r in steep]
    rows = {r.cell: r for r in F.rows(dists(), PAIRS, STEPS, exp.claims, arms={"steep": {"arm": arm_cells},
                                                                              "flat": {"arm": []}})}
    assert rows["jacobian_fall_orders"].reason == "held by the PI of the arm steep"


def test_too_few_seeds_or_no_pairs_give_no_table():
    exp = load(REPO / "claims.yaml")
    assert F.rows(dists(1), PAIRS, STEPS, exp.claims) == []
    assert F.rows(dists(), {}, STEPS, exp.claims) == [] and F.markdown([], 10) == []


MEAN_BAND = re.compile(r"95% CI|interval of the mean|confidence interval|ci95|our intervals?\b|95% interval over", re.I)
PLACES = re.compile(r"\b(inside|outside|within|holds? the|against|percentile)\b|\(the chapter's figure", re.I)
ONE_RUN_BAND = re.compile(r"prediction interval|\bPI\b|Fieller", re.I)


@pytest.mark.parametrize("path", ["README.md", "report/REPORT.md", "report/APPENDIX.md"])
def test_no_sentence_places_a_chapter_figure_against_an_interval_of_a_mean(path):
    """A sentence (or table row) that places something of the chapter's against an interval of a mean must name
    the band of one run (or Fieller's) too: the chapter's figures are single runs. It fails on the texts before
    issue 63 ('... [0.783, 0.922] (0.95, outside our interval)')."""
    before = "at `d_head = 256` by **0.8525** [0.783, 0.922] (0.95, outside our interval). Their ratio"
    assert MEAN_BAND.search("as mean [95% confidence interval] (the chapter's figure): " + before)
    assert PLACES.search(before) and not ONE_RUN_BAND.search(before)
    bad = [s for line in (REPO / path).read_text(encoding="utf-8").splitlines()
           for s in re.split(r"(?<=[.;])\s+", line)
           if "chapter" in s.lower() and MEAN_BAND.search(s) and PLACES.search(s) and not ONE_RUN_BAND.search(s)]
    assert not bad, bad[:3]


def test_the_report_opens_with_the_verdict_line_and_the_table():
    head = (REPO / "report" / "REPORT.md").read_text(encoding="utf-8").splitlines()[:30]
    assert any(line.startswith("**The chapter ") and "primary endpoints" in line for line in head)
    table = [line for line in head if line.startswith("| ")]
    assert table[0].split("|")[1].strip() == "figure" and len(table) >= 12
    assert any("ratio of the mean gaps" in line and "(Fieller)" in line for line in table)
