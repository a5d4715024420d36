"""`attnrepro audit`: each check catches a bug planted for it and passes the correct implementations;
the diagnosis names the chapter's bug; bad input is one line and exit 2; `attention.impl` trains
the model with a user's callable and keys its runs by the callable's source."""

from __future__ import annotations

import importlib
import json
import math
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, tinygpt

from attnrepro.audit import cases as cases_mod
from attnrepro.audit import checks, cost, determinism, diagnose, render
from attnrepro.model import attention_impl as load
from attnrepro.audit.cases import Case, tolerance
from attnrepro.audit.checks import CheckResult, Finding, Impl
from attnrepro.audit.float64_reference import HYPOTHESES, reference
from attnrepro.config import UserError

sys.path.insert(0, str(REPO))  # the examples package, as `attnrepro audit` run from the root sees it
EX = {name: importlib.import_module(f"examples.attention.{name}") for name in
      ("chunked", "mask_zero", "no_max_subtraction", "dk_not_sqrt", "scale_after_softmax", "future_leak",
       "mask_ignored_when_causal", "softmax_wrong_axis", "dropout_always_on", "mask_fill_finite", "mask_sign_flipped",
       "bool_mask_inverted", "float_mask_typeerror", "bool_masks_only", "fp16_plain", "fp16_scaled_q", "gqa_tiled",
       "gqa_interleaved", "kv_swapped", "output_transposed")}
CHUNKED = EX["chunked"].chunked_attention


def audit(target: str, *extra: str) -> tuple[int, dict]:
    from attnrepro.commands.audit import build_parser, run

    return run(build_parser().parse_args([target, *extra]))


# ---------------------------------------------------------------- the verdicts on the examples

@pytest.mark.parametrize("target", ["examples.attention.chunked:chunked_attention",
                                    "torch.nn.functional:scaled_dot_product_attention"])
def test_correct_implementations_pass(target, capsys):
    rc, rec = audit(target)
    assert (rc, rec["verdict"]) == (0, "PASS"), rec["headline"]
    assert capsys.readouterr().out.startswith("PASS")
    assert all(c["status"] == "pass" for c in rec["checks"].values()), rec["checks"]["determinism"]


PASS = "PASS: matches the float64 reference; invariants, numerics and scale hold"
NO_GQA = "grouped-query attention not supported: the signature takes no enable_gqa"
# the gallery (issues 41, 64): every example's page as a user reads it: its first line, its cause, one cause only
# (no "also:"), and what else the page must say
GALLERY = [
    ("chunked:chunked_attention", 0, "", PASS, [NO_GQA]),
    ("fp16_scaled_q:attention", 0, "", PASS, [NO_GQA]),
    ("gqa_interleaved:attention", 0, "", PASS, ["49 of 49 cases within tolerance"]),
    ("mask_zero:attention", 1, "mask_zero", "FAIL: masked scores filled with 0 instead of -inf (the chapter's mask_zero)",
     ["future leak at every offset 1-15", "masked scores filled with 0)"]),
    ("no_max_subtraction:attention", 1, "no_stable_softmax",
     "FAIL: exp without subtracting the row maximum (the chapter's no_stable_softmax)", ["fp32 overflow above logit 88.7"]),
    ("dk_not_sqrt:attention", 1, "dk_not_sqrt", "FAIL: scores divided by d_k instead of sqrt(d_k) (dk_not_sqrt)",
     ["divided by d_k^1.00"]),
    ("scale_after_softmax:attention", 1, "scale_after_softmax",
     "FAIL: 1/sqrt(d_k) applied to the weights after the softmax (scale_after_softmax)", ["sum to 0.25, not 1"]),
    ("future_leak:attention", 1, "future_leak_1", "FAIL: causal mask off by one: future leak at offset 1",
     ["smallest input that shows it: B=1 H=1 L=2 S=2 "]),
    ("causal_bottom_right:attention", 1, "causal_bottom_right",
     "FAIL: causal mask aligned bottom-right (KV-cache style) where SDPA aligns it top-left",
     ["is_causal aligns the mask top-left", "L=1 S=2"]),
    ("mask_ignored_when_causal:attention", 1, "mask_ignored_when_causal",
     "FAIL: attn_mask ignored when is_causal is also set (SDPA applies both)", ["causal+bool mask"]),
    ("softmax_wrong_axis:attention", 1, "softmax_axis",
     "FAIL: softmax over the queries (dim -2) instead of the keys: each key's column of weights sums to 1",
     ["queries are mixed"]),
    ("dropout_always_on:attention", 1, "dropout_on",
     "FAIL: dropout applied with dropout_p=0 (about 10% of the weights zeroed): the output is random",
     ["follow from this one"]),
    ("mask_fill_finite:attention", 1, "mask_fill:-1e+04",
     "FAIL: masked scores filled with -1e+04 instead of -inf (a finite fill)", ["attn_mask=[[False]]"]),
    ("mask_sign_flipped:attention", 1, "mask_sign_flipped",
     "FAIL: float attn_mask subtracted from the scores instead of added", ["float mask"]),
    ("bool_mask_inverted:attention", 1, "mask_inverted",
     "FAIL: boolean attn_mask inverted (True taken as 'masked out')", ["follow from this one"]),
    ("float_mask_typeerror:attention", 1, "raises:TypeError",
     "FAIL: raises TypeError: attn_mask must be boolean, got torch.float32 (on B=2 H=3 L=17 S=17 E=24 Ev=24, "
     "float mask, fp32)", ["raise NotImplementedError and the audit reports it as not supported"]),
    ("bool_masks_only:attention", 1, "", "INCOMPLETE: nothing failed, but 7 cases could not run (unsupported): "
     "the audit vouches only for what ran", ["[unsupported] parity:", NO_GQA]),
    ("fp16_plain:attention", 1, "scores_overflow", "FAIL: fp16 overflow above logit 1.638e+04: q k^T exceeds fp16's "
     "range before the scale (fix: scale q before q k^T, or compute q k^T in float32)", ["65504"]),
    ("gqa_tiled:attention", 1, "gqa_tiled", "FAIL: grouped-query heads mapped by tiling (key/value head h % Hkv, "
     "`repeat`) where SDPA's enable_gqa interleaves (head h // (H/Hkv), `repeat_interleave`)",
     ["4 of 49 cases differ", "45 of 49 cases within", "smallest input that shows it: B=1 H=4 Hkv=2 "]),
    ("output_transposed:attention", 1, "output_transposed",
     "FAIL: output transposed: returned (B, L, H, Ev) where SDPA returns (B, H, L, Ev)", ["follow from this one"]),
    ("kv_swapped:attention", 1, "kv_swapped",
     "FAIL: key and value swapped: the output is softmax(q v^T) k, not softmax(q k^T) v",
     ["37 of 37 cases differ", "with the identity as the key and k as the value it is",
      "raised an exception on 4 inputs (evidence; the cases that ran name the cause)", "E=40 Ev=16, none mask"]),
]


