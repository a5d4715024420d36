"""The expectations file: the safe expression language, the tolerance grammar, tables,
claim classes, conclusions evaluated per seed, published values placed in a seed band."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from attnrepro import claims as C
from attnrepro.expr import ExprError, MissingMetric, eval_expr, parse, references
from attnrepro.stats import distribution

REPO = Path(__file__).resolve().parents[1]
KNOWN = {"corpus", "train", "init_sweep", "heads", "failures", "precision", "kv_cache", "latency", "reversal",
         "charlm", "seeds", "critical", "qknorm", "sensitivity"}
M = {"a.x": 2.0, "a.y": 3.0, "b.z.w": 0.5, "n.nan": None, "g.v_1": 1.0, "g.v_2": 4.0}


@pytest.mark.parametrize("expr,want", [
    ("a.x + a.y * 2", 8.0),
    ("(a.x + a.y) * 2", 10.0),
    ("-a.x - -a.y", 1.0),
    ("a.y / a.x", 1.5),
    ("1e-3 * 1000", 1.0),
    ("abs(a.x - a.y) + max(1, 2, b.z.w) + min(a.x, 7)", 5.0),
    ("sqrt(16) + log(1)", 4.0),
    ("a.x < a.y", True),
    ("0 < b.z.w < 1 <= a.x", True),
    ("0 < b.z.w < 0.1", False),
    ("a.x == 2 and not a.y == 2", True),
    ("1 / 0 > 1e308", True),
    ("max(g.v_*) - min(g.v_*)", 3.0),
    ("sum(g.*, a.x) == 7 and count(g.*) == 2", True),
])
def test_expressions(expr, want):
    assert eval_expr(expr, M) == want


def test_nan_compares_false_and_globs_only_inside_functions():
    assert eval_expr("n.nan < 1", M) is False and eval_expr("n.nan >= 1", M) is False
    assert math.isnan(eval_expr("0 / 0", M))
    with pytest.raises(ExprError, match="glob"):
        eval_expr("g.v_* > 0", M)
    with pytest.raises(MissingMetric) as e:
        eval_expr("max(q.*) > 0", M)
    assert e.value.key == "q.*"


@pytest.mark.parametrize("bad", ["__import__('os').system('true')", "open(a.x)", "a.x ** 2", "a.x +", "(a.x",
                                 "lambda: 1", "x + 1", "a.x[0]", ""])
def test_unsafe_or_malformed_expressions_are_rejected(bad):
    with pytest.raises(ExprError):
        parse(bad)


@pytest.mark.parametrize("text,value,ref,ok", [
    ("exact", 2.0, 2.0, True), ("exact", 2.0000001, 2.0, False),
    ("±0.1", 2.09, 2.0, True), ("±0.1", 2.11, 2.0, False),
    ("±5%", 2.09, 2.0, True), ("±5%", 2.11, 2.0, False),
    ("×2", 3.9, 2.0, True), ("×2", 0.9, 2.0, False), ("×2", -2.0, 2.0, False),
    ("<= 4 eps64", 8e-16, 1.0, True), ("<= 4 eps64", 9e-16, 0.0, False),
    ("info", 1e9, 0.0, True), ("±0.1", float("nan"), 2.0, False),
])
def test_one_tolerance_grammar(text, value, ref, ok):
    assert C.Tol.parse(text).ok(value, ref) is ok


@pytest.mark.parametrize("bad", ["5%", "about 2", "×0.5", "<= 3 eps8", ""])
def test_bad_tolerances_are_one_line_errors(bad):
    with pytest.raises(C.ClaimError, match="not a tolerance"):
        C.Tol.parse(bad, "x.tol")


def write(tmp_path, experiments, **top) -> Path:
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"experiments": experiments, **top}, allow_unicode=True), encoding="utf-8")
    return p


TABLE = {"id": "t", "text": "a table", "metric": "train.{row}.{col}", "columns": ["loss", "ent"],
         "rows": {"v1": [4.0, None], "v2": [4.5, 0.5]}}


@pytest.mark.parametrize("body,msg", [
    ({"section": "s", "conclusions": [{"id": "c", "text": "t", "expr": "train.v1.loss + 1"}]}, "comparison"),
    ({"section": "s", "conclusions": [{"id": "c", "text": "t", "metric": "x.{col}", "published": {"a": 1}}]},
     "a conclusion is a comparison"),
    ({"section": "s", "values": [{"id": "Bad-Id", "text": "t", "expr": "a.x > 1"}]}, "lower_snake_case"),
    ({"section": "s", "values": [{"id": "v", "text": "t", "expr": "a.x > 1"}]}, "a value is a table cell"),
    ({"section": "s", "values": [{**TABLE, "rows": {"v1": [1.0]}}]}, "expected 2 numbers"),
    ({"section": "s", "values": [{**TABLE, "colour": "red"}]}, "unknown key"),
    ({"section": "s", "checksums": [{**TABLE}]}, "needs `tol:`"),
    ({"section": "s", "values": [{**TABLE, "tol": "5%"}]}, "not a tolerance"),
    ({"section": "s", "drift": [["train.*", "±1%"]]}, "[glob, tolerance, why]"),
    ({"conclusions": []}, "section"),
])
def test_file_validation_one_line_errors(tmp_path, body, msg):
    with pytest.raises(C.ClaimError) as e:
        C.load(write(tmp_path, {"train": body}))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_tables_expand_to_cells_with_classes(tmp_path):
    exp = C.load(write(tmp_path, {"train": {
        "section": "§2", "conclusions": [{"id": "c", "text": "t", "expr": "train.v2.loss > train.v1.loss"}],
        "checksums": [{"id": "k", "text": "t", "metric": "train.{col}", "published": {"n": 3}, "tol": "exact"}],
        "values": [TABLE], "drift": [["train.*", "±1%", "why"]]}}))
    got = {c.id: (c.cls, c.published, c.expr, c.gate) for c in exp.claims}
    assert got == {"train.c": ("conclusion", None, "train.v2.loss > train.v1.loss", True),
                   "train.k.n": ("checksum", 3.0, "train.n", True),
                   "train.t.v1.loss": ("value", 4.0, "train.v1.loss", False),
                   "train.t.v2.loss": ("value", 4.5, "train.v2.loss", False),
                   "train.t.v2.ent": ("value", 0.5, "train.v2.ent", False)}
    assert exp.drift_rule("train.v1.loss").tol.kind == "rel" and exp.drift_rule("other.x") is None


def seeds_dist(values: dict[int, dict]) -> dict:
    return {"train": distribution(values)}


def test_conclusions_hold_on_every_seed_and_the_mean_or_fail(tmp_path):
    exp = C.load(write(tmp_path, {"train": {"section": "§2", "conclusions": [
        {"id": "gap", "text": "t", "expr": "train.v2.loss > train.v1.loss"}]}}))
    run = {"train.v1.loss": 4.0, "train.v2.loss": 4.5}
    good = seeds_dist({1: {"v1": {"loss": 4.0}, "v2": {"loss": 4.6}}, 2: {"v1": {"loss": 4.1}, "v2": {"loss": 4.3}}})
    r = C.evaluate_all(exp, run, good, {})[0]
    assert r.passed and (r.seeds_held, r.seeds_n, r.mean_holds) == (2, 2, True)
    # one seed where the conclusion does not hold fails it, whatever the run and the mean say
    bad = seeds_dist({1: {"v1": {"loss": 4.0}, "v2": {"loss": 4.9}}, 2: {"v1": {"loss": 4.3}, "v2": {"loss": 4.2}}})
    r = C.evaluate_all(exp, run, bad, {})[0]
    assert r.status == "fail" and r.gated_failure and "holds on 1 of 2 seeds" in r.detail
    # and so does the run itself: it is recomputed from the raw metrics
    r = C.evaluate_all(exp, {"train.v1.loss": 4.5, "train.v2.loss": 4.0}, good, {})[0]
    assert r.status == "fail"


def test_published_values_are_placed_in_the_seed_band(tmp_path):
    exp = C.load(write(tmp_path, {"train": {"section": "§2", "values": [
        {"id": "t", "text": "t", "metric": "train.{row}.{col}", "columns": ["loss"],
         "rows": {"v1": [4.05], "v2": [5.0]}, "explain": {"v2.loss": {"by": ["train.v2.loss"], "note": "why"}}},
        {"id": "u", "text": "t", "metric": "train.{col}", "published": {"other": 1.0}}]}}))
    dist = seeds_dist({s: {"v1": {"loss": 4.0 + 0.02 * s}, "v2": {"loss": 4.5 + 0.01 * s}} for s in range(5)})
    run = {"train.v1.loss": 4.04, "train.v2.loss": 4.52, "train.other": 3.0}
    res = {r.claim.id: r for r in C.evaluate_all(exp, run, dist, {})}
    inside, outside, nodist = res["train.t.v1.loss"], res["train.t.v2.loss"], res["train.u.other"]
    assert inside.passed and inside.band is not None and abs(inside.z) < 1
    assert outside.status == "fail" and outside.z > 10 and not outside.gated_failure
    assert outside.explanation == "why"
    assert nodist.status == "fail" and nodist.band is None and nodist.explanation == "unexplained"
    out = C.claims_json(list(res.values()))
    assert out["train.t.v2.loss"]["class"] == "value" and out["train.t.v2.loss"]["pass"] == 0
    assert out["train.t.v1.loss"]["band_lo"] < 4.05 < out["train.t.v1.loss"]["band_hi"]


def test_an_explanation_by_a_choice_lapses_when_the_choice_stops_accounting_for_it(tmp_path):
    from attnrepro.experiments.sensitivity import protocol_band

    exp = C.load(write(tmp_path, {"train": {"section": "§2", "values": [
        {"id": "t", "text": "t", "metric": "train.{row}.{col}", "columns": ["loss"], "rows": {"v": [5.0]},
         "explain": {"v.loss": {"moved_by": ["sens.v.loss.block"], "note": "blocks move it"}}}]}}))
    dist = seeds_dist({s: {"v": {"loss": 4.0 + 0.01 * s}} for s in range(5)})
    base = protocol_band([4.0, 4.02, 3.98, 4.01, 3.99], log=False)

    def explanation(choice, p_holm=0.001):
        row = {**protocol_band(choice, log=False), "p_holm": p_holm}
        flat = {**{f"sens.v.loss.baseline.{k}": v for k, v in base.items()},
                **{f"sens.v.loss.block.{k}": v for k, v in row.items()}}
        return C.evaluate_all(exp, {"train.v.loss": 4.02, **flat}, dist, {})[0].explanation

    lapsed = "unexplained (the cited sens.v.loss.block no longer accounts for it"
    assert explanation([4.5, 4.52, 4.48, 4.51, 4.49]) == "blocks move it"  # toward, short of it
    assert explanation([5.0, 5.02, 4.98, 5.01, 4.99]) == "blocks move it"  # onto it
    assert explanation([5.8, 5.82, 5.78, 5.81, 5.79]).startswith(lapsed)  # past the published figure's band
    assert explanation([4.5, 4.52, 4.48, 4.51, 4.49], p_holm=0.2).startswith(lapsed)  # not significant after Holm
    assert explanation([3.5, 3.52, 3.48, 3.51, 3.49]).startswith(lapsed)  # away from it
    missing = C.evaluate_all(exp, {"train.v.loss": 4.02}, dist, {})[0].explanation
    assert missing.startswith("unexplained (the cited sens.v.loss.block.n, sens.v.loss.block.center")


@pytest.mark.parametrize("explain", [{"because": "x"}, {"moved_by": "sens.v.loss.block"}, {"by": [1.0]}])
def test_a_bad_explanation_is_a_load_error(tmp_path, explain):
    path = write(tmp_path, {"train": {"section": "§2", "values": [
        {"id": "t", "text": "t", "metric": "train.{col}", "published": {"loss": 5.0}, "explain": {"loss": explain}}]}})
    with pytest.raises(C.ClaimError, match=re.escape("explain.loss: expected {by: [metric keys], moved_by")):
        C.load(path)


def test_gpu_claims_are_skipped_on_a_cpu_run(tmp_path):
    exp = C.load(write(tmp_path, {"latency": {"section": "§7", "conclusions": [
        {"id": "fast", "text": "t", "expr": "latency.gpu_ms < 1", "requires": "cuda"}]}}))
    r = C.evaluate_all(exp, {}, {}, {"latency": {"cuda_available": 0, "device": "cpu"}})[0]
    assert r.status == "skipped" and not r.gated_failure
    r = C.evaluate_all(exp, {}, {}, {"latency": {"cuda_available": 1, "device": "cuda"}})[0]
    assert r.status == "missing" and r.gated_failure


# ---------------------------------------------------------------- the project's claims file

def test_project_claims_file_is_valid():
    exp = C.load(REPO / "claims.yaml")
    assert set(exp.sections) <= KNOWN
    by = {cls: [c for c in exp.claims if c.cls == cls] for cls in C.CLASSES}
    assert len(by["conclusion"]) >= 20 and len(by["checksum"]) >= 30 and len(by["value"]) >= 100
    for c in exp.claims:
        assert c.experiment in KNOWN
        files = {k.split(".")[0] for k in references(parse(c.expr))}
        assert files and files <= KNOWN, (c.id, files)
    ids = {c.id for c in exp.claims}
    assert {"train.gap_grows_with_dhead", "train.d256_unscaled_collapse_early"} <= ids
    for key in exp.headline:
        assert key.split(".")[0] in KNOWN


def test_expectation_files_stay_small():
    """One expectations file, less than half the lines of the former claims.yaml + check.yaml (2,613)."""
    assert not (REPO / "check.yaml").exists()
    assert len((REPO / "claims.yaml").read_text(encoding="utf-8").splitlines()) < 2613 / 2


def test_published_numbers_live_only_in_the_claims_file():
    """A few distinctive published figures must not appear in the harness code."""
    mine = [REPO / "src/attnrepro" / f for f in ("claims.py", "check.py", "report.py", "cli.py", "stats.py", "expr.py")]
    mine += [REPO / "stages/report.py", REPO / "stages/seeds.py", REPO / "scripts/update_readme.py"]
    figures = ["4977", "425984", "425,984", "1376256", "982.9", "5458.8", "0.9964", "2621440", "4.666", "5.6"]
    for f in mine:
        text = f.read_text(encoding="utf-8")
        for fig in figures:
            assert not re.search(rf"(?<![\d.]){re.escape(fig)}(?![\d])", text), f"{fig} in {f.name}"
