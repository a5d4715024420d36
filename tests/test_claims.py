"""The expectations: claims.yaml (tables, the tolerance grammar) and the predicates of
conclusions.py (the metrics view they read), claim classes, conclusions evaluated per seed,
published values placed in a seed band."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from attnrepro.judge import claims as C
from attnrepro.stats import distribution
from test_check import predicates

REPO = Path(__file__).resolve().parents[1]
KNOWN = set(yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"])  # an experiment is a stage
M = {"a.x": 2.0, "a.y": 3.0, "b.z.w": 0.5, "n.nan": None, "g.v_2": 4.0, "g.v_1": 1.0}


def test_the_view_reads_floats_and_records_every_key():
    m = C.View(M)
    assert m["a.x"] == 2.0 and isinstance(m["a.x"], float) and math.isnan(m["n.nan"])
    assert m.all("g.v_*") == [1.0, 4.0]  # sorted by key
    assert list(m.read) == ["a.x", "n.nan", "g.v_1", "g.v_2"] and m.files() == {"a", "n", "g"}


def test_the_view_raises_missing_metric_for_a_key_or_a_glob_that_finds_nothing():
    m = C.View(M)
    with pytest.raises(C.MissingMetric) as e:
        m["a.nope"]
    assert e.value.key == "a.nope"
    with pytest.raises(C.MissingMetric) as e:
        m.all("q.*")
    assert e.value.key == "q.*" and list(m.read) == ["a.nope", "q.*"]  # recorded too: a requires-cuda skip needs it


def test_predicates_load_with_their_code_and_sides(tmp_path):
    exp = C.load(write(tmp_path, {"a": {"section": "s"}}, predicates(
        ("a", "conclusion", "one", "a one-line comparison", 'm["a.x"] < m["a.y"]'),
        ("a", "checksum", "two", "two statements", 'x = m["a.x"]  # a comment\n    return x == 2 and max(m.all("g.*")) > 1'))))
    one, two = exp.claims
    assert (one.id, one.cls, one.source, two.source) == ("a.one", "conclusion", 'm["a.x"] < m["a.y"]',
                                                         'x = m["a.x"]; return x == 2 and max(m.all("g.*")) > 1')
    assert one.sides(C.View(M)) == (2.0, 3.0) and two.sides is None
    r1, r2 = C.evaluate_all(exp, M, {}, {})
    assert (r1.status, r1.value, r1.bound, r1.read) == ("pass", 2.0, 3.0, ("a.x", "a.y"))
    assert r2.passed and r2.read == ("a.x", "g.v_1", "g.v_2")


@pytest.mark.parametrize("body,msg", [
    ('1 / (m["a.x"] - 2) > 0', "ZeroDivisionError"), ('math.log(-m["a.x"]) > 0', "ValueError")])
def test_a_predicate_that_raises_an_arithmetic_error_does_not_hold(tmp_path, body, msg):
    exp = C.load(write(tmp_path, {"a": {"section": "s"}}, predicates(("a", "conclusion", "c", "t", body))))
    r = C.evaluate_all(exp, M, {}, {})[0]
    assert r.status == "fail" and msg in r.detail


@pytest.mark.parametrize("source,msg", [
    ("def broken(:\n", "does not load (SyntaxError"),
    ("import os\n", "expected a list CLAIMS"),
])
def test_a_bad_conclusions_file_is_one_line(tmp_path, source, msg):
    path = write(tmp_path, {"a": {"section": "s"}}, source)
    with pytest.raises(C.ClaimError, match=re.escape(msg)) as e:
        C.load(path)
    assert "conclusions.py" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("claim,msg", [
    (("b", "conclusion", "c", "t", "True"), "experiment 'b' has no section in claims.yaml"),
    (("a", "value", "c", "t", "True"), "expected conclusion or checksum"),
    (("a", "conclusion", "Bad-Id", "t", "True"), "lower_snake_case"),
    (("a", "conclusion", "c", "", "True"), "a non-empty string is required"),
])
def test_bad_predicates_are_one_line_errors(tmp_path, claim, msg):
    with pytest.raises(C.ClaimError, match=re.escape(msg)):
        C.load(write(tmp_path, {"a": {"section": "s"}}, predicates(claim)))


def test_own_marks_a_conclusion_as_this_projects_finding(tmp_path):
    """@claim(..., own=True): judged as a conclusion, counted as a finding; on anything but a conclusion, one line."""
    src = predicates(("a", "conclusion", "c", "t", "True"))
    src += '\n\n@claim("a", "conclusion", "f", "t", own=True)\ndef f(m):\n    return True\n'
    exp = C.load(write(tmp_path, {"a": {"section": "s"}}, src))
    assert [(c.id, C.kind(c)) for c in exp.claims] == [("a.c", "conclusion"), ("a.f", "finding")]
    bad = predicates(("a", "checksum", "k", "t", "True")).replace("requires=None)", "requires=None, own=True)")
    with pytest.raises(C.ClaimError, match=r"own=True, expected True \(a conclusion only\) or False"):
        C.load(write(tmp_path, {"a": {"section": "s"}}, bad))


@pytest.mark.parametrize("text,value,ref,ok", [
    ("exact", 2.0, 2.0, True), ("exact", 2.0000001, 2.0, False),
    ("±0.1", 2.09, 2.0, True), ("±0.1", 2.11, 2.0, False),
    ("±5%", 2.09, 2.0, True), ("±5%", 2.11, 2.0, False),
    ("×2", 3.9, 2.0, True), ("×2", 0.9, 2.0, False), ("×2", -2.0, 2.0, False),
    ("<= 4 eps64", 8e-16, 1.0, True), ("<= 4 eps64", 9e-16, 0.0, False),
    ("info", 1e9, 0.0, True), ("±0.1", float("nan"), 2.0, False),
    ("exact", float("nan"), float("nan"), True), ("exact", float("nan"), 2.0, False),  # nan on both: not moved
])
def test_one_tolerance_grammar(text, value, ref, ok):
    assert C.Tol.parse(text).ok(value, ref) is ok


@pytest.mark.parametrize("bad", ["5%", "about 2", "×0.5", "<= 3 eps8", ""])
def test_bad_tolerances_are_one_line_errors(bad):
    with pytest.raises(C.ClaimError, match="not a tolerance"):
        C.Tol.parse(bad, "x.tol")


def write(tmp_path, experiments, conclusions: str = "", **top) -> Path:
    """claims.yaml, and the predicates' source beside it (src/attnrepro/judge/conclusions.py) if given."""
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"experiments": experiments, **top}, allow_unicode=True), encoding="utf-8")
    if conclusions:
        (tmp_path / C.CONCLUSIONS).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / C.CONCLUSIONS).write_text(conclusions, encoding="utf-8")
    return p


