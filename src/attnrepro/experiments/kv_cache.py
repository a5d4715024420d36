"""KV-cache memory (eq. 1.20-1.21, §1.8.8) and a real cache for TinyGPT: the `kv_cache` experiment.

Formula figures for the memory presets and the attention-matrix cases; then, on an
untrained TinyGPT (attnrepro.model.kv's preallocated cache), the allocated bytes against
the formula, token identity of generation with and without the cache, and the per-token
latency against context length (timed with attnrepro.measure.timing.measure).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from attnrepro.config import ConfigError, from_dict, require, require_positive
from attnrepro.measure.timing import Timer, measure
from attnrepro.model import kv_accounting as kv
from attnrepro.model.kv import caches_nbytes, formula_nbytes, generate_cached, make_caches
from attnrepro.model.transformer import ModelConfig, TinyGPT, generate
from attnrepro.progress import progress


@dataclass
class MatrixCase:
    seq: int
    heads: int
    layers: int
    dtype: str


@dataclass
class KVCacheConfig:
    """params `kv_cache` (no defaults: params.yaml is the only source of values)."""

    seed: int
    threads: int
    device: str
    presets: list[str]
    seq_lens: list[int]
    attn_matrix: dict[str, MatrixCase]
    model: dict  # a ModelConfig without vocab_size (untrained TinyGPT for the cache and timings)
    vocab_size: int
    cache_batch: int
    identity_prompt: int
    identity_tokens: int
    sample_temperature: float
    contexts: list[int]
    warmup: int
    reps: int
    gen_prompt: int
    gen_tokens: int

    def validate(self, prefix: str = "kv_cache") -> None:
        require_positive(self, ("threads",), prefix)
        for p in self.presets:
            require(p in kv.PRESETS, f"{prefix}.presets", p, "one of " + ", ".join(kv.PRESETS))
        require(len(self.seq_lens) > 0 and all(n > 0 for n in self.seq_lens), f"{prefix}.seq_lens", self.seq_lens,
                "a non-empty list of positive integers")
        for name, c in self.attn_matrix.items():
            require(c.seq > 0 and c.heads > 0 and c.layers > 0, f"{prefix}.attn_matrix.{name}", c,
                    "positive seq, heads, layers")
            require(c.dtype in kv.DTYPE_BYTES, f"{prefix}.attn_matrix.{name}.dtype", c.dtype,
                    "one of " + ", ".join(kv.DTYPE_BYTES))
        require_positive(self, ("vocab_size", "cache_batch", "identity_prompt", "identity_tokens", "reps",
                                "gen_prompt", "gen_tokens"), prefix)
        require(self.warmup >= 0, f"{prefix}.warmup", self.warmup, "a non-negative integer")
        require(math.isfinite(self.sample_temperature) and self.sample_temperature > 0,
                f"{prefix}.sample_temperature", self.sample_temperature, "a finite number > 0")
        require(len(self.contexts) > 0 and min(self.contexts) > 0, f"{prefix}.contexts", self.contexts,
                "a non-empty list of positive integers")
        block = self.model_config().block_size
        for name, need in (("contexts", max(self.contexts)),
                           ("identity_tokens", self.identity_prompt + self.identity_tokens),
                           ("gen_tokens", self.gen_prompt + self.gen_tokens)):
            require(need <= block, f"{prefix}.{name}", need, f"prompt + tokens <= model.block_size ({block})")

    def model_config(self) -> ModelConfig:
        return from_dict(ModelConfig, {**self.model, "vocab_size": self.vocab_size}, prefix="kv_cache.model")


# ---------------------------------------------------------------- latency

@torch.no_grad()
def step_latency(model: TinyGPT, context: int, *, reps: int, warmup: int, seed: int = 0) -> dict:
    """Time of producing the logits of the next token when `context` tokens are known.

    uncached_ms: a forward over all `context` tokens (what model.generate does);
    cached_ms: one token through the model with the first context-1 positions
    already in a KV cache (the cache is rolled back before every repetition).
    Each is the median of `reps` timed calls after `warmup` untimed ones.
    """
    dev = str(next(model.parameters()).device)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(model.cfg.vocab_size, (1, context), generator=g).to(dev)
    caches = make_caches(model, 1, context)
    if context > 1:
        model(idx[:, :-1], kv_caches=caches)
    last = idx[:, -1:]

    def cached() -> None:
        for c in caches:
            c.truncate(context - 1)
        model(last, kv_caches=caches)

    return {"context": context,
            "uncached_ms": measure(lambda: model(idx), dev, warmup, reps, cold=False)["median_ms"],
            "cached_ms": measure(cached, dev, warmup, reps, cold=False)["median_ms"]}


@torch.no_grad()
def generation_time(model: TinyGPT, prompt_len: int, new_tokens: int, *, cached: bool, seed: int = 0) -> float:
    """Seconds to generate `new_tokens` greedily after a random prompt."""
    dev = str(next(model.parameters()).device)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(model.cfg.vocab_size, (1, prompt_len), generator=g).to(dev)
    run = generate_cached if cached else generate
    return Timer(dev)(lambda: run(model, idx, new_tokens, temperature=0)) / 1000.0


def cuda_cache_alloc(model: TinyGPT, batch: int, max_len: int) -> dict:
    """On CUDA: torch.cuda.memory_allocated before/after building the caches."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    caches = make_caches(model, batch, max_len)
    torch.cuda.synchronize()
    delta = torch.cuda.memory_allocated() - before
    out = {"cuda_allocated_delta": delta, "nbytes": caches_nbytes(caches)}
    del caches
    return out