@pytest.mark.parametrize("module,status,cause,first,needles", GALLERY, ids=[g[0].split(":")[0] for g in GALLERY])
def test_gallery_pages(module, status, cause, first, needles, capsys):
    rc, rec = audit(f"examples.attention.{module}")
    page = capsys.readouterr().out
    assert page.splitlines()[0] == first == rec["headline"]
    assert (rc, rec["cause"], rec["other_causes"]) == (status, cause, [])  # one bug each, nothing else named
    assert "\n  also: " not in page
    assert ("declines" in page) == module.startswith("bool_masks_only")  # NotImplementedError, the one decline
    assert "is_causal aligns the mask top-left" in page and "fp16 4.9e-04" in page  # the conventions, every page
    for needle in needles:
        assert needle in page, needle


def test_the_gallery_is_every_example_and_the_readme_names_each():
    modules = {p.stem for p in (REPO / "examples" / "attention").glob("*.py")} - {"__init__", "third_party"}
    assert {g[0].split(":")[0] for g in GALLERY} == modules
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("attnrepro audit package.module:function"):readme.index("Health checks")]
    index = (REPO / "examples" / "attention" / "__init__.py").read_text()
    for name in modules:
        assert f"`{name}`" in section and name in index, name


def test_json_record_and_the_subcommand(tmp_path, capsys, monkeypatch):
    from attnrepro.commands.main import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "audit.json"
    rc = main(["audit", "examples.attention.dk_not_sqrt:attention", "--json", str(out)])
    assert rc == 1
    rec = json.loads(out.read_text())
    assert rec["cause"] == "dk_not_sqrt" and rec["identity"].startswith("examples.attention.dk_not_sqrt:attention@")
    assert set(rec["checks"]) == {"determinism", "parity", "invariants", "numerics", "scale"}
    assert capsys.readouterr().out.splitlines()[0] == rec["headline"]


# ---------------------------------------------------------------- one planted bug per check

def ignores_float_masks(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = None  # planted: additive masks dropped
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


class _WrongGradV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v):
        return v.clone()

    @staticmethod
    def backward(ctx, g):
        return 2 * g  # planted: the gradient of v doubled


def wrong_backward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(query, key, _WrongGradV.apply(value), attn_mask=attn_mask,
                                          is_causal=is_causal, scale=scale)


def test_parity_names_the_dropped_float_mask():
    res = checks.parity(Impl(ignores_float_masks))
    [f] = [f for f in res.findings if f.severity == "fail"]
    assert f.cause == "mask_ignored" and all("float" in c for c in f.data["failing"])


def test_parity_catches_a_wrong_backward_with_a_right_forward():
    res = checks.parity(Impl(wrong_backward))
    [f] = [f for f in res.findings if f.severity == "fail"]
    assert "backward only" in f.symptom
    assert all(c["fwd"] <= 1 for c in res.details["cases"])


def test_parity_passes_sdpa_within_a_tolerance_that_bugs_exceed():
    assert checks.parity(Impl(F.scaled_dot_product_attention)).status == "pass"
    q, k, v, kw, _ = Case(1, 1, 16, 16, 16, 16, dtype="bf16").inputs()
    out = EX["dk_not_sqrt"].attention(q, k, v, **kw)
    tol = tolerance(torch.bfloat16, 16, 16, 4.0, v.double().abs().max().item())
    assert (out.double() - reference(q, k, v)).abs().max() > tol  # a bug is visible even in bf16