TABLE = {"id": "t", "text": "a table", "metric": "train.{row}.{col}", "columns": ["loss", "ent"],
         "rows": {"v1": [4.0, None], "v2": [4.5, 0.5]}}


@pytest.mark.parametrize("body,msg", [
    ({"section": "s", "conclusions": [{"id": "c", "text": "t", "metric": "x.{col}", "published": {"a": 1}}]},
     "conclusions are predicates in src/attnrepro/judge/conclusions.py"),
    ({"section": "s", "values": [{"id": "Bad-Id", "text": "t", "metric": "a.{col}", "published": {"x": 1}}]},
     "lower_snake_case"),
    ({"section": "s", "checksums": [{"id": "v", "text": "t", "expr": "a.x > 1"}]},
     "a claim that is not a table is a Python predicate in src/attnrepro/judge/conclusions.py"),
    ({"section": "s", "values": [{**TABLE, "metric": "max(train.{row}.{col})"}]}, "is not a metric key"),
    ({"section": "s", "values": [{**TABLE, "fieller": ["a.x - 1", "a.y"]}]}, "is not a metric key"),
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
        "section": "§2",
        "checksums": [{"id": "k", "text": "t", "metric": "train.{col}", "published": {"n": 3}, "tol": "exact"}],
        "values": [TABLE], "drift": [["train.*", "±1%", "why"]]}},
        predicates(("train", "conclusion", "c", "t", 'm["train.v2.loss"] > m["train.v1.loss"]'))))
    got = {c.id: (c.cls, c.published, c.metric or c.source, c.gate) for c in exp.claims}
    assert list(got)[0] == "train.c"  # conclusions first
    assert got == {"train.c": ("conclusion", None, 'm["train.v2.loss"] > m["train.v1.loss"]', True),
                   "train.k.n": ("checksum", 3.0, "train.n", True),
                   "train.t.v1.loss": ("value", 4.0, "train.v1.loss", False),
                   "train.t.v2.loss": ("value", 4.5, "train.v2.loss", False),
                   "train.t.v2.ent": ("value", 0.5, "train.v2.ent", False)}
    assert exp.drift_rule("train.v1.loss").tol.kind == "rel" and exp.drift_rule("other.x") is None


