"""claims.yaml: rows matched one-to-one within groups (`match:`), and published figures that stand
for every number rounding to them as printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from attnrepro.judge import claims as C
from attnrepro.report import claims_tables

REPO = Path(__file__).resolve().parents[1]


def portraits() -> tuple[dict, dict[str, list]]:
    """The project's heads.portraits table entry and its published rows."""
    data = yaml.safe_load((REPO / "claims.yaml").read_text(encoding="utf-8"))
    (entry,) = [e for e in data["experiments"]["heads"]["values"] if e["id"] == "portraits"]
    return entry, entry["rows"]


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "claims.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def write_table(tmp_path, entry: dict) -> Path:
    return write(tmp_path, yaml.safe_dump({"experiments": {"heads": {"section": "§3", "values": [entry]}}}))


def heads_metrics(rows: dict[str, list], columns: list[str], ours_of) -> dict[str, float]:
    """Our metrics: published row r's numbers stored under our row ours_of(r)."""
    return {f"heads.{ours_of(r)}.{c}": v for r, vals in rows.items() for c, v in zip(columns, vals)}


def cyclic(row: str) -> str:
    """l<L>h<H> -> l<L>h<H+1 mod 4>: a permutation within each layer without a fixed point."""
    layer, head = re.fullmatch(r"l(\d+)h(\d+)", row).groups()
    return f"l{layer}h{(int(head) + 1) % 4}"


def evaluate(path: Path, metrics: dict) -> dict[str, C.ClaimResult]:
    return {r.claim.id: r for r in C.evaluate_all(C.load(path), metrics, {}, {})}


# ---------------------------------------------------------------- matching

def test_the_project_table_is_matched_within_layers():
    cells = [c for c in C.load(REPO / "claims.yaml").claims if c.id.startswith("heads.portraits.")]
    assert cells and all(c.match is not None for c in cells)
    assert cells[0].match.groups == [["l0h0", "l0h1", "l0h2", "l0h3"], ["l1h0", "l1h1", "l1h2", "l1h3"]]


def test_permuted_heads_match_themselves(tmp_path):
    entry, rows = portraits()
    res = evaluate(write_table(tmp_path, entry), heads_metrics(rows, entry["columns"], cyclic))
    assert len(res) == 32
    for cid, r in res.items():
        row = cid.split(".")[2]
        assert r.passed and r.matched == cyclic(row), (cid, r.status, r.matched)
        assert r.detail.endswith(f"matched with our {cyclic(row)}")
    assert C.claims_json(list(res.values()))["heads.portraits.l0h0.entropy"]["matched"] == "l0h1"


def test_rows_are_matched_within_their_group_only(tmp_path):
    """Our layer 1 holds layer 0's published heads and the reverse: still no head changes layer."""
    entry, rows = portraits()
    swap = {"0": "1", "1": "0"}
    res = evaluate(write_table(tmp_path, entry),
                   heads_metrics(rows, entry["columns"], lambda r: "l" + swap[r[1]] + r[2:]))
    for cid, r in res.items():
        assert r.matched[:2] == cid.split(".")[2][:2], (cid, r.matched)
    assert not all(r.passed for r in res.values())


def test_the_cost_weighs_columns_by_their_published_spread(tmp_path):
    """Column a spreads 100 times wider than b: in raw units a would decide, per spread b does."""
    entry = {"id": "t", "text": "t", "metric": "heads.{row}.{col}", "columns": ["a", "b"], "match": "l(\\d+)h\\d+",
             "tol": "info", "rows": {"l0h0": [0.0, 0.0], "l0h1": [100.0, 1.0]}}
    (cell, *_) = C.load(write_table(tmp_path, entry)).claims
    assert cell.match.scale == pytest.approx([70.7107, 0.707107], rel=1e-5)  # sample sd of (0, 100) and (0, 1)
    # our h0 is 10 off in a (0.14 sd) and 1 off in b (1.4 sd): the cheaper pairing is the swap
    res = evaluate(write_table(tmp_path, entry), {"heads.l0h0.a": 10.0, "heads.l0h0.b": 1.0,
                                                  "heads.l0h1.a": 90.0, "heads.l0h1.b": 0.0})
    assert res["heads.t.l0h0.a"].matched == "l0h1" and res["heads.t.l0h1.a"].matched == "l0h0"


