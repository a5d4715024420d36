"""DVC stage `kv_cache`: KV-cache memory (eq. 1.20-1.21, §1.8.8) and a real cache for TinyGPT.

1. Formula figures for the presets (Llama-2-70B shape as MHA/GQA/MQA, the two TinyGPT
   configs) and the attention-matrix cases of eq. 1.45 / §1.11.5.
2. A preallocated KV cache on a TinyGPT with a long block (kv_cache.model; untrained
   weights, initialized with `seed`: timing and token identity do not need training):
   allocated bytes vs the formula, greedy and sampled generation with and without the
   cache (must be token-identical), and the per-token latency against context length.
   On CUDA also torch.cuda.memory_allocated before/after building the cache.

Outputs: metrics/kv_cache.json (latency figures are timings: they vary run to run),
metrics/env/kv_cache.json, plots/kv_cache/latency.csv and latency.png.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from attnrepro import kv_cache as kvc
from attnrepro import memory
from attnrepro.kv_cache import KVCacheConfig
from attnrepro.config import ConfigError, load_section, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import write_csv, write_json
from attnrepro.model import TinyGPT, generate
from attnrepro.figures import kv_latency_figure
from attnrepro.runtime import progress, resolve_device


def preset_section(cfg: KVCacheConfig) -> dict:
    out = {}
    for name in cfg.presets:
        shape = memory.preset(name)
        row = {"n_layer": shape.n_layer, "n_head": shape.n_head, "n_kv_head": shape.n_kv_head,
               "d_head": shape.d_head, "bytes_per_elem": shape.bytes_per_elem,
               "kv_bytes_per_token": shape.kv_bytes_per_token(), "kv_mb_per_token": shape.kv_bytes_per_token() / 1e6}
        for n in cfg.seq_lens:
            row[f"kv_bytes_n{n}"] = shape.kv_bytes(n)
            row[f"kv_gb_n{n}"] = shape.kv_bytes(n) / 1e9
            row[f"attn_matrix_gb_n{n}"] = shape.attn_matrix_bytes(n) / 1e9
        out[name.replace("-", "_")] = row
    return out


def matrix_section(cfg: KVCacheConfig) -> dict:
    out = {}
    for name, c in cfg.attn_matrix.items():
        b = memory.attention_matrix_bytes(c.seq, c.heads, c.layers, memory.dtype_bytes(c.dtype))
        out[f"{name}_bytes"] = b
        out[f"{name}_gb"] = b / 1e9
    return out


def identity_section(cfg: KVCacheConfig, model: TinyGPT, device: str) -> dict:
    g = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(cfg.vocab_size, (cfg.cache_batch, cfg.identity_prompt), generator=g).to(device)
    greedy_ref = generate(model, prompt, cfg.identity_tokens, temperature=0)
    greedy_kv = kvc.generate_cached(model, prompt, cfg.identity_tokens, temperature=0)
    gens = [torch.Generator(device=device).manual_seed(cfg.seed) for _ in range(2)]
    samp_ref = generate(model, prompt, cfg.identity_tokens, temperature=cfg.sample_temperature, generator=gens[0])
    samp_kv = kvc.generate_cached(model, prompt, cfg.identity_tokens, temperature=cfg.sample_temperature,
                                  generator=gens[1])
    # logits of the whole generated sequence, one pass vs token by token through the cache
    with torch.no_grad():
        full, _ = model(greedy_ref)
        caches = kvc.make_caches(model, cfg.cache_batch, greedy_ref.shape[1])
        steps = [model(greedy_ref[:, :cfg.identity_prompt], kv_caches=caches)[0]]
        for t in range(cfg.identity_prompt, greedy_ref.shape[1]):
            steps.append(model(greedy_ref[:, t:t + 1], kv_caches=caches)[0])
        stepped = torch.cat(steps, dim=1)
    return {"tokens": cfg.identity_tokens, "batch": cfg.cache_batch,
            "greedy_identical": int(torch.equal(greedy_ref, greedy_kv)),
            "sample_identical": int(torch.equal(samp_ref, samp_kv)),
            "greedy_mismatches": int((greedy_ref != greedy_kv).sum()),
            "logits_max_abs_diff": float((full - stepped).abs().max())}


def cache_section(cfg: KVCacheConfig, model: TinyGPT, device: str) -> dict:
    mc = model.cfg
    caches = kvc.make_caches(model, cfg.cache_batch, mc.block_size)
    elem = caches[0].k.element_size()
    measured, formula = kvc.caches_nbytes(caches), kvc.formula_nbytes(model, cfg.cache_batch, mc.block_size, elem)
    out = {"n_layer": mc.n_layer, "n_head": mc.n_head, "d_head": mc.d_head, "max_len": mc.block_size,
           "batch": cfg.cache_batch, "bytes_per_elem": elem, "nbytes_measured": measured,
           "nbytes_formula": formula, "match": int(measured == formula)}
    del caches
    if device.startswith("cuda"):
        cu = kvc.cuda_cache_alloc(model, cfg.cache_batch, mc.block_size)
        out["cuda_allocated_delta"] = cu["cuda_allocated_delta"]
        out["cuda_delta_minus_formula"] = cu["cuda_allocated_delta"] - formula
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    ap.add_argument("--device", help="override kv_cache.device (cpu, cuda, cuda:N, auto)")
    ap.add_argument("--out-root", default=".", help="write metrics/ and plots/ under this folder (default: .)")
    args = ap.parse_args()
    cfg = load_section(KVCacheConfig, "kv_cache", args.params)
    device = resolve_device(args.device or cfg.device, "--device" if args.device else "kv_cache.device")
    setup_determinism(cfg.threads, device)
    root = Path(args.out_root)

    metrics: dict[str, dict] = preset_section(cfg)
    metrics["attn_matrix"] = matrix_section(cfg)

    torch.manual_seed(cfg.seed)
    model = TinyGPT(cfg.model_config()).to(device).eval()
    metrics["cache"] = cache_section(cfg, model, device)
    metrics["generation"] = identity_section(cfg, model, device)

    load_start = os.getloadavg()[0]
    rows = []
    bar = progress(len(cfg.contexts), "kv_cache latency")
    for n in cfg.contexts:
        rows.append(kvc.step_latency(model, n, reps=cfg.reps, warmup=cfg.warmup, seed=cfg.seed))
        bar.update(1)
    bar.close()
    lat = {"reps": cfg.reps, "warmup": cfg.warmup, "cuda": int(device.startswith("cuda")),
           "torch_threads": torch.get_num_threads(), "load_avg_1m_start": load_start}
    for r in rows:
        lat[f"uncached_ms_n{r['context']}"] = r["uncached_ms"]
        lat[f"cached_ms_n{r['context']}"] = r["cached_ms"]
        lat[f"speedup_n{r['context']}"] = r["uncached_ms"] / r["cached_ms"]
        r["speedup"] = r["uncached_ms"] / r["cached_ms"]
    for cached in (False, True):
        kvc.generation_time(model, cfg.gen_prompt, min(8, cfg.gen_tokens), cached=cached, seed=cfg.seed)  # warm-up
    t_plain = kvc.generation_time(model, cfg.gen_prompt, cfg.gen_tokens, cached=False, seed=cfg.seed)
    t_cache = kvc.generation_time(model, cfg.gen_prompt, cfg.gen_tokens, cached=True, seed=cfg.seed)
    lat.update({"gen_tokens": cfg.gen_tokens, "gen_uncached_s": t_plain, "gen_cached_s": t_cache,
                "gen_speedup": t_plain / t_cache})
    metrics["latency"] = lat

    if not metrics["cache"]["match"]:
        raise ConfigError("kv_cache: allocated cache bytes differ from eq. 1.20 (a bug in kv_cache.py)")
    mc = model.cfg
    write_csv(root / "plots/kv_cache/latency.csv", rows, ["context", "uncached_ms", "cached_ms", "speedup"])
    kv_latency_figure(rows, root / "plots/kv_cache/latency.png",
                      f"TinyGPT {mc.n_layer}L d_model {mc.d_model} {mc.n_head} head(s), untrained, batch 1, "
                      f"{device} ({torch.get_num_threads()} threads)" if device == "cpu" else
                      f"TinyGPT {mc.n_layer}L d_model {mc.d_model} {mc.n_head} head(s), untrained, batch 1, {device}")
    write_json(root / "metrics/kv_cache.json", metrics)
    write_json(root / "metrics/env/kv_cache.json", environment(device))
    last = rows[-1]
    print(f"kv_cache: cache {metrics['cache']['nbytes_measured']:,} B (formula {metrics['cache']['nbytes_formula']:,}); "
          f"greedy identical {metrics['generation']['greedy_identical']}, sampled {metrics['generation']['sample_identical']}; "
          f"context {last['context']}: {last['uncached_ms']:.2f} ms -> {last['cached_ms']:.2f} ms per token; "
          f"{cfg.gen_tokens} tokens {t_plain:.2f} s -> {t_cache:.2f} s")


if __name__ == "__main__":
    run_stage(main)