def seeds_dist(values: dict[int, dict]) -> dict:
    return {"train": distribution(values)}


def test_conclusions_hold_on_more_than_half_of_the_seeds_or_fail(tmp_path):
    exp = C.load(write(tmp_path, {"train": {"section": "§2"}},
                       predicates(("train", "conclusion", "gap", "t", 'm["train.v2.loss"] > m["train.v1.loss"]'))))
    run = {"train.v1.loss": 4.0, "train.v2.loss": 4.5}
    good = seeds_dist({1: {"v1": {"loss": 4.0}, "v2": {"loss": 4.6}}, 2: {"v1": {"loss": 4.1}, "v2": {"loss": 4.3}}})
    r = C.evaluate_all(exp, run, good, {})[0]
    assert r.passed and (r.seeds_held, r.seeds_n) == (2, 2) and r.detail == ""
    assert r.share_text() == "2 of 2 seeds (16–100%)"  # Clopper-Pearson: 0.025 ** (1 / 2) = 0.158
    assert not hasattr(r, "mean_holds")  # the seed mean is no longer evaluated
    # 3 of 4 seeds: a majority, it holds; the share is named, with its exact 95% interval. The seeds' mean (v2
    # 3.825 against v1 4.0) does not hold: it is no longer evaluated
    held = {s: {"v1": {"loss": 4.0}, "v2": {"loss": 4.1 if s < 4 else 3.0}} for s in range(1, 5)}
    r = C.evaluate_all(exp, run, seeds_dist(held), {})[0]
    assert r.passed and (r.seeds_held, r.seeds_n) == (3, 4)
    assert r.detail == "holds on 3 of 4 seeds (19–99%)" and not r.gated_failure
    # 2 of 4 seeds: exactly half is no majority, it fails, whatever the run says
    half = {s: {"v1": {"loss": 4.0}, "v2": {"loss": 4.5 if s < 3 else 3.9}} for s in range(1, 5)}
    r = C.evaluate_all(exp, run, seeds_dist(half), {})[0]
    assert r.status == "fail" and r.gated_failure and (r.seeds_held, r.seeds_n) == (2, 4)
    assert r.detail == "holds on 2 of 4 seeds (7–93%)"
    # 1 of 2 seeds: no majority either
    bad = seeds_dist({1: {"v1": {"loss": 4.0}, "v2": {"loss": 4.9}}, 2: {"v1": {"loss": 4.3}, "v2": {"loss": 4.2}}})
    r = C.evaluate_all(exp, run, bad, {})[0]
    assert r.status == "fail" and r.gated_failure and "holds on 1 of 2 seeds" in r.detail
    # the run is one draw of the seeds: its own outcome is kept beside (on_run), the seeds decide, both ways (as
    # the check does on another machine: one count for the report and the check)
    r = C.evaluate_all(exp, {"train.v1.loss": 4.5, "train.v2.loss": 4.0}, good, {})[0]
    assert r.passed and r.on_run is False and (r.seeds_held, r.seeds_n) == (2, 2)
    r = C.evaluate_all(exp, run, seeds_dist(half), {})[0]
    assert r.on_run is True and r.status == "fail"
    # metrics/claims.json: the share, and no seed mean
    out = C.claims_json([C.evaluate_all(exp, run, seeds_dist(held), {})[0]])["train.gap"]
    assert (out["pass"], out["seeds_held"], out["seeds_n"]) == (1, 3, 4) and "mean_holds" not in out


