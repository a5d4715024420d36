"""A preallocated KV cache for TinyGPT generation (§1.8.7); its memory is eq. 1.20
(attnrepro.model.kv_accounting, which `attnrepro kv` prints for any decoder's shape).
`TinyGPT.forward(idx, kv_caches=[one cache per layer])` calls
`cache.append(k, v)` with k, v of shape (B, H, T_new, d_head) and attends over
what it returns; it reads `kv_caches[0].length` as the position offset. The
cache allocates (B, H, max_len, d_head) for K and for V once, so its memory is
exactly eq. 1.20 with seq_len = max_len, and a decoding step costs O(context)
instead of re-running the whole prefix (O(context^2) attention + O(context) MLP).
The `kv_cache` experiment (its params, timings and metrics) is attnrepro.experiments.kv_cache.
"""

from __future__ import annotations

from typing import Optional

import torch

from attnrepro.model.kv_accounting import kv_cache_bytes
from attnrepro.model.transformer import TinyGPT, sample_next


class KVCache:
    """K and V of one layer for positions 0..length-1, in preallocated buffers."""

    def __init__(self, batch: int, n_head: int, max_len: int, d_head: int, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", d_k: Optional[int] = None):
        """d_k: the width of K where it differs from V's d_head (ModelConfig.d_qk); None: d_head."""
        d_k = d_head if d_k is None else d_k
        if min(batch, n_head, max_len, d_head, d_k) <= 0:
            raise ValueError("KVCache sizes must be positive")
        self.k = torch.zeros(batch, n_head, max_len, d_k, dtype=dtype, device=device)
        self.v = torch.zeros(batch, n_head, max_len, d_head, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions; return K, V of all positions so far (views, no copy)."""
        B, H, T, D = k.shape
        if (B, H, D) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]) or \
                v.shape != (B, H, T, self.v.shape[3]):
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
    return [KVCache(batch, cfg.n_head, max_len, cfg.d_head, dtype=dtype or p.dtype, device=p.device, d_k=cfg.d_k)
            for _ in range(cfg.n_layer)]


def caches_nbytes(caches: list[KVCache]) -> int:
    return sum(c.nbytes for c in caches)


def formula_nbytes(model: TinyGPT, batch: int, max_len: int, bytes_per_elem: int) -> int:
    cfg = model.cfg  # eq. 1.20 counts K and V of width d_head; with d_qk, K is d_k wide: half of each
    return (kv_cache_bytes(cfg.n_layer, cfg.n_head, cfg.d_head, max_len, bytes_per_elem, batch)
            + kv_cache_bytes(cfg.n_layer, cfg.n_head, cfg.d_k, max_len, bytes_per_elem, batch)) // 2


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

