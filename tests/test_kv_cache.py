"""kv_cache: a preallocated KV cache for TinyGPT, token identity, bytes == eq. 1.20."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tinygpt

from attnrepro.experiments import kv_cache as kvx
from attnrepro.model import kv as kvc
from attnrepro.model.kv_accounting import kv_cache_bytes
from attnrepro.model.transformer import TinyGPT, generate

ROOT = Path(__file__).resolve().parents[1]
# one thread: on a shared, oversubscribed CPU two OpenMP threads can be 50x slower


def tiny(impl="manual", n_head=2, block=48, seed=0) -> TinyGPT:
    torch.manual_seed(seed)
    cfg = tinygpt(vocab_size=50, block_size=block, d_model=32, n_head=n_head, n_layer=2, impl=impl)
    return TinyGPT(cfg).eval()


@pytest.mark.parametrize("n_head", [1, 2])
def test_greedy_tokens_identical_with_and_without_cache(n_head):
    model = tiny(n_head=n_head)
    prompt = torch.randint(50, (3, 5), generator=torch.Generator().manual_seed(1))
    ref = generate(model, prompt, 30, temperature=0)
    got = kvc.generate_cached(model, prompt, 30, temperature=0)
    assert torch.equal(ref, got)


def test_sampled_tokens_identical_with_same_generator():
    model = tiny()
    prompt = torch.randint(50, (2, 4), generator=torch.Generator().manual_seed(2))
    ref = generate(model, prompt, 25, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(7))
    got = kvc.generate_cached(model, prompt, 25, temperature=1.0, top_k=10,
                              generator=torch.Generator().manual_seed(7))
    assert torch.equal(ref, got)


def test_cached_logits_match_full_forward():
    model = tiny()
    idx = torch.randint(50, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, _ = model(idx)
        caches = kvc.make_caches(model, 2, 20)
        parts = [model(idx[:, :7], kv_caches=caches)[0]] + [model(idx[:, t:t + 1], kv_caches=caches)[0]
                                                             for t in range(7, 20)]
    assert torch.allclose(full, torch.cat(parts, 1), atol=1e-5)
    assert caches[0].length == 20


def test_cache_is_really_used():
    """A cache holding other keys must change the output (the model reads from it)."""
    model = tiny()
    idx = torch.randint(50, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        caches = kvc.make_caches(model, 1, 10)
        model(idx[:, :9], kv_caches=caches)
        good = model(idx[:, 9:], kv_caches=caches)[0]
        for c in caches:
            c.truncate(9)
            c.k[:, :, :9] = torch.randn_like(c.k[:, :, :9])
        bad = model(idx[:, 9:], kv_caches=caches)[0]
    assert (good - bad).abs().max() > 1e-3


@pytest.mark.parametrize("batch,max_len,dtype", [(1, 48, torch.float32), (3, 17, torch.float64),
                                                  (2, 64, torch.float16)])
def test_cache_bytes_equal_formula(batch, max_len, dtype):
    model = tiny(block=64).to(dtype)
    caches = kvc.make_caches(model, batch, max_len)
    elem = torch.tensor([], dtype=dtype).element_size()
    expect = kv_cache_bytes(2, 2, 16, max_len, elem, batch)
    assert kvc.caches_nbytes(caches) == expect == kvc.formula_nbytes(model, batch, max_len, elem)


def test_cache_errors():
    c = kvc.KVCache(1, 2, 4, 8)
    k = torch.zeros(1, 2, 3, 8)
    c.append(k, k)
    with pytest.raises(ValueError, match="full"):
        c.append(k, k)
    with pytest.raises(ValueError, match="append"):
        c.append(torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8))
    c.truncate(1)
    kk, vv = c.append(k, k)
    assert kk.shape == (1, 2, 4, 8) and c.length == 4
    with pytest.raises(ValueError, match="block_size"):
        kvc.generate_cached(tiny(block=8), torch.zeros(1, 4, dtype=torch.long), 5)


def test_step_latency_cpu():
    r = kvx.step_latency(tiny(block=64), 32, reps=2, warmup=0)
    assert r["context"] == 32 and r["cached_ms"] > 0 and r["uncached_ms"] > 0


def test_kv_cache_stage_small(tmp_path, monkeypatch):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    sec = dict(params["kv_cache"], model={**params["kv_cache"]["model"], "block_size": 64, "d_model": 32, "n_head": 2,
                                          "n_layer": 2},
               vocab_size=50, contexts=[8, 32], reps=2, warmup=0, gen_tokens=8, identity_tokens=16)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"kv_cache": sec}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["kv_cache.py", "--device", "cpu"])
    runpy.run_path(str(ROOT / "stages/kv_cache.py"), run_name="__main__")
    m = json.loads((tmp_path / "metrics/kv_cache.json").read_text())
    assert m["llama2_70b_mha"]["kv_bytes_per_token"] == 2_621_440
    assert m["cache"]["match"] == 1 and m["cache"]["nbytes_measured"] == m["cache"]["nbytes_formula"]
    assert m["generation"]["greedy_identical"] == 1 and m["generation"]["sample_identical"] == 1
    assert "cuda_allocated_delta" not in m["cache"] and m["latency"]["cuda"] == 0
    assert (tmp_path / "plots/kv_cache/latency.png").stat().st_size > 1000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_cache_allocation_matches_formula():
    model = tiny(block=256).cuda()
    r = kvx.cuda_cache_alloc(model, 2, 256)
    formula = kvc.formula_nbytes(model, 2, 256, 4)
    assert r["nbytes"] == formula
    # the caching allocator rounds each block up to 512 bytes: 2 buffers per layer
    assert formula <= r["cuda_allocated_delta"] <= formula + 2 * 2 * 512
    assert torch.equal(generate(model, torch.zeros(1, 3, dtype=torch.long, device="cuda"), 20, temperature=0),
                       kvc.generate_cached(model, torch.zeros(1, 3, dtype=torch.long, device="cuda"), 20))
