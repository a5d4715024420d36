"""attention.attention: the one implementation with switches (§0, §4)."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnrepro.model.attention import BUGS, attention, causal_mask, fused_attention



def qkv(B=2, H=3, tq=7, tk=None, d=16, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    tk = tq if tk is None else tk
    q = torch.randn(B, H, tq, d, generator=g, dtype=dtype) * scale
    k = torch.randn(B, H, tk, d, generator=g, dtype=dtype) * scale
    v = torch.randn(B, H, tk, d, generator=g, dtype=dtype)
    return q, k, v


def future(tq, tk):
    return ~causal_mask(tq, tk)


@pytest.mark.parametrize("causal", [True, False])
def test_rows_sum_to_one(causal):
    res = attention(*qkv(), causal=causal)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert (res.weights >= 0).all()


@pytest.mark.parametrize("tq,tk", [(7, 7), (3, 7), (1, 5)])
def test_exactly_zero_weight_on_future_keys(tq, tk):
    res = attention(*qkv(tq=tq, tk=tk, scale=3.0))
    fut = future(tq, tk)
    assert fut.any() or tq == 1
    assert (res.weights[..., fut] == 0).all()
    # every visible key gets some weight (the mask is not too wide)
    assert (res.weights[..., ~fut] > 0).all()


def test_causal_mask_kv_cache_alignment():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    with pytest.raises(ValueError):
        causal_mask(5, 2)


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk", [(9, 9), (4, 9)])
def test_parity_with_sdpa_float64(scaled, causal, tq, tk):
    q, k, v = qkv(tq=tq, tk=tk, d=32, seed=1)
    ours = attention(q, k, v, scaled=scaled, causal=causal).out
    scale = 1 / math.sqrt(32) if scaled else 1.0
    mask = causal_mask(tq, tk) if causal else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    assert (ours - ref).abs().max().item() <= 1e-12


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk", [(9, 9), (4, 9)])
def test_fused_equals_manual(scaled, causal, tq, tk):
    q, k, v = qkv(tq=tq, tk=tk, d=8, seed=2)
    a = attention(q, k, v, scaled=scaled, causal=causal).out
    b = fused_attention(q, k, v, scaled=scaled, causal=causal)
    assert (a - b).abs().max().item() <= 1e-12


def test_fused_differs_when_switch_differs():
    """Guard against a parity test that cannot fail: the switches matter."""
    q, k, v = qkv(d=8, seed=2, scale=2.0)
    a = attention(q, k, v, scaled=True, causal=True).out
    assert (a - fused_attention(q, k, v, scaled=False, causal=True)).abs().max() > 1e-3
    assert (a - fused_attention(q, k, v, scaled=True, causal=False)).abs().max() > 1e-3


def test_logits_are_scaled_scores():
    q, k, v = qkv(d=16)
    raw = q @ k.transpose(-2, -1)
    torch.testing.assert_close(attention(q, k, v, scaled=True).logits, raw / 4.0)
    torch.testing.assert_close(attention(q, k, v, scaled=False).logits, raw)


def test_bug_mask_zero_puts_weight_on_future():
    q, k, v = qkv()
    w = attention(q, k, v, bug="mask_zero").weights
    assert (w[..., future(7, 7)] > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_bug_scale_after_softmax_row_sums():
    d = 16
    q, k, v = qkv(d=d)
    w = attention(q, k, v, bug="scale_after_softmax").weights
    torch.testing.assert_close(w.sum(-1), torch.full_like(w.sum(-1), 1 / math.sqrt(d)))
    # the softmax itself saw unscaled scores
    w_unscaled = attention(q, k, v, scaled=False).weights
    torch.testing.assert_close(w * math.sqrt(d), w_unscaled)


def test_bug_dk_not_sqrt_is_flatter():
    from attnrepro.measure.weights import normalized_entropy

    q, k, v = qkv(d=64, scale=2.0)
    correct = attention(q, k, v).weights
    flat = attention(q, k, v, bug="dk_not_sqrt").weights
    assert normalized_entropy(flat).mean() > normalized_entropy(correct).mean()
    torch.testing.assert_close(attention(q, k, v, bug="dk_not_sqrt").logits,
                               q @ k.transpose(-2, -1) / 64)


def test_bug_no_stable_softmax_small_and_huge_logits():
    q, k, v = qkv(dtype=torch.float32)
    ok = attention(q, k, v).weights
    naive = attention(q, k, v, bug="no_stable_softmax").weights
    torch.testing.assert_close(naive, ok, rtol=1e-5, atol=1e-7)
    # logits of order 1e3 overflow exp in float32; the stable path stays finite
    q, k, v = qkv(dtype=torch.float32, scale=30.0)
    assert torch.isfinite(attention(q, k, v).weights).all()
    res = attention(q, k, v, bug="no_stable_softmax")
    assert not torch.isfinite(res.weights).all()
    assert not torch.isfinite(res.out).all()


def test_correct_stable_softmax_finite_at_logit_std_5000():
    """§4 boundary check: logits of std ~5000 must not produce nan."""
    q, k, v = qkv(dtype=torch.float32, d=16, scale=math.sqrt(5000.0))
    res = attention(q, k, v, scaled=False)
    assert res.logits.std() > 1000
    assert torch.isfinite(res.weights).all() and torch.isfinite(res.out).all()


def test_bugs_listed():
    assert set(BUGS) == {"correct", "mask_zero", "scale_after_softmax", "no_stable_softmax", "dk_not_sqrt"}


def test_unknown_bug_raises():
    with pytest.raises(ValueError, match="nope"):
        attention(*qkv(), bug="nope")


def test_trace_gets_four_steps():
    q, k, v = qkv(tq=5, d=8)
    trace = {}
    res = attention(q, k, v, trace=trace)
    assert set(trace) == {"scores", "masked", "exp", "weights"}
    torch.testing.assert_close(trace["scores"], res.logits)
    assert torch.isneginf(trace["masked"][..., future(5, 5)]).all()
    assert (trace["exp"][..., future(5, 5)] == 0).all()
    torch.testing.assert_close(trace["weights"], res.weights)


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("tq,tk", [(9, 9), (4, 9)])
def test_narrower_q_k_than_v_scales_by_the_q_k_width(scaled, tq, tk):
    """ModelConfig.d_qk: q and k 8 wide, v 32 wide; the scale is 1/sqrt(8), SDPA agrees (its Ev may differ)."""
    q, k, _ = qkv(tq=tq, tk=tk, d=8, seed=3)
    v = qkv(tq=tk, d=32, seed=4)[2]
    res = attention(q, k, v, scaled=scaled, causal=True)
    assert res.out.shape[-1] == 32
    assert torch.allclose(res.logits, q @ k.transpose(-2, -1) / (math.sqrt(8) if scaled else 1.0), atol=1e-12)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(tq, tk), scale=1 / math.sqrt(8) if scaled else 1.0)
    assert (res.out - ref).abs().max().item() <= 1e-12
    assert (fused_attention(q, k, v, scaled=scaled, causal=True) - ref).abs().max().item() <= 1e-12
