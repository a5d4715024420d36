"""TinyGPT (§0): architecture checksum, init, causality, fused parity, generation."""

import math

import pytest
import torch

from attnrepro.config import ConfigError
from attnrepro.model.transformer import TinyGPT, generate
from conftest import tinygpt


SMALL = dict(vocab_size=1200, block_size=64, d_model=128, n_head=4, n_layer=2)
LARGE = dict(vocab_size=1200, block_size=64, d_model=256, n_head=1, n_layer=2)
TINY = dict(vocab_size=50, block_size=12, d_model=16, n_head=2, n_layer=2)


def make(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyGPT(tinygpt(**{**TINY, **kw})).eval()


def tokens(B=2, T=10, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


@pytest.mark.parametrize("shape,expected", [(SMALL, 425_984), (LARGE, 1_376_256)])
def test_parameter_count_checksum(shape, expected):
    model = TinyGPT(tinygpt(**shape))
    assert model.num_params() == expected
    assert tinygpt(**shape).d_head == shape["d_model"] // shape["n_head"]


def test_architecture_spec():
    m = TinyGPT(tinygpt(**SMALL))
    a = m.attentions[0]
    assert a.qkv.bias is None and a.proj.bias is None
    mlp = m.blocks[0].mlp
    assert mlp[0].out_features == 256 and mlp[0].bias is not None
    assert isinstance(mlp[1], torch.nn.GELU)
    assert m.head.bias is None


def test_tied_head_shares_storage():
    m = TinyGPT(tinygpt(**SMALL))
    assert m.head.weight is m.tok_emb.weight
    assert m.head.weight.data_ptr() == m.tok_emb.weight.data_ptr()
    untied = TinyGPT(tinygpt(**{**SMALL, "tie_weights": False}))
    assert untied.head.weight.data_ptr() != untied.tok_emb.weight.data_ptr()
    assert untied.num_params() == 425_984 + 1200 * 128


def test_init_stds():
    torch.manual_seed(0)
    m = TinyGPT(tinygpt(**LARGE))
    resid = 0.02 / math.sqrt(2 * 2)
    checks = {
        "tok_emb.weight": 0.02,
        "pos_emb.weight": 0.02,
        "blocks.0.attn.qkv.weight": 0.02,
        "blocks.1.mlp.0.weight": 0.02,
        "blocks.0.attn.proj.weight": resid,
        "blocks.1.attn.proj.weight": resid,
        "blocks.0.mlp.2.weight": resid,
        "blocks.1.mlp.2.weight": resid,
    }
    params = dict(m.named_parameters())
    for name, std in checks.items():
        w = params[name].detach()
        assert abs(w.mean().item()) < 0.1 * std, name
        assert w.std().item() == pytest.approx(std, rel=0.05), name
    for name, p in params.items():
        if name.endswith(".bias"):
            assert (p == 0).all(), name
        if ".ln" in name or name.startswith("ln_f"):
            assert (p == (1 if name.endswith("weight") else 0)).all(), name


def test_same_seed_same_state_dict():
    a, b = make(seed=3), make(seed=3)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = make(seed=4)
    assert not torch.equal(sa["blocks.0.attn.qkv.weight"], c.state_dict()["blocks.0.attn.qkv.weight"])


def test_causal_future_token_does_not_change_past_logits():
    m = make()
    x = tokens(T=10)
    y = x.clone()
    y[:, 6] = (y[:, 6] + 1) % 50
    with torch.no_grad():
        lx, _ = m(x)
        ly, _ = m(y)
    assert torch.equal(lx[:, :6], ly[:, :6])
    assert not torch.allclose(lx[:, 6:], ly[:, 6:])


def test_non_causal_model_sees_the_future():
    m = make(causal=False)
    x = tokens(T=10)
    y = x.clone()
    y[:, 6] = (y[:, 6] + 1) % 50
    with torch.no_grad():
        assert not torch.allclose(m(x)[0][:, :6], m(y)[0][:, :6])


def test_loss_ignores_minus_100():
    m = make()
    x = tokens(T=8)
    t = x.clone()
    with torch.no_grad():
        logits, full = m(x, t)
        t2 = t.clone()
        t2[:, :4] = -100
        _, part = m(x, t2)
        ref = torch.nn.functional.cross_entropy(logits[:, 4:].flatten(0, 1), t[:, 4:].flatten())
    torch.testing.assert_close(part, ref)
    assert not torch.isclose(part, full)


def test_record_fills_last():
    m = make()
    assert all(a.last is None for a in m.attentions)
    m.set_record(True)
    with torch.no_grad():
        m(tokens(B=2, T=10))
    for a in m.attentions:
        assert set(a.last) == {"weights", "logits", "q", "k"}
        assert a.last["weights"].shape == (2, 2, 10, 10)
        assert a.last["logits"].shape == (2, 2, 10, 10)
        assert a.last["q"].shape == (2, 2, 10, 8)
        torch.testing.assert_close(a.last["weights"].sum(-1), torch.ones(2, 2, 10))
    m.set_record(False)
    assert all(a.last is None for a in m.attentions)


def test_longer_than_block_size_raises():
    m = make()
    with pytest.raises(ValueError, match="block_size"):
        m(tokens(T=13))
    m(tokens(T=12))  # exactly block_size is fine


def test_invalid_config_rejected():
    with pytest.raises(ConfigError, match="d_model"):
        TinyGPT(tinygpt(**{**TINY, "d_model": 15}))
    with pytest.raises(ConfigError, match="bug"):
        TinyGPT(tinygpt(**{**TINY, "bug": "nope"}))
    with pytest.raises(ConfigError, match="impl"):
        TinyGPT(tinygpt(**{**TINY, "impl": "my_attention:attn", "bug": "mask_zero"}))
    with pytest.raises(ConfigError, match="impl"):
        TinyGPT(tinygpt(**{**TINY, "impl": "fused"}))  # the SDPA kernel is attention.impl's job now


def test_generate_greedy_and_seeded():
    m = make()
    prompt = tokens(B=1, T=3)
    g1 = generate(m, prompt, 15, temperature=0)  # longer than block_size: context is cropped
    g2 = generate(m, prompt, 15, temperature=0)
    assert g1.shape == (1, 18) and torch.equal(g1[:, :3], prompt)
    assert torch.equal(g1, g2)
    s1 = generate(m, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(123)  # the global RNG must not matter
    s2 = generate(m, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(s1, s2)
    s3 = generate(m, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(s1, s3)
    k1 = generate(m, prompt, 10, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(1))
    assert torch.equal(k1, generate(m, prompt, 10, temperature=0))


# ---------------------------------------------------------------- d_qk: the q/k width apart from the value width

def test_d_qk_equal_to_d_head_is_null_and_the_same_model():
    """A d_qk equal to d_head is stored as null (one place: ModelConfig.__post_init__): same config, same
    parameter count, same weights from the same seed, same outputs."""
    for shape, expected in ((SMALL, 425_984), (LARGE, 1_376_256)):
        d_head = shape["d_model"] // shape["n_head"]
        cfg = tinygpt(**shape, d_qk=d_head)
        assert cfg.d_qk is None and cfg == tinygpt(**shape, d_qk=None) and cfg.d_k == d_head
        assert TinyGPT(cfg).num_params() == expected
    a, b = make(seed=3, d_qk=8), make(seed=3, d_qk=None)  # TINY: d_model 16, 2 heads, d_head 8
    x = tokens()
    assert torch.equal(a(x)[0], b(x)[0])


@pytest.mark.parametrize("fused", [True, False])
def test_d_qk_changes_only_the_q_k_width(fused):
    """q and k d_qk wide per head, v d_head wide; only the q and k projections change size; the scores are
    divided by sqrt(d_qk)."""
    base = dict(LARGE, fused_qkv=fused)
    m = TinyGPT(tinygpt(**base, d_qk=32)).eval()
    full = TinyGPT(tinygpt(**base)).eval()
    assert full.num_params() - m.num_params() == 2 * 2 * 256 * (256 - 32)  # 2 layers x (q, k) x d_model x width
    a = m.attentions[0]
    q, k, v = a.project(torch.randn(2, 5, 256))
    assert q.shape == k.shape == (2, 1, 5, 32) and v.shape == (2, 1, 5, 256)
    m.set_record(True)
    x = tokens(vocab=1200)
    m(x)
    last = m.attentions[0].last
    assert torch.allclose(last["logits"], last["q"] @ last["k"].transpose(-2, -1) / math.sqrt(32), atol=1e-5)
    assert m.cfg.d_k == 32 and m.cfg.d_head == 256


def test_d_qk_multi_head_and_qk_norm_and_checkpoint(tmp_path):
    m = make(seed=0, d_qk=4, n_head=2, qk_norm="layernorm")  # TINY: d_head 8, q/k 4 wide
    assert m.attentions[0].q_norm.normalized_shape == (4,)
    logits, loss = m(tokens(), tokens(seed=1))
    assert logits.shape == (2, 10, 50) and torch.isfinite(loss)
    import dataclasses

    from attnrepro.model.transformer import load_checkpoint

    torch.save({"model_config": dataclasses.asdict(m.cfg), "state_dict": m.state_dict()}, tmp_path / "m.pt")
    assert torch.equal(load_checkpoint(tmp_path / "m.pt")(tokens())[0], m(tokens())[0])
    old = {k: v for k, v in dataclasses.asdict(make().cfg).items() if k != "d_qk"}  # a checkpoint from before d_qk
    torch.save({"model_config": old, "state_dict": make().state_dict()}, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt").cfg.d_qk is None


def test_d_qk_invalid_rejected():
    with pytest.raises(ConfigError, match="d_qk"):
        TinyGPT(tinygpt(**{**TINY, "d_qk": 0}))


def test_kv_cache_with_a_narrower_key():
    from attnrepro.model.kv import generate_cached, make_caches

    torch.manual_seed(0)
    m = TinyGPT(tinygpt(**{**TINY, "block_size": 16, "d_qk": 4})).eval()
    caches = make_caches(m, 2)
    assert caches[0].k.shape[-1] == 4 and caches[0].v.shape[-1] == 8
    prompt = tokens(T=4)
    assert torch.equal(generate_cached(m, prompt, 6), generate(m, prompt, 6, temperature=0.0))
