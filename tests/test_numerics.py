"""numerics: the fp32/fp16/bf16 facts of §1.6.4, §1.11.3, §1.16, §1.17 and the precision stage."""

import json
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnrepro.experiments import precision as nm

ROOT = Path(__file__).resolve().parents[1]
# one thread: on a shared, oversubscribed CPU two OpenMP threads can be 50x slower


def test_finfo_table_matches_the_chapter():
    t = nm.finfo_table()
    assert t["fp16"]["max"] == 65504.0
    assert round(t["fp16"]["ln_max"], 1) == 11.1
    assert round(t["fp32"]["ln_max"], 1) == 88.7 and round(t["bf16"]["ln_max"], 1) == 88.7
    assert t["bf16"]["eps"] == 2.0 ** -7 and t["fp16"]["eps"] == 2.0 ** -10


def test_1001_round_trip():
    assert nm.round_trip(1.001, "fp16") == pytest.approx(1.000977, abs=1e-6)
    assert nm.round_trip(1.001, "bf16") == 1.0


def test_naive_softmax_nan_depends_on_dtype():
    d = nm.softmax_demo()
    # numpy's default float64 (the source's snippet): exp(102) = 2e44 is finite -> no nan
    assert d["fp64"]["naive_nan"] == 0
    assert d["fp64"]["naive_p2"] == pytest.approx(d["fp64"]["stable_p2"], abs=1e-15)
    for dt in ("fp32", "fp16", "bf16"):
        assert d[dt]["naive_nan"] == 1
    assert [round(d["fp32"][f"stable_p{i}"], 4) for i in range(3)] == [0.0900, 0.2447, 0.6652]


def test_exp_overflow_counts():
    assert nm.exp_overflow_count(1.6) == 0
    assert nm.exp_overflow_count(5477) == 14
    assert nm.exp_overflow_count(5477, dtype="float64") < 14  # float64 goes up to e^709.8
    assert nm.exp_overflow_count(60.0) == 0 and nm.exp_overflow_count(60.0, dtype="float16") > 0


def test_four_sigma_table():
    t = nm.four_sigma_table([32, 256])
    assert t["d32"]["four_sigma"] == pytest.approx(22.63, abs=0.01) and t["d32"]["overflows_fp16"] == 1
    assert t["d256"]["four_sigma"] == 64.0 and t["d256"]["scaled_overflows_fp16"] == 0


def test_forward_overflow_fp16_unscaled_naive_only():
    kw = dict(qk_std=1.0, seed=0, seq=32)
    assert nm.forward_overflow(64, dtype="fp16", scaled=False, stable=False, **kw)["nonfinite_frac"] > 0.5
    assert nm.forward_overflow(64, dtype="fp16", scaled=False, stable=True, **kw)["nonfinite_frac"] == 0
    assert nm.forward_overflow(64, dtype="fp16", scaled=True, stable=False, **kw)["nonfinite_frac"] == 0
    assert nm.forward_overflow(64, dtype="fp32", scaled=False, stable=False, **kw)["nonfinite_frac"] == 0
    # with trained-size q, k (std 5.4) even the scaled naive path overflows in fp16
    assert nm.forward_overflow(64, dtype="fp16", scaled=True, stable=False, qk_std=5.4, seed=0, seq=32)[
        "nonfinite_frac"] > 0.5


def test_additive_mask_pitfalls():
    assert nm.additive_mask_value(-1e9, "fp16") == -math.inf
    assert math.isfinite(nm.additive_mask_value(-1e9, "bf16"))
    assert nm.additive_mask_leak(4348.0, -1e4)["leak_max"] > 0.5  # -1e4 against logits of 1.6e4
    assert nm.additive_mask_leak(4348.0, -1e9)["leak_max"] == 0.0
    assert nm.additive_mask_leak(1.64, -1e4)["leak_max"] == 0.0
    assert nm.fully_masked_row(-1e9, "fp16")["nan"] == 1  # -inf everywhere -> nan
    assert nm.fully_masked_row(-1e9, "bf16") == {"nan": 0, "w0": 0.125}  # uniform over 8 keys


def test_bf16_sequential_accumulation_stalls():
    a = nm.accumulation(4096)
    assert a["weight_mean"] == pytest.approx(2.44e-4, rel=0.01)
    assert a["sequential_fp32"] == pytest.approx(1.0, abs=1e-5)
    assert a["sequential_bf16"] < 0.2  # increments below half an ulp are rounded away
    assert a["torch_sum_bf16"] == pytest.approx(1.0, abs=0.01)  # fp32 accumulator inside torch.sum


def test_sdpa_parity_float64():
    assert nm.sdpa_parity(0) <= 1e-12
    assert nm.sdpa_parity(3, shape=(1, 2, 17, 8), causal=False) <= 1e-12


@pytest.mark.parametrize("causal", [True, False])
def test_hand_written_backward_matches_autograd(causal):
    err = nm.backward_parity(0, shape=(2, 3, 7, 16), causal=causal)
    assert max(err.values()) <= 1e-12


def test_backward_check_can_fail():
    q, k, v = (t.requires_grad_(True) for t in nm.qkv(0, (1, 2, 5, 8), 1.0, torch.float64))
    d_out = torch.ones(1, 2, 5, 8, dtype=torch.float64)
    from attnrepro.model.attention import attention

    attention(q, k, v, scaled=True).out.backward(d_out)
    dq, _, _ = nm.attention_backward(q.detach(), k.detach(), v.detach(), d_out, scaled=False)
    assert (dq - q.grad).abs().max() > 1e-3


def run_stage_script(name):
    """The stage script as `python stages/<name>.py` runs it (argv from sys.argv)."""
    runpy.run_path(str(ROOT / "stages" / f"{name}.py"), run_name="__main__")


def run_in(tmp_path, monkeypatch, section: dict):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"precision": section}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["precision.py"])
    run_stage_script("precision")
    return (tmp_path / "metrics/precision.json").read_bytes()


def test_precision_stage_small(tmp_path, monkeypatch):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    sec = dict(params["precision"], d_heads=[32], sigma_d_heads=[32], seq=16, accum_n=256,
               qk_stds_published={"iid": 1.0}, dtypes=["fp32", "fp16"])
    first = run_in(tmp_path, monkeypatch, sec)
    m = json.loads(first)
    assert m["overflow"]["unscaled_inf"] == 14 and m["softmax"]["fp64_naive_nan"] == 0
    assert m["forward_iid"]["fp16_unscaled_naive_d32_nonfinite"] > 0
    assert all(isinstance(v, (int, float)) for s in m.values() for v in s.values())
    assert (tmp_path / "plots/precision/forward.csv").exists()
    assert run_in(tmp_path, monkeypatch, sec) == first  # deterministic, byte for byte


def test_precision_stage_bad_param(tmp_path, monkeypatch, capsys):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"precision": {**params["precision"], "dtypes": ["fp8"]}}),
                                          encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["precision.py"])
    with pytest.raises(SystemExit) as e:
        run_stage_script("precision")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "precision.dtypes" in err