def test_a_conclusion_is_evaluated_on_the_seeds_of_every_file_it_reads(tmp_path):
    """Read only where the first test fails: on the run `or` never reads the seeds file, on a seed it does."""
    exp = C.load(write(tmp_path, {"run": {"section": "s"}, "train": {"section": "§2"}}, predicates(
        ("train", "conclusion", "c", "t", 'm["run.ok"] > 0 or m["train.v1.loss"] < 4.05'))))
    dist = seeds_dist({1: {"v1": {"loss": 4.0}}, 2: {"v1": {"loss": 4.1}}})
    r = C.evaluate_all(exp, {"run.ok": 1.0, "train.v1.loss": 4.0}, dist, {})[0]
    assert r.passed and r.seeds_n is None  # reads no file with seeds
    dist = {"run": distribution({1: {"ok": 1.0}, 2: {"ok": -1.0}}), **dist}
    r = C.evaluate_all(exp, {"run.ok": 1.0, "train.v1.loss": 4.0}, dist, {})[0]
    assert r.status == "fail" and (r.seeds_held, r.seeds_n) == (1, 2)  # seed 2: run.ok -1 and train's 4.1


def test_a_conclusion_reading_files_of_other_seeds_is_evaluated_on_the_seeds_they_share(tmp_path):
    """Two files of other seeds (here failures has seed 0, train not): a conclusion reading both holds or not on
    the seeds both have, never "missing" for a seed only one of them has."""
    exp = C.load(write(tmp_path, {"failures": {"section": "s"}, "train": {"section": "§2"}}, predicates(
        ("train", "conclusion", "c", "t", 'm["failures.a.x"] < m["train.v1.loss"]'))))
    dist = {"failures": distribution({s: {"a": {"x": 1.0}} for s in (0, 1, 2)}),
            **seeds_dist({s: {"v1": {"loss": 4.0}} for s in (1, 2)})}
    r = C.evaluate_all(exp, {"failures.a.x": 1.0, "train.v1.loss": 4.0}, dist, {})[0]
    assert r.passed and (r.seeds_held, r.seeds_n) == (2, 2), r.detail


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
    exp = C.load(write(tmp_path, {"latency": {"section": "§7"}}, predicates(
        ("latency", "conclusion", "fast", "t", 'm["latency.gpu_ms"] < 1', "cuda"))))
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
    assert all(c.predicate is not None for c in by["conclusion"]) and all(c.is_cell for c in by["value"])
    for c in exp.claims:
        assert c.experiment in KNOWN
        keys = re.findall(r'm(?:\[|\.all\()f?"([^"]+)"', c.source) if c.predicate else [c.metric]
        files = {k.split(".")[0] for k in keys}
        assert files and files <= KNOWN, (c.id, files)
    ids = {c.id for c in exp.claims}
    assert {"train.gap_grows_with_dhead", "train.d256_unscaled_collapse_early"} <= ids
    for key in exp.headline:
        assert key.split(".")[0] in KNOWN


def test_the_conclusions_module_imports_only_the_standard_library():
    """`attnrepro check` executes the reference revision's copy: nothing of this package may be needed."""
    import ast
    import sys

    tree = ast.parse((REPO / C.CONCLUSIONS).read_text(encoding="utf-8"))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
    assert names <= sys.stdlib_module_names, names


def test_expectation_files_stay_small():
    """One expectations file, less than half the lines of the former claims.yaml + check.yaml (2,613)."""
    assert not (REPO / "check.yaml").exists()
    assert len((REPO / "claims.yaml").read_text(encoding="utf-8").splitlines()) < 2613 / 2


def test_published_numbers_live_only_in_the_claims_file():
    """A few distinctive published figures must not appear in the harness code."""
    mine = [f for f in sorted((REPO / "src/attnrepro").rglob("*.py")) if f.name != "conclusions.py"]
    mine += [REPO / "stages/report.py", REPO / "stages/seeds.py", REPO / "scripts/update_readme.py"]
    figures = ["4977", "425984", "425,984", "1376256", "982.9", "5458.8", "0.9964", "2621440", "4.666", "5.6"]
    for f in mine:
        text = f.read_text(encoding="utf-8")
        for fig in figures:
            assert not re.search(rf"(?<![\d.]){re.escape(fig)}(?![\d])", text), f"{fig} in {f.name}"


