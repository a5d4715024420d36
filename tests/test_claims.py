"""The claims language and file: safe parsing, evaluation, validation, gating."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from attnrepro import claims as C

REPO = Path(__file__).resolve().parents[1]
KNOWN_STAGES = {"corpus", "train", "init_sweep", "heads", "failures", "precision", "kv_cache", "latency",
                "reversal", "charlm"}
M = {"a.x": 2.0, "a.y": 3.0, "b.z.w": 0.5, "n.nan": None}


@pytest.mark.parametrize("expr,want", [
    ("a.x + a.y * 2", 8.0),
    ("(a.x + a.y) * 2", 10.0),
    ("-a.x - -a.y", 1.0),
    ("a.y / a.x", 1.5),
    ("1e-3 * 1000", 1.0),
    ("abs(a.x - a.y) + max(1, 2, b.z.w) + min(a.x, 7)", 5.0),
    ("sqrt(16) + log(1)", 4.0),
    ("a.x < a.y", True),
    ("a.x >= a.y", False),
    ("0 < b.z.w < 1 <= a.x", True),
    ("0 < b.z.w < 0.1", False),
    ("a.x == 2 and not a.y == 2", True),
    ("a.x > 5 or a.y > 2", True),
    ("1 / 0 > 1e308", True),
])
def test_expressions(expr, want):
    assert C.eval_expr(expr, M) == want


def test_nan_compares_false_and_null_metric_is_nan():
    assert C.eval_expr("n.nan < 1", M) is False
    assert C.eval_expr("n.nan >= 1", M) is False
    assert math.isnan(C.eval_expr("0 / 0", M))


@pytest.mark.parametrize("bad", [
    "__import__('os').system('true')", "open(a.x)", "a.x.__class__ ; 1", "a.x ** 2", "a.x +", "(a.x",
    "lambda: 1", "x + 1", "a.x[0]", "",
])
def test_unsafe_or_malformed_expressions_are_rejected(bad):
    with pytest.raises(C.ClaimError):
        C.parse(bad)


def test_missing_metric_names_the_key():
    with pytest.raises(C.MissingMetric) as e:
        C.eval_expr("a.x + q.nope", M)
    assert e.value.key == "q.nope"


def _claim(**kw):
    base = {"id": "c1", "section": "§9 x", "kind": "value", "text": "t", "gate": False,
            "value": "a.x", "published": 2.1, "tolerance": {"abs": 0.2}, "reason": "r"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def _load(tmp_path, *raw):
    import yaml
    p = tmp_path / "claims.yaml"
    p.write_text(yaml.safe_dump({"claims": list(raw)}), encoding="utf-8")
    return C.load_claims(p)


@pytest.mark.parametrize("raw,msg", [
    (_claim(reason=None), "reason"),
    (_claim(tolerance={"abs": 0.1, "rel": 0.1}), "tolerance"),
    (_claim(tolerance={"pct": 1}), "tolerance"),
    (_claim(value="a.x > 1"), "numeric"),
    (_claim(kind="direction", value=None, published=None, tolerance=None, reason=None, expr="a.x + 1"),
     "comparison"),
    (_claim(kind="direction", expr="a.x > 1"), "only `expr:`"),
    (_claim(id="Bad-Id"), "lower_snake_case"),
    (_claim(gate="yes"), "gate"),
    (_claim(colour="red"), "unknown key"),
    (_claim(value="1 + 2"), "no metric"),
    (_claim(requires="tpu"), "requires"),
    (_claim(tolerance={"factor": 0.5}), "factor"),
])
def test_claim_validation_one_line_errors(tmp_path, raw, msg):
    with pytest.raises(C.ClaimError) as e:
        _load(tmp_path, raw)
    text = str(e.value)
    assert msg in text and ("c1" in text or "Bad-Id" in text) and "\n" not in text


def test_duplicate_ids_rejected(tmp_path):
    with pytest.raises(C.ClaimError, match="twice"):
        _load(tmp_path, _claim(), _claim())


def test_value_claim_tolerances(tmp_path):
    cs = _load(tmp_path,
               _claim(id="abs_ok", published=2.1, tolerance={"abs": 0.1}),
               _claim(id="abs_bad", published=2.2, tolerance={"abs": 0.1}),
               _claim(id="rel_ok", published=2.2, tolerance={"rel": 0.1}),
               _claim(id="rel_bad", published=2.5, tolerance={"rel": 0.1}),
               _claim(id="factor_ok", value="b.z.w", published=1.4, tolerance={"factor": 3}),
               _claim(id="factor_bad", value="b.z.w", published=1.6, tolerance={"factor": 3}),
               _claim(id="nan", value="n.nan", published=1, tolerance={"abs": 100}))
    got = {r.claim.id: r.status for r in C.evaluate_all(cs, M, {})}
    assert got == {"abs_ok": "pass", "abs_bad": "fail", "rel_ok": "pass", "rel_bad": "fail",
                   "factor_ok": "pass", "factor_bad": "fail", "nan": "fail"}


def test_direction_missing_and_gpu_skip(tmp_path):
    cs = _load(tmp_path,
               _claim(id="d_ok", kind="direction", expr="a.y > a.x", value=None, published=None,
                      tolerance=None, reason=None, gate=True),
               _claim(id="d_bad", kind="direction", expr="a.y < a.x", value=None, published=None,
                      tolerance=None, reason=None, gate=True),
               _claim(id="d_missing", kind="direction", expr="q.k > 1", value=None, published=None,
                      tolerance=None, reason=None, gate=True),
               _claim(id="gpu", kind="direction", expr="lat.cuda_ms < 1", value=None, published=None,
                      tolerance=None, reason=None, gate=True, requires="cuda"))
    cpu = {"lat": {"cuda_available": 0, "device": "cpu"}}
    res = {r.claim.id: r for r in C.evaluate_all(cs, M, cpu)}
    assert res["d_ok"].status == "pass" and (res["d_ok"].value, res["d_ok"].bound) == (3.0, 2.0)
    assert res["d_bad"].status == "fail" and res["d_bad"].gated_failure
    assert res["d_missing"].status == "missing" and res["d_missing"].gated_failure
    assert res["gpu"].status == "skipped" and not res["gpu"].gated_failure and not res["gpu"].passed
    # on a CUDA run the same claim is evaluated, and a missing metric fails
    gpu_env = {"lat": {"cuda_available": 1, "device": "cuda"}}
    assert C.evaluate_claim(res["gpu"].claim, M, gpu_env).status == "missing"
    t = C.totals(list(res.values()))
    assert (t["n"], t["passed"], t["failed"], t["skipped"], t["gated_failed"]) == (4, 1, 2, 1, 2)


def test_claims_metrics_numbers_only(tmp_path):
    cs = _load(tmp_path, _claim(), _claim(id="c2", value="q.missing"))
    out = C.claims_metrics(C.evaluate_all(cs, M, {}))
    assert out["c1"] == {"pass": 1, "gate": 0, "skipped": 0, "published": 2.1, "tolerance": 0.2, "value": 2.0}
    assert "value" not in out["c2"] and out["c2"]["pass"] == 0
    assert out["totals"]["n"] == 2
    for entry in out.values():
        assert all(isinstance(v, (int, float)) for v in entry.values())


def test_flatten_nested_metrics():
    assert C.flatten({"a": {"b": 1, "c": {"d": 2.5}}, "s": "text", "t": True}, "m.") == \
        {"m.a.b": 1, "m.a.c.d": 2.5, "m.t": 1}


# ---------------------------------------------------------------- the project's claims file

def test_project_claims_file_is_valid_and_honest():
    cs = C.load_claims(REPO / "claims.yaml")
    assert len(cs) > 50
    for c in cs:
        assert set(c.stages) <= KNOWN_STAGES, (c.id, c.stages)
        if c.kind == "direction":
            assert c.gate, f"{c.id}: direction claims are the gate"
        else:
            assert c.reason, c.id
    # the chapter's headline conclusions are gated direction claims
    ids = {c.id: c for c in cs}
    assert ids["train_gap_grows_with_dhead"].gate and ids["train_d256_unscaled_collapse_early"].gate


def test_published_numbers_live_only_in_the_claims_file():
    """A few distinctive published figures must not appear in the harness code."""
    mine = [REPO / "src/attnrepro" / f for f in ("claims.py", "check.py", "report.py", "cli.py")]
    mine += [REPO / "stages/report.py", REPO / "check.yaml"]
    figures = ["4977", "425984", "425,984", "1376256", "982.9", "5458.8", "0.9964", "2621440", "4.666"]
    for f in mine:
        text = f.read_text(encoding="utf-8")
        for fig in figures:
            assert not re.search(rf"(?<![\d.]){re.escape(fig)}(?![\d])", text), f"{fig} in {f.name}"
