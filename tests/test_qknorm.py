"""QK-norm (§1.7.8) in the one attention function, and the attention centroid of exercise 3."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from attnrepro.model.attention import QKNorm, attention, fused_attention
from attnrepro.config import ConfigError, from_dict
from attnrepro.measure.weights import position_stats
from attnrepro.model.transformer import ModelConfig, TinyGPT
from conftest import tinygpt

TINY = dict(vocab_size=50, block_size=16, d_model=64, n_head=2, n_layer=2)


def qkv(d=64, t=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, t, d, generator=g, dtype=dtype) for _ in range(3)]


def test_disabled_switch_is_todays_attention_bit_for_bit():
    q, k, v = qkv()
    ref = attention(q, k, v)
    for off in (None, QKNorm("none")):
        res = attention(q, k, v, qk_norm=off)
        assert torch.equal(res.out, ref.out) and torch.equal(res.weights, ref.weights)
    # and a model without the switch has no new parameters and the same init draw
    torch.manual_seed(0)
    plain = TinyGPT(tinygpt(**TINY))
    assert not any("norm" in n and "ln" not in n for n, _ in plain.named_parameters())
    assert not any("gain" in n for n, _ in plain.named_parameters())


@pytest.mark.parametrize("kind", ["layernorm", "l2"])
def test_qk_norm_shares_the_init_draw_of_the_plain_model(kind):
    torch.manual_seed(3)
    plain = TinyGPT(tinygpt(**TINY)).state_dict()
    torch.manual_seed(3)
    normed = TinyGPT(tinygpt(**TINY, qk_norm=kind)).state_dict()
    extra = set(normed) - set(plain)
    assert extra and all("q_norm" in n or "k_norm" in n or "qk_gain" in n for n in extra)
    assert all(torch.equal(plain[n], normed[n]) for n in plain)  # paired: same weights but the new ones


def test_normalised_q_and_k_have_the_stated_norm():
    q, k, _ = qkv(d=64)
    qn, kn = QKNorm("l2").apply(q, k)
    one_ = torch.ones((), dtype=q.dtype)
    assert torch.allclose(qn.norm(dim=-1), one_, atol=1e-12) and torch.allclose(kn.norm(dim=-1), one_, atol=1e-12)
    d = q.shape[-1]
    one, zero = torch.ones(d, dtype=q.dtype), torch.zeros(d, dtype=q.dtype)
    qn, kn = QKNorm("layernorm", one, zero, one, zero).apply(q, k)
    root_d = torch.full((), math.sqrt(d), dtype=q.dtype)
    assert torch.allclose(qn.mean(-1), torch.zeros((), dtype=q.dtype), atol=1e-12)
    assert torch.allclose(qn.norm(dim=-1), root_d, rtol=1e-4)  # unit variance per vector
    assert torch.allclose(kn.norm(dim=-1), root_d, rtol=1e-4)


def test_layernorm_without_scaling_gives_logits_of_std_sqrt_dk():
    """The issue's warning: unit-variance q and k with no scale give logits of std about sqrt(d_k)."""
    d = 256
    q, k, v = qkv(d=d, t=64, seed=1)
    one, zero = torch.ones(d, dtype=q.dtype), torch.zeros(d, dtype=q.dtype)
    ln = QKNorm("layernorm", one, zero, one, zero)
    std = attention(q, k, v, scaled=False, causal=False, qk_norm=ln).logits.std().item()
    assert std == pytest.approx(math.sqrt(d), rel=0.1)
    assert attention(q, k, v, scaled=True, causal=False, qk_norm=ln).logits.std().item() == pytest.approx(1, rel=0.1)


def test_l2_gain_scales_the_scores_and_starts_at_henrys_value():
    q, k, v = qkv()
    gain = torch.tensor(3.0, dtype=q.dtype)
    res = attention(q, k, v, scaled=False, causal=False, qk_norm=QKNorm("l2", gain=gain))
    cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
    assert torch.allclose(res.logits, 3.0 * cos)
    m = TinyGPT(tinygpt(**{**TINY, "block_size": 64}, qk_norm="l2"))
    assert m.blocks[0].attn.qk_gain.item() == pytest.approx(math.log2(64 ** 2 - 64))  # 11.98
    m = TinyGPT(tinygpt(**TINY, qk_norm="l2", qk_gain_init=5.0))
    assert m.blocks[1].attn.qk_gain.item() == 5.0
    with pytest.raises(ConfigError, match="qk_gain_init"):
        from_dict(ModelConfig, {**dataclasses.asdict(tinygpt(**TINY)), "qk_norm": "layernorm", "qk_gain_init": 2.0},
                  prefix="m")


@pytest.mark.parametrize("kind", ["layernorm", "l2"])
@pytest.mark.parametrize("scaled", [True, False])
def test_fused_path_agrees_with_the_manual_one(kind, scaled):
    """The same QK-norm through PyTorch's SDPA kernel (attention.fused_attention) and the manual path."""
    torch.manual_seed(0)
    layer = TinyGPT(tinygpt(**TINY, qk_norm=kind, scaled=scaled)).double().blocks[0].attn
    q, k, v = layer.project(torch.randn(2, 16, layer.cfg.d_model, dtype=torch.float64))
    manual = attention(q, k, v, scaled=scaled, causal=True, qk_norm=layer.qk_norm()).out
    fused = fused_attention(q, k, v, scaled=scaled, causal=True, qk_norm=layer.qk_norm())
    assert torch.allclose(manual, fused, atol=1e-10)


def test_qk_norm_model_trains_and_its_gain_learns():
    torch.manual_seed(0)
    m = TinyGPT(tinygpt(**TINY, qk_norm="l2"))
    x = torch.randint(0, 50, (4, 16))
    _, loss = m(x, x)
    loss.backward()
    assert m.blocks[0].attn.qk_gain.grad is not None and torch.isfinite(m.blocks[0].attn.qk_gain.grad)


# ---------------------------------------------------------------- exercise 3: the centroid distance

def test_centroid_distance_on_hand_made_maps():
    t = 6
    first = torch.zeros(1, t, t)
    first[..., 0] = 1.0  # every query looks at the first token: dist_i = i
    st = position_stats(first)
    rows = torch.arange(1, t, dtype=torch.float64)  # row 0 is excluded (it sees only itself)
    assert st["distance"].item() == pytest.approx(rows.mean().item())
    assert st["distance_std"].item() == pytest.approx(rows.std(correction=0).item())
    prev = torch.zeros(1, t, t)
    prev[0, 0, 0] = 1.0
    for i in range(1, t):
        prev[0, i, i - 1] = 1.0  # a previous-token head: dist 1 everywhere, no spread
    st = position_stats(prev)
    assert st["distance"].item() == 1.0 and st["distance_std"].item() == 0.0
    # a "conditional" head: half the queries look at themselves, half far back
    cond = torch.zeros(1, t, t)
    for i in range(t):
        cond[0, i, i if i % 2 else 0] = 1.0
    assert position_stats(cond)["distance_std"].item() > position_stats(prev)["distance_std"].item()
