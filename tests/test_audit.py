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

from attnrepro.audit import checks, cost, diagnose
from attnrepro.model import attention_impl as load
from attnrepro.audit.cases import Case, tolerance
from attnrepro.audit.checks import CheckResult, Finding, Impl
from attnrepro.audit.float64_reference import HYPOTHESES, reference
from attnrepro.config import UserError

sys.path.insert(0, str(REPO))  # the examples package, as `attnrepro audit` run from the root sees it
EX = {name: importlib.import_module(f"examples.attention.{name}") for name in
      ("chunked", "mask_zero", "no_max_subtraction", "dk_not_sqrt", "scale_after_softmax", "future_leak")}
CHUNKED = EX["chunked"].chunked_attention


def audit(target: str, *extra: str) -> tuple[int, dict]:
    from attnrepro.commands.audit import build_parser, run

    return run(build_parser().parse_args([target, "--no-cost", *extra]))


# ---------------------------------------------------------------- the verdicts on the examples

@pytest.mark.parametrize("module,cause", [
    ("mask_zero:attention", "mask_zero"),
    ("no_max_subtraction:attention", "no_stable_softmax"),
    ("dk_not_sqrt:attention", "dk_not_sqrt"),
    ("scale_after_softmax:attention", "scale_after_softmax"),
    ("future_leak:attention", "future_leak_1"),
])
def test_each_wrong_example_fails_with_its_own_bug_named(module, cause, capsys):
    rc, rec = audit(f"examples.attention.{module}")
    assert rc == 1 and rec["verdict"] == "FAIL"
    assert rec["cause"] == cause, rec["headline"]
    assert rec["other_causes"] == []  # one bug each, nothing else named
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("FAIL: ") and first == rec["headline"]
    assert rec["smallest_input"]


@pytest.mark.parametrize("target", ["examples.attention.chunked:chunked_attention",
                                    "torch.nn.functional:scaled_dot_product_attention"])
def test_correct_implementations_pass(target, capsys):
    rc, rec = audit(target)
    assert (rc, rec["verdict"]) == (0, "PASS"), rec["headline"]
    assert capsys.readouterr().out.startswith("PASS")
    assert all(c["status"] == "pass" for c in rec["checks"].values())


def test_smallest_input_of_a_future_leak_is_two_tokens():
    _, rec = audit("examples.attention.future_leak:attention")
    assert rec["smallest_input"].startswith("B=1 H=1 L=2 S=2 ")


def test_json_record_and_the_subcommand(tmp_path, capsys, monkeypatch):
    from attnrepro.commands.main import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "audit.json"
    rc = main(["audit", "examples.attention.dk_not_sqrt:attention", "--no-cost", "--json", str(out)])
    assert rc == 1
    rec = json.loads(out.read_text())
    assert rec["cause"] == "dk_not_sqrt" and rec["identity"].startswith("examples.attention.dk_not_sqrt:attention@")
    assert set(rec["checks"]) == {"parity", "invariants", "numerics", "scale"}
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
    assert f.cause == "mask_ignored" and all("float mask" in c for c in f.data["failing"])


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
    assert causes == {"future_leak_all", "finite_fill"}


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
    assert fail.cause == "finite_fill"


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
    res = cost.cost(Impl(CHUNKED), lengths=(64, 128), heads=1, d_head=16, min_run_time=0.01)
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
             Finding("invariants", "fail", "finite row", cause="finite_fill", smallest="b")),
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
    rc = main(["audit", target, "--time-limit", "0.5", "--no-cost"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert time.perf_counter() - t < 30


def test_a_check_that_hangs_later_is_stopped_by_the_time_limit(tmp_path, monkeypatch, capsys):
    from attnrepro.commands.main import main

    _module(tmp_path, monkeypatch, "bi_slow_later", "import time\nimport torch.nn.functional as F\n" + GOOD_SIG +
            "    if query.shape[-2] > 5:\n        time.sleep(3600)\n"
            "    return F.scaled_dot_product_attention(query, key, value)\n")
    assert main(["audit", "bi_slow_later:attn", "--time-limit", "1", "--no-cost"]) == 2
    err = capsys.readouterr().err
    assert "check parity: no result within 1 s" in err and err.count("\n") == 1


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