def test_a_missing_statistic_gives_missing_cells(tmp_path):
    entry, rows = portraits()
    metrics = heads_metrics(rows, entry["columns"], cyclic)
    del metrics["heads.l1h2.prev"]
    res = evaluate(write_table(tmp_path, entry), metrics)
    layer1 = [r for cid, r in res.items() if cid.split(".")[2].startswith("l1")]
    assert layer1 and all(r.status == "missing" and "heads.l1h2.prev" in r.detail for r in layer1)
    assert all(r.passed for cid, r in res.items() if cid.split(".")[2].startswith("l0"))


@pytest.mark.parametrize("match,rows,msg", [
    ("l(\\d+h\\d+", None, "is not a regular expression"),
    ("l\\d+h\\d+", None, "a regular expression with a group"),
    (["l(\\d+)"], None, "a regular expression with a group"),
    ("l(\\d+)h\\d+", {"l0h0": [1.0], "l0h1": [2.0], "l1h0": [3.0]}, "groups of unequal size (0: 2 rows, 1: 1 rows)"),
    ("l(\\d+)h\\d+", {"l0h0": [1.0], "head5": [2.0]}, "row head5 does not match"),
])
def test_a_bad_match_is_a_one_line_error(tmp_path, match, rows, msg):
    entry = {"id": "t", "text": "t", "metric": "heads.{row}.{col}", "columns": ["a"], "match": match,
             "rows": rows or {"l0h0": [1.0], "l1h0": [2.0]}}
    with pytest.raises(C.ClaimError) as e:
        C.load(write_table(tmp_path, entry))
    assert msg in str(e.value) and "values[0] (t).match" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- printed precision

def one_cell(tmp_path, published: str, tol: str = "±0.00001", cls: str = "values") -> C.Claim:
    (claim,) = C.load(write(tmp_path, f"""experiments:
  train:
    section: "§2"
    {cls}:
      - {{id: t, text: t, metric: "train.{{col}}", published: {{v: {published}}}, tol: "{tol}"}}
""")).claims
    return claim


def judge(claim: C.Claim, ours: float, dists=None) -> str:
    return C.evaluate_claim(claim, {"train.v": ours}, dists or {}, {}).status


@pytest.mark.parametrize("text,half", [("0.1768", 0.00005), ("1.20", 0.005), ("1.2", 0.05), ("42", 0.5),
                                       ("3.4e38", 0.5e37), ("1.5e-3", 0.00005), (".inf", 0.0)])
def test_half_a_unit_of_the_last_printed_digit(tmp_path, text, half):
    assert one_cell(tmp_path, text, tol="info").published_half == pytest.approx(half, rel=1e-12)


def test_ours_passes_when_it_rounds_to_the_published_figure(tmp_path):
    claim = one_cell(tmp_path, "0.1768")  # 1/sqrt(32) = 0.1767767 printed to 4 digits
    assert judge(claim, 0.176777) == "pass"  # 0.000023 from 0.1768, outside ±0.00001, but it rounds to it
    assert judge(claim, 0.1770) == "fail"
    exact = one_cell(tmp_path, "1.20", tol="exact")
    assert judge(exact, 1.2049) == "pass" and judge(exact, 1.2051) == "fail" and judge(exact, 1.1951) == "pass"


def test_the_closest_printed_point_must_pass_the_tolerance(tmp_path):
    claim = one_cell(tmp_path, "1.20", tol="±0.01")  # stands for [1.195, 1.205]
    assert judge(claim, 1.2149) == "pass" and judge(claim, 1.1851) == "pass"
    assert judge(claim, 1.2151) == "fail" and judge(claim, 1.1849) == "fail"