def test_invariants_find_the_leak_offset():
    res = checks.invariants(Impl(EX["future_leak"].attention))
    leak = [f for f in res.findings if f.cause.startswith("future_leak")]
    assert [f.data["offsets"] for f in leak] == [[1]]  # is_causal only; the explicit tril mask is right
    assert checks.invariants(Impl(CHUNKED)).status == "pass"


def test_invariants_find_a_leak_at_every_offset_and_the_finite_fill():
    res = checks.invariants(Impl(EX["mask_zero"].attention))
    causes = {f.cause for f in res.findings if f.severity == "fail"}
    assert causes == {"future_leak_all", "mask_zero"}  # the fully masked row: a fill of 0, named


def positional(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if attn_mask is None and not is_causal:
        attn_mask = -0.5 * torch.arange(key.shape[-2], dtype=query.dtype)[None]  # planted: a position term
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def test_invariants_catch_a_key_order_dependence():
    res = checks.invariants(Impl(positional))
    assert [f.cause for f in res.findings if f.severity == "fail"] == ["not_equivariant"]


def test_invariants_read_the_weights_row_sums():
    res = checks.invariants(Impl(EX["scale_after_softmax"].attention))
    [f] = [f for f in res.findings if f.cause == "scale_after_softmax"]
    assert "0.25" in f.symptom  # 1/sqrt(16)


def test_fully_masked_row_behaviour_is_stated():
    assert checks.fully_masked_row(Impl(F.scaled_dot_product_attention)) == []  # zeros, like SDPA
    [warn] = checks.fully_masked_row(Impl(EX["dk_not_sqrt"].attention))  # the textbook softmax: NaN
    assert warn.severity == "warn" and "NaN" in warn.symptom
    [fail] = checks.fully_masked_row(Impl(EX["mask_zero"].attention))
    assert fail.cause == "mask_zero" and fail.data["fill"] == 0


def test_numerics_find_the_overflow_threshold_of_each_dtype():
    res = checks.numerics(Impl(EX["no_max_subtraction"].attention), dtypes=("fp32", "fp16"))
    th = {f.data["dtype"]: f.data["threshold"] for f in res.findings}
    assert th["fp16"] == pytest.approx(math.log(65504.0), rel=0.01)  # 11.09
    assert th["fp32"] == pytest.approx(math.log(torch.finfo(torch.float32).max), rel=0.01)  # 88.72
    assert {f.cause for f in res.findings} == {"no_stable_softmax"}
    assert checks.numerics(Impl(CHUNKED), dtypes=("fp32", "fp16")).status == "pass"


def fp16_scores(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    s = query @ key.transpose(-2, -1)  # planted: unscaled scores in the input dtype (fp16 max 65504)
    w = torch.softmax(s.float() * scale, -1)
    return (w @ value.float()).to(query.dtype)


def test_numerics_tell_a_score_overflow_from_a_softmax_overflow():
    res = checks.numerics(Impl(fp16_scores), dtypes=("fp16",))
    [f] = res.findings
    assert f.cause == "scores_overflow" and 1e4 < f.data["threshold"] < 2e4  # 65504 / sqrt(16)


def unscaled_default(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                                          scale=1.0 if scale is None else scale)


def scale_ignored(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal)


@pytest.mark.parametrize("fn,cause,exponent", [
    (EX["dk_not_sqrt"].attention, "dk_not_sqrt", 1.0),
    (unscaled_default, "unscaled", 0.0),
    (EX["scale_after_softmax"].attention, "scale_after_softmax", 0.0),
    (scale_ignored, "scale_ignored", 0.5),
])
def test_scale_check_says_which_power_of_dk_and_where(fn, cause, exponent):
    res = checks.scale_check(Impl(fn))
    assert res.details["exponent"] == pytest.approx(exponent, abs=0.02)
    assert [f.cause for f in res.findings] == [cause]


def test_scale_check_passes_the_correct_scale():
    res = checks.scale_check(Impl(CHUNKED))
    assert res.status == "pass" and res.details["exponent"] == pytest.approx(0.5, abs=0.01)
    assert all(abs(r["default_logit_std"] - 1) < 0.25 for r in res.details["rows"])  # ~1 at every d_head


def test_cost_measures_peak_memory_and_compares_with_sdpa():
    big = cost.peak_bytes(lambda: torch.ones(8 * 2**20).add_(1), "cpu")  # 32 MiB
    if big is None:
        pytest.skip("peak memory needs Linux /proc")
    assert big >= 31 * 2**20
    res = cost.cost(Impl(CHUNKED), lengths=(64, 128), heads=1, d_head=16, reps=3)
    assert [r["n"] for r in res.details["rows"]] == [64, 128]
    assert all(r["impl_ms"] > 0 and r["sdpa_ms"] > 0 for r in res.details["rows"])
    assert res.status == "pass"  # informational, never gated


def test_project_interface_adapter_marks_what_it_cannot_express():
    target = load.resolve("attnrepro.model.attention:attention", "project")
    res = checks.parity(Impl(target.fn))
    assert res.status == "pass" and res.details["cases"]
    unsupported = [f.symptom for f in res.findings if f.severity == "unsupported"]
    assert unsupported and all("mask" in u or "scale" in u or "causal" in u for u in unsupported)
    with pytest.raises(UserError, match="does not take scaled_dot_product_attention"):
        load.resolve("attnrepro.model.attention:attention")  # without the adapter its signature is refused


# ---------------------------------------------------------------- the diagnosis mapping

def test_reference_hypotheses_reproduce_the_example_bugs():
    case = Case(1, 2, 9, 9, 12, 12, mask="causal")
    q, k, v, kw, _ = case.inputs()
    for name, variant in [("mask_zero", "mask_zero"), ("dk_not_sqrt", "dk_not_sqrt"),
                          ("scale_after_softmax", "scale_after_softmax"), ("future_leak", "future_leak_1")]:
        out = EX[name].attention(q, k, v, **kw)
        assert (out.double() - reference(q, k, v, **kw, variant=variant)).abs().max() < 1e-5, name
        assert (out.double() - reference(q, k, v, **kw)).abs().max() > 1e-2, name
    assert set(HYPOTHESES) >= {"correct", "mask_zero", "dk_not_sqrt", "scale_after_softmax"}


def _res(name, *findings):
    r = CheckResult(name)
    r.findings = list(findings)
    return r


def test_diagnosis_combines_symptoms_into_one_cause():
    d = diagnose.diagnose([
        _res("invariants", Finding("invariants", "fail", "leak everywhere", cause="future_leak_all", smallest="a"),
             Finding("invariants", "fail", "finite row", cause="mask_zero", smallest="b")),
        _res("numerics"),
    ])
    assert d.verdict == "FAIL" and d.cause == "mask_zero" and len(d.evidence) == 2
    assert "mask_zero" in d.headline
    assert d.others == []  # causal_ignored rests on a subset of the same evidence


def test_diagnosis_prefers_parity_on_a_tie_and_reports_unknowns():
    d = diagnose.diagnose([_res("parity", Finding("parity", "fail", "x", cause="dk_not_sqrt", smallest="s")),
                           _res("scale", Finding("scale", "fail", "y", cause="unscaled"))])
    assert d.cause == "dk_not_sqrt" and d.smallest == "s" and d.others == ["unscaled"]
    d = diagnose.diagnose([_res("parity", Finding("parity", "fail", "odd"))])
    assert d.verdict == "FAIL" and d.cause == "" and "none of the known bugs" in d.headline
    d = diagnose.diagnose([_res("parity", Finding("parity", "unsupported", "no masks"))])
    assert d.verdict == "INCOMPLETE" and "1 cases could not run" in d.headline  # never a PASS
    assert diagnose.diagnose([_res("parity")]).verdict == "PASS"
    assert "offsets 1-3" in diagnose.cause_text("future_leak_3")


# ---------------------------------------------------------------- bad input: one line, exit 2

def _module(tmp_path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


GOOD_SIG = "def attn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):\n"


@pytest.mark.parametrize("name,body,target,needle", [
    ("bi_missing", "", "bi_nowhere.deeper:attn", "module 'bi_nowhere' not found"),
    ("bi_broken", "raise RuntimeError('boom')\n", "bi_broken:attn", "importing bi_broken raised RuntimeError: boom"),
    ("bi_noattr", "x = 1\n", "bi_noattr:attn", "has no attribute 'attn'"),
    ("bi_notcall", "attn = 3\n", "bi_notcall:attn", "int object is not callable"),
    ("bi_sig", "def attn(q, k):\n    return q\n", "bi_sig:attn", "does not take scaled_dot_product_attention"),
    ("bi_raises", GOOD_SIG + "    raise ValueError('nope')\n", "bi_raises:attn", "raised ValueError: nope"),
    ("bi_shape", GOOD_SIG + "    return query[..., :1]\n", "bi_shape:attn", "returned shape (2, 3, 5, 1)"),
    ("bi_type", GOOD_SIG + "    return 0\n", "bi_type:attn", "returned int, expected a tensor"),
    ("bi_hangs", "import time\n" + GOOD_SIG + "    time.sleep(3600)\n", "bi_hangs:attn", "no result within 0.5 s"),
    ("bi_nocolon", "", "bi_nocolon.attn", "expected package.module:function"),
])
def test_bad_input_is_one_line_and_exit_2(name, body, target, needle, tmp_path, monkeypatch, capsys):
    from attnrepro.commands.main import main

    _module(tmp_path, monkeypatch, name, body)
    t = time.perf_counter()
    rc = main(["audit", target, "--time-limit", "0.5"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert time.perf_counter() - t < 30


def test_a_check_that_hangs_later_is_stopped_by_the_time_limit(tmp_path, monkeypatch, capsys):
    from attnrepro.commands.main import main

    _module(tmp_path, monkeypatch, "bi_slow_later", "import time\nimport torch.nn.functional as F\n" + GOOD_SIG +
            "    if query.shape[-2] > 5:\n        time.sleep(3600)\n"
            "    return F.scaled_dot_product_attention(query, key, value)\n")
    assert main(["audit", "bi_slow_later:attn", "--time-limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "check determinism: no result within 1 s" in err and err.count("\n") == 1


# ---------------------------------------------------------------- attention.impl: the pipeline key

def test_model_trains_through_a_users_callable():
    from attnrepro.model.transformer import TinyGPT

    identity = load.resolve("examples.attention.chunked:chunked_attention").identity
    cfgs = [tinygpt(vocab_size=50, block_size=40, d_model=32, n_head=2, n_layer=2, impl=impl, scaled=scaled)
            for impl in ("manual", identity) for scaled in (True, False)]
    x = torch.randint(0, 50, (3, 40), generator=torch.Generator().manual_seed(0))
    outs = []
    for cfg in cfgs:
        torch.manual_seed(0)
        m = TinyGPT(cfg).eval()
        m.set_record(True)
        logits, _ = m(x)
        outs.append((logits, m.attentions[0].last["weights"], m.attentions[0].last["logits"]))
    for (a, wa, la), (b, wb, lb) in zip(outs[:2], outs[2:]):
        assert torch.allclose(a, b, atol=1e-5) and torch.allclose(wa, wb, atol=1e-6) and torch.allclose(la, lb)
    torch.manual_seed(0)
    wrong = TinyGPT(tinygpt(vocab_size=50, block_size=40, d_model=32, n_head=2, n_layer=2,
                                impl=load.resolve("examples.attention.future_leak:attention").identity)).eval()
    assert not torch.allclose(wrong(x)[0], outs[0][0], atol=1e-3)  # a wrong implementation changes the model


def test_attention_config_applies_and_keys_by_source(tmp_path, monkeypatch):
    from attnrepro.config import from_dict
    from test_sweep import tiny_spec

    spec = tiny_spec()
    assert from_dict(load.AttentionConfig, {"impl": ""}, "attention").apply(spec) is spec  # builtin: untouched
    name = _module(tmp_path, monkeypatch, "bi_mine", "import torch.nn.functional as F\n" + GOOD_SIG +
                   "    return F.scaled_dot_product_attention(query, key, value, attn_mask, is_causal=is_causal,"
                   " scale=scale)\n")
    cfg = from_dict(load.AttentionConfig, {"impl": f"{name}:attn"}, "attention")
    first = cfg.apply(spec).model.impl
    assert first.startswith("bi_mine:attn@") and first != spec.model.impl
    (tmp_path / f"{name}.py").write_text((tmp_path / f"{name}.py").read_text() + "# edited\n")
    assert cfg.apply(spec).model.impl != first  # another source, another run key
    with pytest.raises(UserError, match="changed since this run was keyed"):
        load.resolve_identity(first)
    with pytest.raises(UserError, match=r"^attention\.impl: bi_nothing:attn: module 'bi_nothing' not found"):
        from_dict(load.AttentionConfig, {"impl": "bi_nothing:attn"}, "attention")


def test_params_declare_the_attention_section_for_the_stages_that_use_it():
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert params["attention"] == {"impl": ""}
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for stage in ("train", "init_sweep", "heads"):
        assert "attention" in stages[stage]["params"], stage
    assert "attention" not in stages["seeds"]["params"]  # the reference distribution stays the builtin's


# ---------------------------------------------------------------- issue 41: what a new user's functions showed

def fp16_plain_mask_dropped(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """Two bugs at once: q k^T in the input dtype before the scale (fp16 overflow) and attn_mask dropped
    when is_causal is set: the functional one must come first."""
    if is_causal:
        attn_mask = None
    return EX["fp16_plain"].attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def test_grid_combines_masks_with_causal_half_types_broadcasts_and_decode():
    cases = cases_mod.grid()
    kinds = {(c.mask, c.dtype) for c in cases}
    assert {("causal+bool", "fp32"), ("causal+float", "fp32"), ("bool", "fp16"), ("float", "fp16"),
            ("bool", "bf16"), ("float", "bf16")} <= kinds
    assert {"bool_b", "float_h", "bool_lr"} <= {c.mask for c in cases}  # (B,1,L,S), (1,H,L,S), bottom-right
    assert any(c.L == 1 and c.S > 1 and c.mask == "causal" for c in cases)  # decode, top-left (SDPA's is_causal)
    for case in cases:  # the reference is SDPA's semantics on every one of them (where SDPA takes the input)
        q, k, v, kw, _ = case.inputs()
        if case.dtype == "fp32" and not (case.optional and case.E != case.Ev):  # SDPA's math path refuses those
            assert (F.scaled_dot_product_attention(q, k, v, **kw).double() - reference(q, k, v, **kw)).abs().max() < 1e-4
    q, k, v, kw, _ = Case(2, 3, 5, 9, 8, 8, mask="float_h").inputs()
    assert kw["attn_mask"].shape == (1, 3, 5, 9)


def test_a_mask_dropped_when_causal_fails_and_is_named():
    res = checks.parity(Impl(EX["mask_ignored_when_causal"].attention))
    [f] = [f for f in res.findings if f.severity == "fail"]
    assert f.cause == "mask_ignored_when_causal" and all("causal+" in c for c in f.data["failing"])


def test_the_functional_bug_outranks_the_fp16_overflow():
    d = diagnose.diagnose([
        _res("parity", Finding("parity", "fail", "x", cause="mask_ignored_when_causal")),
        _res("numerics", *[Finding("numerics", "fail", f"{dt} overflow", cause="scores_overflow") for dt in ("a", "b")]),
    ])
    assert d.cause == "mask_ignored_when_causal" and d.others == ["scores_overflow"]


def test_fp16_plain_with_a_dropped_mask_is_named_for_the_mask(capsys):
    rc, rec = audit("test_audit:fp16_plain_mask_dropped")
    assert rc == 1
    assert rec["cause"] == "mask_ignored_when_causal" and "scores_overflow" in rec["other_causes"]


def test_numerics_name_what_overflowed_and_both_fixes():
    res = checks.numerics(Impl(EX["fp16_plain"].attention), dtypes=("fp16",))
    [f] = res.findings
    assert f.cause == "scores_overflow" and "scale q before q k^T" in f.symptom and "float32" in f.symptom
    assert "6.55e+04" in f.symptom  # what overflowed: the raw q.k, logit x sqrt(d_k)
    assert checks.numerics(Impl(EX["fp16_scaled_q"].attention)).status == "pass"


def test_softmax_over_the_queries_is_not_a_scale_problem():
    fn = EX["softmax_wrong_axis"].attention
    assert not [f for f in checks.scale_check(Impl(fn)).findings if f.cause.startswith("scale")]
    res = checks.invariants(Impl(fn))
    [f] = [f for f in res.findings if f.cause == "softmax_axis"]
    lo, hi = res.details["row_sum_none"]
    assert f"{lo:.3g}..{hi:.3g}" in f.symptom and hi - lo > 0.1  # the range found, not the mean


def test_dropout_left_on_is_named_dropout():
    res = determinism.determinism(Impl(EX["dropout_always_on"].attention))
    [f] = [f for f in res.findings if f.severity == "fail"][:1]
    assert f.cause == "dropout_on" and "dropout" in f.symptom
    assert 0.05 < f.data["drop_rate"] < 0.15


def noisy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    return out + 1e-6 * torch.randn_like(out)  # planted: nondeterministic, no zeros


def ignores_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def unscaled_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    w = torch.softmax(query @ key.transpose(-2, -1) * (query.shape[-1] ** -0.5 if scale is None else scale), -1)
    keep = (torch.rand_like(w) >= dropout_p).to(w.dtype)
    return out if dropout_p == 0 else (w * keep) @ value  # planted: kept weights not divided by 1 - p


@pytest.mark.parametrize("fn,cause", [(noisy, "nondeterministic"), (ignores_dropout, "dropout_ignored"),
                                      (unscaled_dropout, "dropout_unscaled"),
                                      (F.scaled_dot_product_attention, None), (CHUNKED, None)])
def test_determinism_and_dropout_statistics(fn, cause):
    res = determinism.determinism(Impl(fn))
    assert [f.cause for f in res.findings if f.severity == "fail"] == ([cause] if cause else [])


def test_a_finite_fill_is_named_with_its_value():
    [f] = [f for f in checks.fully_masked_row(Impl(EX["mask_fill_finite"].attention)) if f.severity == "fail"]
    assert f.cause == "mask_fill:-1e+04" and "-1e+04" in f.symptom
    assert "-1e+04 instead of -inf" in diagnose.cause_text(f.cause)
    [f] = checks.fully_masked_row(Impl(EX["mask_zero"].attention))
    assert f.cause == "mask_zero"  # a fill of 0 is the chapter's bug


def raises_multiline(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if attn_mask is not None:
        raise RuntimeError("masks are not wired up\nsecond line of a long message")
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale)


def test_an_exception_is_a_fail_naming_the_input_and_its_first_line():
    res = checks.parity(Impl(raises_multiline))
    raised = [f for f in res.findings if f.severity == "fail"]
    assert raised and all(f.cause == "raises:RuntimeError" for f in raised)
    assert all("second line" not in f.symptom for f in raised)
    assert "raised" in render._summary(res) and f"of {sum(not c.gqa for c in cases_mod.grid())} cases" in render._summary(res)
    d = diagnose.diagnose([res])
    assert d.headline.startswith("FAIL: raises RuntimeError: masks are not wired up (on B=")


def test_not_implemented_is_unsupported_in_the_readme_and_help():
    from attnrepro.commands.audit import build_parser

    readme = (REPO / "README.md").read_text()
    assert "NotImplementedError" in readme and "NotImplementedError" in build_parser().format_help()


def test_memory_below_resolution_is_said_and_not_fitted():
    assert cost.mib_text(0.0, 1.0) == "below resolution (1 MiB)"
    assert cost.mib_text(33.8, 1.0) == "33.8 MiB"
    assert cost.growth([256, 512, 1024], [0.0, 0.5, 32.0], floor=1.0) is None  # one point above: no exponent
    res = cost.cost(Impl(CHUNKED), lengths=(32, 64), heads=1, d_head=8, reps=3)
    [f] = res.findings
    assert "below resolution" in f.symptom and "n^" not in f.symptom and "p20-p80" in f.symptom


def test_a_hang_in_the_cost_check_keeps_the_gated_verdict(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "bi_cost_hangs", "import time\nimport torch.nn.functional as F\n" + GOOD_SIG +
            "    if query.shape[-2] >= 256:\n        time.sleep(3600)\n"
            "    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,"
            " is_causal=is_causal, scale=scale)\n")
    from attnrepro.audit.battery import battery

    results = battery(load.resolve("bi_cost_hangs:attn"), time_limit=15, with_cost=True)
    assert diagnose.diagnose(results).verdict == "PASS"
    [c] = [r for r in results if r.name == "cost"]
    assert "no result within 15 s" in c.findings[0].symptom and c.findings[0].severity == "info"


def module_based(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """An implementation with parameters of its own: its output requires grad whatever the inputs."""
    gain = torch.nn.Parameter(torch.ones((), dtype=query.dtype))
    return gain * F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                 is_causal=is_causal, scale=scale)


def test_an_implementation_with_its_own_parameters_is_audited_not_crashed():
    assert checks.scale_check(Impl(module_based)).status == "pass"
    assert checks.invariants(Impl(module_based)).status == "pass"


def heads_interleaved(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch.ao.nn.quantizable.MultiheadAttention's batch_first bug, planted: (B, H, L, E) read back as if
    it were laid out (B, L, H, E)."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    B, H, L, E = out.shape
    return out.reshape(B, L, H, E).transpose(1, 2)


def test_mixed_heads_or_rows_are_named_before_the_leak_they_look_like():
    res = checks.invariants(Impl(heads_interleaved))
    assert {f.cause for f in res.findings if f.severity == "fail"} >= {"queries_mixed"}
    d = diagnose.diagnose([res])
    assert d.cause == "queries_mixed" and not any(c.startswith("future_leak") for c in d.others)


def thread_recorder(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    SEEN.add((query.shape[-2], torch.get_num_threads()))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)


SEEN: set = set()


def test_gated_checks_run_on_one_thread_and_the_setting_is_restored():
    from attnrepro.audit.battery import battery

    torch.set_num_threads(2)
    try:
        SEEN.clear()
        battery(load.resolve("test_audit:thread_recorder"), with_cost=True)
        SEEN.discard((5, 2))  # the smoke call, on the caller's threads
        assert {t for n, t in SEEN if n < 256} == {1}  # (cost times on 1 thread as well)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # the suite's setting (conftest)


# ---------------------------------------------------------------- issue 64: GQA, layout bugs, one cause, conventions

def sdpa_gqa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def gqa_heads_dropped(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa:  # planted: key/value head 0 for every query head
        key, value = (t[:, :1].expand(-1, query.shape[1], -1, -1) for t in (key, value))
    return sdpa_gqa(query, key, value, attn_mask, dropout_p, is_causal, scale)


def test_grid_has_grouped_and_multi_query_cases_with_an_interleaved_reference():
    gqa = [c for c in cases_mod.grid() if c.gqa]
    assert {c.Hkv for c in gqa} == {1, 2} and all(c.H > c.Hkv and c.H % c.Hkv == 0 for c in gqa)
    q, k, v, kw, _ = gqa[0].inputs()
    assert kw["enable_gqa"] is True and k.shape[1] == 2 < q.shape[1] == 4
    ref = reference(q, k, v, **kw)
    head = reference(q[:, 1:2], k[:, :1], v[:, :1])  # query head 1 reads key/value head 1 // 2 = 0
    assert (ref[:, 1:2] - head).abs().max() < 1e-12
    assert (reference(q, k, v, **kw, variant="gqa_tiled")[:, 1:2] - head).abs().max() > 1e-2


@pytest.mark.parametrize("target", ["test_audit:sdpa_gqa", "examples.attention.gqa_interleaved:attention"])
def test_correct_grouped_query_attention_passes_with_its_cases_run(target):
    rc, rec = audit(target)
    assert (rc, rec["verdict"]) == (0, "PASS"), rec["headline"]
    parity = rec["checks"]["parity"]["details"]
    assert parity["gqa_not_supported"] == 0 and sum("Hkv=" in c["case"] for c in parity["cases"]) == 6


@pytest.mark.parametrize("fn,cause", [(EX["gqa_tiled"].attention, "gqa_tiled"), (gqa_heads_dropped, "gqa_heads_dropped")])
def test_the_head_mapping_is_diagnosed(fn, cause):
    res = checks.parity(Impl(fn))
    [f] = [f for f in res.findings if f.severity == "fail"]
    assert f.cause == cause and all("Hkv=2" in c for c in f.data["failing"])
    assert "Hkv=2" in f.smallest


def test_without_enable_gqa_the_page_says_gqa_is_not_supported(capsys):
    rc, rec = audit("examples.attention.chunked:chunked_attention")
    assert rc == 0 and rec["checks"]["parity"]["details"]["gqa_not_supported"] == 6
    page = capsys.readouterr().out
    assert f"[info] parity: {NO_GQA}" in page and "6 grouped-query not supported (no enable_gqa)" in page
    assert not checks.takes_gqa(CHUNKED) and checks.takes_gqa(sdpa_gqa) and checks.takes_gqa(F.scaled_dot_product_attention)


def test_a_transposed_output_is_a_fail_with_its_cause_in_the_json(tmp_path, monkeypatch, capsys):
    from attnrepro.commands.main import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "audit.json"
    assert main(["audit", "examples.attention.output_transposed:attention", "--json", str(out)]) == 1
    rec = json.loads(out.read_text())
    assert (rec["verdict"], rec["cause"]) == ("FAIL", "output_transposed")
    assert rec["headline"] == "FAIL: output transposed: returned (B, L, H, Ev) where SDPA returns (B, H, L, Ev)"
    assert rec["cause_text"].startswith("output transposed") and rec["other_causes"] == []
    assert checks.layout((2, 3, 8, 5), (2, 3, 5, 8)) == "(B, H, Ev, L)"  # a transpose of L and E
    assert checks.layout((2, 3, 5, 1), (2, 3, 5, 8)) == ""  # not a permutation: bad input (exit 2)


def kv_swapped_same_width(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if value.shape[-1] != key.shape[-1]:
        raise NotImplementedError("values as wide as the keys only")
    return EX["kv_swapped"].attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


@pytest.mark.parametrize("target", ["examples.attention.kv_swapped:attention", "test_audit:kv_swapped_same_width"])
def test_key_and_value_swapped_is_named_whether_or_not_widths_differ(target):
    rc, rec = audit(target)
    assert (rc, rec["cause"], rec["other_causes"]) == (1, "kv_swapped", [])  # not also "dropout_rate"
    raised = rec["raised_beside"]
    assert all("Ev=16" in r["symptom"] for r in raised) and bool(raised) == target.startswith("examples")
    [probe] = [f for f in rec["checks"]["invariants"]["findings"] if f["cause"] == "kv_swapped"]
    assert "identity as the key" in probe["symptom"]


def test_the_kv_swap_probe_passes_correct_implementations():
    for fn in (CHUNKED, F.scaled_dot_product_attention):
        res = checks.invariants(Impl(fn))
        assert res.status == "pass" and res.details["kv_swap_probe"]["identity_as_key"] > 1


def test_dropout_always_on_names_dropout_and_nothing_else(capsys):
    rc, rec = audit("examples.attention.dropout_always_on:attention")
    assert (rec["cause"], rec["other_causes"]) == ("dropout_on", [])  # not also "heads mixed"
    assert "heads_mixed" in {f["cause"] for f in rec["checks"]["invariants"]["findings"]}  # its symptom, not a cause
    assert "also:" not in capsys.readouterr().out


def test_a_second_cause_needs_a_probe_the_first_does_not_spoil():
    swap = Finding("parity", "fail", "x", cause="kv_swapped")
    rate = Finding("determinism", "fail", "y", cause="dropout_rate", via=(checks.IDENTITY,))
    overflow = Finding("numerics", "fail", "z", cause="scores_overflow")
    d = diagnose.diagnose([_res("parity", swap, Finding("invariants", "fail", "w", cause="kv_swapped")),
                           _res("determinism", rate), _res("numerics", overflow)])
    assert (d.cause, d.others) == ("kv_swapped", ["scores_overflow"])  # the overflow's probe is not spoiled
    d = diagnose.diagnose([_res("determinism", Finding("determinism", "fail", "r", cause="dropout_on")),
                           _res("invariants", Finding("invariants", "fail", "h", cause="heads_mixed")), _res("numerics", overflow)])
    assert (d.cause, d.others) == ("dropout_on", [])


def test_a_crash_beside_other_failures_is_evidence_not_the_headline():
    crash = Finding("parity", "fail", "B=2 ...: raised ValueError: no", cause="raises:ValueError", smallest="B=2 ...",
                    data={"headline": "raises ValueError: no"})
    d = diagnose.diagnose([_res("parity", crash, Finding("parity", "fail", "x", cause="mask_zero"))])
    assert d.cause == "mask_zero" and d.crashes == [crash] and d.others == []
    page = render.page("t:f", "t:f@0", d, [_res("parity", crash)], 1.0)
    assert "raised an exception on 1 inputs" in page and "B=2 ...: raised ValueError" in page
    assert "raise NotImplementedError" in page
    d = diagnose.diagnose([_res("parity", crash)])  # nothing else failed: the crash is the bug
    assert d.headline.startswith("FAIL: raises ValueError: no (on B=2")


def test_declines_is_reserved_for_not_implemented_error():
    res = checks.parity(Impl(EX["kv_swapped"].attention))
    optional = [f.symptom for f in res.findings if f.severity == "info" and "optional" in f.symptom]
    assert optional and not any("declines" in s for s in optional)
    assert all("SDPA's math path refuses too (B=" in s for s in optional)


def test_the_help_and_the_page_state_the_conventions():
    from attnrepro.commands.audit import build_parser

    text = " ".join(build_parser().format_help().split())
    for needle in ("aligns the mask top-left", "bottom-right alignment is a FAIL", "NotImplementedError",
                   "not supported", "enable_gqa", "fp16 4.9e-04", "path/to/file.py:function", "--cost"):
        assert needle in text, needle
    assert any("top-left" in line for line in render.CONVENTIONS)


def test_a_path_to_a_py_file_is_a_module(monkeypatch, capsys):
    from attnrepro.commands.main import main

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    rc, rec = audit("examples/attention/fp16_scaled_q.py:attention")
    assert rc == 0 and rec["target"] == "examples/attention/fp16_scaled_q.py:attention"
    assert main(["audit", "examples/attention/nothing.py:attention"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no file examples/attention/nothing.py" in err


def always_causal(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=True, scale=scale)


def test_the_dropout_rate_is_read_over_the_weights_live_without_dropout():
    assert determinism.determinism(Impl(always_causal)).status == "pass"  # its mask is parity's, not dropout's


def scale_on_q_and_k(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    s = query.shape[-1] ** -0.5 if scale is None else scale
    return F.scaled_dot_product_attention(query * s, key * s, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=1.0)  # planted: scale on both q and k


def test_a_scale_applied_to_q_and_k_is_named_squared():
    rc, rec = audit("test_audit:scale_on_q_and_k")
    assert (rec["cause"], rec["other_causes"]) == ("scale_squared", [])
    assert "scale squared" in rec["headline"]