# ---------------------------------------------------------------- the metrics' sections

def preset_section(cfg: KVCacheConfig) -> dict:
    """Eq. 1.20-1.21 for each memory preset: per token and at each of seq_lens, with the n x n matrix."""
    out = {}
    for name in cfg.presets:
        shape = kv.preset(name)
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
    """Eq. 1.45 / §1.11.5: the bytes of the attention matrices of each attn_matrix case."""
    out = {}
    for name, c in cfg.attn_matrix.items():
        b = kv.attention_matrix_bytes(c.seq, c.heads, c.layers, kv.dtype_bytes(c.dtype))
        out[f"{name}_bytes"] = b
        out[f"{name}_gb"] = b / 1e9
    return out


def identity_section(cfg: KVCacheConfig, model: TinyGPT, device: str) -> dict:
    """Greedy and sampled generation with and without the cache (token identity), and the logits
    of the whole sequence in one pass against token by token through the cache."""
    g = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(cfg.vocab_size, (cfg.cache_batch, cfg.identity_prompt), generator=g).to(device)
    greedy_ref = generate(model, prompt, cfg.identity_tokens, temperature=0)
    greedy_kv = generate_cached(model, prompt, cfg.identity_tokens, temperature=0)
    gens = [torch.Generator(device=device).manual_seed(cfg.seed) for _ in range(2)]
    samp_ref = generate(model, prompt, cfg.identity_tokens, temperature=cfg.sample_temperature, generator=gens[0])
    samp_kv = generate_cached(model, prompt, cfg.identity_tokens, temperature=cfg.sample_temperature,
                              generator=gens[1])
    # logits of the whole generated sequence, one pass vs token by token through the cache
    with torch.no_grad():
        full, _ = model(greedy_ref)
        caches = make_caches(model, cfg.cache_batch, greedy_ref.shape[1])
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
    """The allocated cache of the whole block against eq. 1.20 (on CUDA also the allocator's delta)."""
    mc = model.cfg
    caches = make_caches(model, cfg.cache_batch, mc.block_size)
    elem = caches[0].k.element_size()
    measured, formula = caches_nbytes(caches), formula_nbytes(model, cfg.cache_batch, mc.block_size, elem)
    out = {"n_layer": mc.n_layer, "n_head": mc.n_head, "d_head": mc.d_head, "max_len": mc.block_size,
           "batch": cfg.cache_batch, "bytes_per_elem": elem, "nbytes_measured": measured,
           "nbytes_formula": formula, "match": int(measured == formula)}
    del caches
    if device.startswith("cuda"):
        cu = cuda_cache_alloc(model, cfg.cache_batch, mc.block_size)
        out["cuda_allocated_delta"] = cu["cuda_allocated_delta"]
        out["cuda_delta_minus_formula"] = cu["cuda_allocated_delta"] - formula
    return out