def test_a_band_that_meets_the_rounding_interval_passes(tmp_path):
    dists = {"train": {"stats": {"v": {"n": 5, "mean": 4.0, "sd": 0.01141}}}}
    lo, hi = C.band(dists, "train.v").prediction_interval()
    assert 4.0345 <= hi < 4.035  # ends just below 4.035, inside its rounding interval [4.0345, 4.0355]
    assert judge(one_cell(tmp_path, "4.035"), 4.0, dists) == "pass"
    assert judge(one_cell(tmp_path, "4.036"), 4.0, dists) == "fail"
    assert judge(one_cell(tmp_path, "3.965"), 4.0, dists) == "pass"  # and below


def test_checksums_are_not_widened(tmp_path):
    checksum = one_cell(tmp_path, "42", tol="exact", cls="checksums")
    assert judge(checksum, 42.0) == "pass" and judge(checksum, 42.4) == "fail"
    assert judge(one_cell(tmp_path, "42", tol="exact"), 42.4) == "pass"  # the same figure as a value


def test_a_run_that_rounds_to_the_figure_passes_outside_its_own_seed_band(tmp_path):
    # a seed can lie outside its own 95% band; the rule: ours rounds to it, or its interval meets our band
    dists = {"train": {"stats": {"v": {"n": 10, "mean": 4.0, "sd": 0.01}}}}
    assert C.band(dists, "train.v").prediction_interval()[1] < 4.05
    assert judge(one_cell(tmp_path, "4.10"), 4.1, dists) == "pass"
    assert judge(one_cell(tmp_path, "4.10"), 4.2, dists) == "fail"


# ---------------------------------------------------------------- which mode the chapter's run was in

def _modes_dists(groups=((3, 0.3, 4.6), (7, 0.7, 4.0))):
    """Variant v's seeds in two modes found on entropy_step222: (n, entropy mean, loss mean) per mode."""
    import math

    ent = {"n": 10, "log_mean": -0.5, "log_sd": 0.4, "mean": 0.6, "sd": 0.2, "mode_sd": 0.05,
           "modes": [{"n": n, "mean": e, "log_mean": math.log(e)} for n, e, _ in groups]}
    loss = {"n": 10, "mean": 4.2, "sd": 0.3, "mode_sd": 0.02, "modes": [{"n": n, "mean": x} for n, _, x in groups]}
    return {"train": {"stats": {"v.entropy_step222": ent, "v.loss_final": loss},
                      "modes": {"v": {"statistic": "entropy_step222"}}}}


def _two_cells(tmp_path, entropy: str = "") -> Path:
    published = "{loss_final: 4.1" + (f", entropy_step222: {entropy}" if entropy else "") + "}"
    return write(tmp_path, 'experiments:\n  train:\n    section: "§2"\n    values:\n'
                 f'      - {{id: t, text: t, metric: "train.v.{{col}}", published: {published}, tol: info}}\n')


def _by_metric(path: Path, metrics: dict) -> dict[str, C.ClaimResult]:
    return {r.claim.metric: r for r in C.evaluate_all(C.load(path), metrics, _modes_dists(), {})}


def test_the_chapters_mode_is_read_off_its_published_diagnostic_not_the_figure_judged(tmp_path):
    metrics = {"train.v.loss_final": 4.1, "train.v.entropy_step222": 0.35}
    # the published loss 4.1 lies nearest our mode 1 (4.0), but the chapter's entropy 0.35 is mode 0's (0.3)
    res = _by_metric(_two_cells(tmp_path, "0.35"), metrics)
    assert res["train.v.loss_final"].mode == 0 and res["train.v.entropy_step222"].mode == 0
    assert res["train.v.loss_final"].mode_by == "train.v.entropy_step222"
    # its z is from the chapter's mode (0, loss 4.6), not from the mode nearest the published 4.1 (1, loss 4.0)
    b = res["train.v.loss_final"].band
    assert res["train.v.loss_final"].z == pytest.approx(b.z_score(4.1, mode=0)) == pytest.approx((4.1 - 4.6) / 0.02)
    assert b.z_score(4.1) == pytest.approx((4.1 - 4.0) / 0.02)
    assert _by_metric(_two_cells(tmp_path, "0.65"), metrics)["train.v.loss_final"].mode == 1
    # without the chapter's figure of the statistic its mode is not known: none, never the figure's own nearest
    res = _by_metric(_two_cells(tmp_path), metrics)
    assert res["train.v.loss_final"].mode is None and res["train.v.loss_final"].percentile is not None