def test_no_effect_at_d32_is_a_gap_small_against_d256s_and_of_the_order_of_noise_is_a_ratio():
    from attnrepro.judge import conclusions as K

    def gaps(d32, d256, lo=0.05):
        return {**{f"train.comparison.gap_d{d}_{k}loss_final": v for k in ("", "val_") for d, v in ((32, d32), (256, d256))},
                **{f"seeds.gap_d32_{k}loss_final.ci95_lo": lo for k in ("", "val_")}}
    assert K.d32_no_effect(gaps(0.17, 0.95)) and K.d32_no_effect_val(gaps(0.17, 0.95))  # the chapter's: 0.18 of it
    assert not K.d32_no_effect(gaps(0.25, 0.95)) and not K.d32_no_effect_val(gaps(0.25, 0.95))  # past a quarter
    assert not K.d32_no_effect(gaps(0.1, 0.3))  # small in nats, yet a third of the large model's: an effect
    assert K.d32_gap_small_but_real(gaps(0.17, 0.95)) and not K.d32_gap_small_but_real(gaps(0.17, 0.95, lo=-0.01))
    sd = {"seeds.gap_d32_loss_final.mean": 0.175, "seeds.gap_d32_loss_final.sd": 0.135}
    assert K.d32_gap_of_the_order_of_noise(sd)
    assert not K.d32_gap_of_the_order_of_noise({**sd, "seeds.gap_d32_loss_final.mean": 0.852})  # 6 sd: an effect
    assert not K.d32_gap_of_the_order_of_noise({**sd, "seeds.gap_d32_loss_final.mean": -0.5})  # the other way too


def test_steady_is_within_the_declared_tolerance_and_the_fall_rounds_to_four_orders():
    from attnrepro.judge import conclusions as K

    def diag(entropy, jacobian):
        return {f"train.d256_scaled.{k}_step{s}": v for k, xs in (("entropy", entropy), ("jacobian_fro", jacobian))
                for s, v in zip((222, 444, 666, 888, 1480), xs)}
    chapter = diag([0.6437, 0.6754, 0.6205, 0.5714, 0.5745], [0.3029, 0.2938, 0.2986, 0.2996, 0.3089])
    assert K.d256_scaled_steady(chapter)
    assert K.d256_scaled_steady(diag([0.6, 0.7, 0.8, 0.85, 0.89], [0.3] * 5))  # x1.48: steady
    assert not K.d256_scaled_steady(diag([0.6, 0.7, 0.8, 0.85, 0.91], [0.3] * 5))  # x1.52: a movement
    assert not K.d256_scaled_steady(diag([0.6] * 5, [0.3, 0.3, 0.3, 0.3, 0.03]))  # the Jacobian falls
    assert not K.d256_scaled_steady(diag([0.6, 0.6, 0.07, 0.06, 0.06], [0.3] * 5))  # the attention collapses

    def fall(orders):
        return {"train.d256_unscaled.jacobian_fro_step0": 0.3, "train.d256_unscaled.jacobian_fro_step1480": 0.3 / 10 ** orders}
    assert K.d256_jacobian_vanishes(fall(3.57)) and K.d256_jacobian_vanishes(fall(3.5))  # the chapter's 3.57 rounds to 4
    assert not K.d256_jacobian_vanishes(fall(3.45)) and not K.d256_jacobian_vanishes(fall(2.44))


def test_every_conclusion_the_chapters_figures_can_evaluate_holds_on_them():
    """The chapter agrees with itself (issue 63): each of its conclusions, on its own published figures; those the
    figures cannot evaluate name the figure they lack (never a silent skip)."""
    checked = C.on_published(C.load(REPO / "claims.yaml"))
    assert [c.id for c, ok, _ in checked if ok is False] == []
    judged = {c.id for c, ok, _ in checked if ok}
    assert {"train.d256_jacobian_vanishes", "train.d256_scaled_steady", "train.d32_no_effect"} <= judged
    assert all(missing for _, ok, missing in checked if ok is None)
    assert not any(c.own or c.cls != "conclusion" for c, _, _ in checked)