def latency_section(cfg: KVCacheConfig, model: TinyGPT, device: str) -> tuple[dict, list[dict]]:
    """Per-token latency at each context with and without the cache, and whole-generation time:
    the metrics' `latency` section and the rows of plots/kv_cache/latency.csv."""
    load_start = os.getloadavg()[0]
    rows = []
    bar = progress(len(cfg.contexts), "kv_cache latency")
    for n in cfg.contexts:
        rows.append(step_latency(model, n, reps=cfg.reps, warmup=cfg.warmup, seed=cfg.seed))
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
        generation_time(model, cfg.gen_prompt, min(8, cfg.gen_tokens), cached=cached, seed=cfg.seed)  # warm-up
    t_plain = generation_time(model, cfg.gen_prompt, cfg.gen_tokens, cached=False, seed=cfg.seed)
    t_cache = generation_time(model, cfg.gen_prompt, cfg.gen_tokens, cached=True, seed=cfg.seed)
    lat.update({"gen_tokens": cfg.gen_tokens, "gen_uncached_s": t_plain, "gen_cached_s": t_cache,
                "gen_speedup": t_plain / t_cache})
    return lat, rows


# ---------------------------------------------------------------- the experiment

ROW_COLUMNS = ["context", "uncached_ms", "cached_ms", "speedup"]  # plots/kv_cache/latency.csv


@dataclass
class KVCacheResult:
    metrics: dict  # metrics/kv_cache.json
    rows: list[dict]  # per context: uncached_ms, cached_ms, speedup
    title: str  # the latency figure's title

    def lines(self) -> list[str]:
        m, last, lat = self.metrics, self.rows[-1], self.metrics["latency"]
        return [f"kv_cache: cache {m['cache']['nbytes_measured']:,} B (formula {m['cache']['nbytes_formula']:,}); "
                f"greedy identical {m['generation']['greedy_identical']}, sampled {m['generation']['sample_identical']}; "
                f"context {last['context']}: {last['uncached_ms']:.2f} ms -> {last['cached_ms']:.2f} ms per token; "
                f"{lat['gen_tokens']} tokens {lat['gen_uncached_s']:.2f} s -> {lat['gen_cached_s']:.2f} s"]


def run(cfg: KVCacheConfig, device: str) -> KVCacheResult:
    """Every section of metrics/kv_cache.json on `device` (resolved, determinism set); an allocated
    cache that differs from eq. 1.20 is an error."""
    metrics: dict[str, dict] = preset_section(cfg)
    metrics["attn_matrix"] = matrix_section(cfg)

    torch.manual_seed(cfg.seed)
    model = TinyGPT(cfg.model_config()).to(device).eval()
    metrics["cache"] = cache_section(cfg, model, device)
    metrics["generation"] = identity_section(cfg, model, device)
    metrics["latency"], rows = latency_section(cfg, model, device)

    if not metrics["cache"]["match"]:
        raise ConfigError("kv_cache: allocated cache bytes differ from eq. 1.20 (a bug in kv_cache.py)")
    mc = model.cfg
    title = f"TinyGPT {mc.n_layer}L d_model {mc.d_model} {mc.n_head} head(s), untrained, batch 1, {device}"
    if device == "cpu":
        title += f" ({torch.get_num_threads()} threads)"
    return KVCacheResult(metrics, rows, title)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    if not metrics:
        return ""
    out = []
    c, gen = metrics.get("cache", {}), metrics.get("generation", {})
    if c:
        out.append(f"A real cache for the large TinyGPT allocates {c['nbytes_measured']:,} bytes, "
                   f"{'exactly' if c.get('match') else 'not'} what the formula gives ({c['nbytes_formula']:,})")
    if gen:
        out.append(f"generation with and without it gives {'identical' if gen.get('greedy_identical') else 'different'} "
                   f"greedy tokens ({gen.get('greedy_mismatches')} mismatches)")
    shapes = [(k.rsplit("_", 1)[-1].upper(), v) for k, v in sorted(metrics.items()) if k.startswith("llama2_70b_")]
    if shapes:
        out.append("at the Llama-2-70B shape the cache takes " + ", ".join(
            f"{v['kv_bytes_per_token'] / 1e6:.3g} MB per token ({v['kv_gb_n4096']:.3g} GB at 4096) with {name}"
            for name, v in shapes))
    return ("; ".join(out) + ".") if out else ""