def test_a_coarsely_printed_figure_has_a_percentile_range(tmp_path):
    dists = {"train": {"stats": {"v": {"n": 10, "mean": 0.0001, "sd": 0.00003}},
                       "runs": {str(s): {"v": 0.00006 + 0.00001 * s} for s in range(10)}}}
    r = C.evaluate_claim(one_cell(tmp_path, "0.0001", tol="info"), {"train.v": 0.0001}, dists, {})
    assert r.percentile_range == (pytest.approx(0.0), pytest.approx(95.0, abs=5))  # it stands for 0.00005-0.00015
    assert "(0–9" in claims_tables._percentile(r) and "over its rounding interval" in claims_tables._percentile(r)
    fine = C.evaluate_claim(one_cell(tmp_path, "0.000105", tol="info"), {"train.v": 0.0001}, dists, {})  # no seed inside
    assert "over its rounding interval" not in claims_tables._percentile(fine)


@pytest.mark.parametrize("text,shown", [("4.00", "4.00"), ("1.0000", "1.0000"), ("0.00008", "0.00008"),
                                        ("4348", "4348"), ("0.1768", "0.1768")])
def test_the_report_shows_a_published_figure_as_printed(tmp_path, text, shown):
    assert C.printed(one_cell(tmp_path, text, tol="info")) == shown


def test_a_band_with_modes_shows_each_modes_interval_not_their_hull(tmp_path):
    dists = _modes_dists()
    r = C.evaluate_claim(one_cell(tmp_path, "4.3", tol="info"), {"train.v": 4.0},
                         {"train": {"stats": {"v": dists["train"]["stats"]["v.loss_final"]}}}, {})
    shown = claims_tables._band(r)
    assert " or " in shown and r.status == "fail"  # 4.3 lies between the modes (4.0 and 4.6): outside both


def test_least_cost_pairs_skips_unpublished_numbers_and_shuns_non_numbers():
    from attnrepro.measure.head_matching import least_cost_pairs
    # a None in the reference is not compared (no arithmetic on it): the pairing is column 0's alone, 0-1 and 1-0,
    # though column 1 of the other vectors differs
    assert least_cost_pairs([[1.0, None], [0.0, None]], [[0.0, 5.0], [1.0, -5.0]], [1.0, 1.0]) == [(0, 1), (1, 0)]
    # a statistic that is not a number resembles nothing: the finite other vector wins despite a larger distance
    nan = float("nan")
    assert least_cost_pairs([[0.0]], [[nan], [3.0]], [1.0]) == [(0, 1)]
    # each column counts in units of its scale
    assert least_cost_pairs([[0.0, 0.0]], [[1.0, 0.0], [0.0, 5.0]], [1.0, 100.0]) == [(0, 1)]


def test_a_head_whose_statistic_is_not_a_number_leaves_the_others_matched():
    from attnrepro.measure.head_matching import matched_to

    def row(head, e, p):
        return {"layer": 0, "head": head, "entropy": e, "prev": p}
    reference = [row(0, 0.1, 0.9), row(1, 0.5, 0.2), row(2, float("nan"), 0.5)]
    other = [row(0, 0.5, 0.2), row(1, 0.1, 0.9), row(2, 0.3, 0.5)]
    named = {r["head"]: (r["entropy"], r["prev"]) for r in matched_to(reference, other, ("entropy", "prev"))}
    assert named[0] == (0.1, 0.9) and named[1] == (0.5, 0.2) and named[2] == (0.3, 0.5)