def test_a_conclusion_its_own_figures_fail_is_found_and_a_rewritten_one_shows_both_verdicts(tmp_path):
    from attnrepro.report.claims_tables import self_consistency_markdown

    values = [{"id": "v", "text": "published", "metric": "a.{col}", "published": {"x": 3.57}}]
    text = predicates(("a", "conclusion", "four", "four orders", 'm["a.x"] >= 4'),
                      ("a", "conclusion", "unprinted", "reads a figure not printed", 'm["a.y"] > 0'))
    text += ('\n\ndef _old(m):\n    return m["a.x"] >= 4\n\n\n@claim("a", "conclusion", "rounded", "rounds to four", '
             'was=_old, why="four or more")\ndef rounded(m):\n    return m["a.x"] >= 3.5\n')
    exp = C.load(write(tmp_path, {"a": {"section": "s", "values": values}}, text))
    checked = {c.id: (ok, missing) for c, ok, missing in C.on_published(exp)}
    assert checked == {"a.four": (False, ""), "a.unprinted": (None, "a.y"), "a.rounded": (True, "")}
    results = C.evaluate_all(exp, {"a.x": 3.6, "a.y": 1.0}, {}, {})
    (old, new), = C.revised(results, {"a.x": 3.6, "a.y": 1.0}, {}, {})
    assert (new.claim.id, old.status, new.status) == ("a.rounded", "fail", "pass")
    report, appendix = self_consistency_markdown(C.on_published(exp), C.revised(results, {"a.x": 3.6, "a.y": 1.0}, {}, {}))
    assert "1 of the 2 conclusions they are enough to evaluate hold; not: `a.four`. 1 need" in report[0]
    assert "`a.rounded` (does not hold → holds)" in report[1]
    assert "- `a.rounded`: was four or more; does not hold (a.x = 3.6) → holds (3.6 vs 3.5)." in appendix
    assert any("a.unprinted" in row and "the chapter prints no `a.y`" in row for row in appendix)


def test_a_replaced_predicate_needs_its_reason(tmp_path):
    text = predicates() + '\n\n@claim("a", "conclusion", "c", "t", was=len)\ndef c(m):\n    return True\n'
    with pytest.raises(C.ClaimError, match=re.escape("was= needs the replaced predicate (a function) and why=")):
        C.load(write(tmp_path, {"a": {"section": "s"}}, text))


def test_every_cited_cause_still_holds_on_the_committed_metrics():
    """Issue 63: a cause claims.yaml cites must still hold on the committed metrics: every `moved_by` row accounts for
    its deviation (significant after Holm, toward, not past), every `by` metric exists; every `causes:` entry explains
    a conclusion that does not reproduce, its metrics exist, and each Holm p it cites is below alpha."""
    from attnrepro.stats import ALPHA

    exp = C.load(REPO / "claims.yaml")
    flat = C.load_metrics_dir(REPO / "metrics")
    results = {r.claim.id: r for r in C.evaluate_all(exp, flat, C.load_json_dir(REPO / "metrics/dist"),
                                                      C.load_json_dir(REPO / "metrics/env"))}
    assert [(cid, r.missing_evidence, r.not_moved) for cid, r in results.items()
            if r.missing_evidence or r.not_moved] == []
    for cid, cause in exp.causes.items():
        assert results[cid].gated_failure, f"{cid} reproduces: its cause is stale"
        assert [k for k in cause.metrics if k not in flat] == [], cid
        assert [k for k in cause.metrics if k.endswith(".p_holm") and not flat[k] < ALPHA] == [], cid


# ---------------------------------------------------------------- where a claim is meaningful (issue 44)

def test_ran_on_cuda_is_the_device_the_stage_ran_on_not_what_the_machine_has(tmp_path):
    """A CPU stage on a GPU box did not run on CUDA: its `requires: cuda` claims are skipped, not missing."""
    on_gpu_box = {"latency": {"cuda_available": 1, "device": "cpu"}, "kv_cache": {"cuda_available": 1, "device": "cuda"}}
    assert C.ran_on("latency", on_gpu_box) == "cpu" and C.ran_on("kv_cache", on_gpu_box) == "cuda"
    assert C.ran_on("precision", on_gpu_box) is None  # no record of its own: unknown, not another stage's device
    exp = C.load(write(tmp_path, {"latency": {"section": "§7"}}, predicates(
        ("latency", "conclusion", "fast", "t", 'm["latency.gpu_ms"] < 1', "cuda"))))
    r = C.evaluate_all(exp, {}, {}, on_gpu_box)[0]
    assert r.status == "skipped" and "CUDA" in r.detail and not r.gated_failure


