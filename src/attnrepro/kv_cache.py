"""A preallocated KV cache for TinyGPT generation (§1.8.7) and per-token latency.

`TinyGPT.forward(idx, kv_caches=[one cache per layer])` calls
`cache.append(k, v)` with k, v of shape (B, H, T_new, d_head) and attends over
what it returns; it reads `kv_caches[0].length` as the position offset. The
cache allocates (B, H, max_len, d_head) for K and for V once, so its memory is
exactly eq. 1.20 with seq_len = max_len, and a decoding step costs O(context)
instead of re-running the whole prefix (O(context^2) attention + O(context) MLP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import memory
from .benchmark import Timer, summarize
from .config import from_dict, require, require_positive
from .memory import kv_cache_bytes
from .model import ModelConfig, TinyGPT, sample_next


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
            require(p in memory.PRESETS, f"{prefix}.presets", p, "one of " + ", ".join(memory.PRESETS))
        require(len(self.seq_lens) > 0 and all(n > 0 for n in self.seq_lens), f"{prefix}.seq_lens", self.seq_lens,
                "a non-empty list of positive integers")
        for name, c in self.attn_matrix.items():
            require(c.seq > 0 and c.heads > 0 and c.layers > 0, f"{prefix}.attn_matrix.{name}", c,
                    "positive seq, heads, layers")
            require(c.dtype in memory.DTYPE_BYTES, f"{prefix}.attn_matrix.{name}.dtype", c.dtype,
                    "one of " + ", ".join(memory.DTYPE_BYTES))
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


class KVCache:
    """K and V of one layer for positions 0..length-1, in preallocated buffers."""

    def __init__(self, batch: int, n_head: int, max_len: int, d_head: int, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if min(batch, n_head, max_len, d_head) <= 0:
            raise ValueError("KVCache sizes must be positive")
        self.k = torch.zeros(batch, n_head, max_len, d_head, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions; return K, V of all positions so far (views, no copy)."""
        B, H, T, D = k.shape
        if (B, H, D) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]) or v.shape != k.shape:
            raise ValueError(f"KVCache.append: got k {tuple(k.shape)}, v {tuple(v.shape)} for a cache "
                             f"of {tuple(self.k.shape)}")
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KVCache full: {self.length} + {T} positions > max_len {self.max_len}")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def truncate(self, length: int) -> None:
        """Forget positions >= length (they are overwritten by the next append)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.truncate: {length} not in [0, {self.length}]")
        self.length = length

    @property
    def nbytes(self) -> int:
        """Bytes held by the two buffers (their storages, not just the used part)."""
        return self.k.untyped_storage().nbytes() + self.v.untyped_storage().nbytes()


def make_caches(model: TinyGPT, batch: int, max_len: Optional[int] = None, *,
                dtype: Optional[torch.dtype] = None) -> list[KVCache]:
    """One cache per layer, sized for `max_len` positions (default: block_size)."""
    cfg = model.cfg
    max_len = cfg.block_size if max_len is None else max_len
    p = next(model.parameters())
    return [KVCache(batch, cfg.n_head, max_len, cfg.d_head, dtype=dtype or p.dtype, device=p.device)
            for _ in range(cfg.n_layer)]


def caches_nbytes(caches: list[KVCache]) -> int:
    return sum(c.nbytes for c in caches)


def formula_nbytes(model: TinyGPT, batch: int, max_len: int, bytes_per_elem: int) -> int:
    cfg = model.cfg
    return kv_cache_bytes(cfg.n_layer, cfg.n_head, cfg.d_head, max_len, bytes_per_elem, batch)


@torch.no_grad()
def generate_cached(model: TinyGPT, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                    top_k: Optional[int] = None, generator: Optional[torch.Generator] = None,
                    caches: Optional[list[KVCache]] = None) -> torch.Tensor:
    """model.generate with a KV cache: prefill the prompt once, then one token per step.

    Learned positions cannot slide, so prompt + new tokens must fit in block_size
    (model.generate crops the context instead; within block_size both agree).
    """
    total = idx.shape[1] + max_new_tokens
    if total > model.cfg.block_size:
        raise ValueError(f"generate_cached: {total} tokens exceed block_size {model.cfg.block_size}")
    if max_new_tokens <= 0:
        return idx
    caches = caches if caches is not None else make_caches(model, idx.shape[0], total)
    logits, _ = model(idx, kv_caches=caches)
    out = [idx]
    for step in range(max_new_tokens):
        nxt = sample_next(logits[:, -1, :], temperature, top_k, generator)
        out.append(nxt)
        if step + 1 < max_new_tokens:
            logits, _ = model(nxt, kv_caches=caches)
    return torch.cat(out, dim=1)


# ---------------------------------------------------------------- latency

def _median_ms(fn, reps: int, warmup: int, device: str) -> float:
    """Median of `reps` timed calls after `warmup` untimed ones (attnrepro.benchmark's timer)."""
    for _ in range(warmup):
        fn()
    timer = Timer(device)
    return summarize([timer(fn) for _ in range(reps)])["median_ms"]


@torch.no_grad()
def step_latency(model: TinyGPT, context: int, *, reps: int, warmup: int, seed: int = 0) -> dict:
    """Time of producing the logits of the next token when `context` tokens are known.

    uncached_ms: a forward over all `context` tokens (what model.generate does);
    cached_ms: one token through the model with the first context-1 positions
    already in a KV cache (the cache is rolled back before every repetition).
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
            "uncached_ms": _median_ms(lambda: model(idx), reps, warmup, dev),
            "cached_ms": _median_ms(cached, reps, warmup, dev)}


@torch.no_grad()
def generation_time(model: TinyGPT, prompt_len: int, new_tokens: int, *, cached: bool, seed: int = 0) -> float:
    """Seconds to generate `new_tokens` greedily after a random prompt."""
    from .model import generate

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