def test_a_cpu_claim_is_skipped_on_a_cuda_run_and_judged_on_a_cpu_one(tmp_path):
    exp = C.load(write(tmp_path, {"kv_cache": {"section": "§6"}}, predicates(
        ("kv_cache", "conclusion", "faster", "t", 'm["kv_cache.speedup"] > 2', "cpu"))))
    r = C.evaluate_all(exp, {"kv_cache.speedup": 1.0}, {}, {"kv_cache": {"cuda_available": 1, "device": "cuda"}})[0]
    assert r.status == "skipped" and "CPU" in r.detail and not r.gated_failure
    r = C.evaluate_all(exp, {"kv_cache.speedup": 1.0}, {}, {"kv_cache": {"cuda_available": 0, "device": "cpu"}})[0]
    assert r.status == "fail"


H200_LAUNCH_BOUND = {f"latency.sdpa_fp16.n{n}_{k}": v for n, t in
                     ((512, 0.03), (1024, 0.033), (2048, 0.05), (4096, 0.13), (8192, 0.42))
                     for k, v in (("median_ms", t), ("mean_ms", t * 1.2))}


def test_timing_conclusions_state_their_device_and_size_range():
    exp = C.load(REPO / "claims.yaml")
    by_id = {c.id: c for c in exp.claims}
    sup, kv = by_id["latency.cuda_superlinear"], by_id["kv_cache.faster_at_longest_context"]
    assert sup.requires == "cuda" and "n 2048" in sup.text and kv.requires == "cpu" and "CPU" in kv.text
    gpu = {"latency": {"cuda_available": 1, "device": "cuda"}, "kv_cache": {"cuda_available": 1, "device": "cuda"}}
    # on an H200 n 512 and n 1024 are launch-bound: the claim reads the medians from n 2048 up, where the GPU is busy
    r = C.evaluate_claim(sup, H200_LAUNCH_BOUND, {}, gpu)
    assert r.status == "pass", r.detail
    assert all(int(re.search(r"\.n(\d+)_", k).group(1)) >= 2048 and k.endswith("median_ms") for k in r.read), r.read
    # the KV-cache speed-up is a CPU finding: about 1x on CUDA is no failure, and is named as skipped
    r = C.evaluate_claim(kv, {"kv_cache.latency.speedup_n1024": 1.1}, {}, gpu)
    assert r.status == "skipped" and "CPU" in r.detail


CAUSE_PRED = predicates(("train", "conclusion", "c", "a conclusion", 'm["train.x"] > 1'))


@pytest.mark.parametrize("causes,msg", [
    ({"train.nope": {"says": "s", "metrics": []}}, "causes.train.nope: not a conclusion of claims.yaml"),
    ({"train.c": {"says": "s"}}, "causes.train.c: expected {says: <sentence>, metrics: [<metric key>, ...]}"),
    ({"train.c": {"says": "s", "metrics": "train.x"}}, "expected {says"),
    (["train.c"], "causes: expected a mapping"),
])
def test_a_bad_cause_is_a_one_line_load_error(tmp_path, causes, msg):
    with pytest.raises(C.ClaimError) as e:
        C.load(write(tmp_path, {"train": {"section": "s"}}, CAUSE_PRED, causes=causes))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_cause_prints_the_metrics_it_rests_on(tmp_path):
    exp = C.load(write(tmp_path, {"train": {"section": "s"}}, CAUSE_PRED,
                       causes={"train.c": {"says": "because", "metrics": ["train.x", "train.y"]}}))
    assert exp.causes["train.c"].text({"train.x": 0.123456}) == "because (train.x = 0.123; train.y missing)"


def test_attnrepro_claims_exits_1_on_a_failing_gated_row(tmp_path, capsys):
    """`attnrepro claims` printed `fail` rows and exited 0 (issue 66)."""
    from attnrepro.commands.main import main
    from test_check import SEEDS, dump, write_repo

    root = write_repo(tmp_path / "r")
    assert main(["claims", "--root", str(root)]) == 0, capsys.readouterr().out
    dump(root / "metrics/train.json", {**SEEDS[0], "scaled": {**SEEDS[0]["scaled"], "params": 999}})  # a checksum
    assert main(["claims", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "| fail |" in out and out.splitlines()[-1] == "exit 1: 1 gated claim fails or is missing (published " \
        "values outside their band are informational)"
