"""The KV cache (§1.8.7) and its memory accounting (§1.8.7-1.8.8, §1.11.5, eq. 1.20, 1.45).

    KV cache bytes       = 2 * n_layer * n_kv_head * d_head * seq_len * bytes * batch   (eq. 1.20)
    attention matrices   = seq_len^2 * n_head * n_layer * bytes * batch                  (eq. 1.45)

MHA has n_kv_head = n_head, GQA with g groups n_kv_head = g, MQA n_kv_head = 1.
"MB"/"GB" in the chapter are decimal (10^6 / 10^9 bytes): 2,621,440 B = 2.6 MB.

`TinyGPT.forward(idx, kv_caches=[one cache per layer])` calls
`cache.append(k, v)` with k, v of shape (B, H, T_new, d_head) and attends over
what it returns; it reads `kv_caches[0].length` as the position offset. The
cache allocates (B, H, max_len, d_head) for K and for V once, so its memory is
exactly eq. 1.20 with seq_len = max_len, and a decoding step costs O(context)
instead of re-running the whole prefix (O(context^2) attention + O(context) MLP).
The `kv_cache` experiment (its params, timings and metrics) is attnrepro.experiments.kv_cache.
`attnrepro kv` (attnrepro.commands.kv_calculator) prints the accounting for any decoder's shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attnrepro.config import ConfigError
from attnrepro.model.transformer import TinyGPT, sample_next

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype: got {dtype!r}, expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def kv_cache_bytes(n_layer: int, n_kv_head: int, d_head: int, seq_len: int, bytes_per_elem: int,
                   batch: int = 1) -> int:
    """Eq. 1.20: K and V for every layer, KV head, position and sequence of the batch."""
    return 2 * n_layer * n_kv_head * d_head * seq_len * bytes_per_elem * batch


def attention_matrix_bytes(seq_len: int, n_head: int, n_layer: int, bytes_per_elem: int,
                           batch: int = 1) -> int:
    """Eq. 1.45: one n x n weight matrix per head and layer, all kept (as for backward)."""
    return seq_len * seq_len * n_head * n_layer * bytes_per_elem * batch


@dataclass(frozen=True)
class Shape:
    """The cache-relevant shape of a decoder: query heads, KV heads, head size, dtype."""

    n_layer: int
    n_head: int
    n_kv_head: int
    d_head: int
    dtype: str

    def validate(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "d_head"):
            val = getattr(self, name)
            if not isinstance(val, int) or val <= 0:
                raise ConfigError(f"{name}: got {val!r}, expected a positive integer")
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"n_kv_head: got {self.n_kv_head}, expected a divisor of n_head ({self.n_head})")
        dtype_bytes(self.dtype)

    @property
    def kind(self) -> str:
        if self.n_kv_head == self.n_head:
            return "MHA"
        return "MQA" if self.n_kv_head == 1 else "GQA"

    @property
    def bytes_per_elem(self) -> int:
        return dtype_bytes(self.dtype)

    def kv_bytes_per_token(self) -> int:
        return kv_cache_bytes(self.n_layer, self.n_kv_head, self.d_head, 1, self.bytes_per_elem)

    def kv_bytes(self, seq_len: int, batch: int = 1) -> int:
        return kv_cache_bytes(self.n_layer, self.n_kv_head, self.d_head, seq_len, self.bytes_per_elem, batch)

    def attn_matrix_bytes(self, seq_len: int, batch: int = 1) -> int:
        return attention_matrix_bytes(seq_len, self.n_head, self.n_layer, self.bytes_per_elem, batch)


PRESETS: dict[str, Shape] = {
    # Llama-2-70B shape as the chapter uses it: 80 layers, 64 query heads, d_head 128, fp16
    "llama2-70b-mha": Shape(80, 64, 64, 128, "fp16"),
    "llama2-70b-gqa": Shape(80, 64, 8, 128, "fp16"),  # the real model: 8 KV groups
    "llama2-70b-mqa": Shape(80, 64, 1, 128, "fp16"),
    # the chapter's TinyGPT configurations (train.models in params.yaml), fp32
    "tinygpt-small": Shape(2, 4, 4, 32, "fp32"),
    "tinygpt-large": Shape(2, 1, 1, 256, "fp32"),
}


def preset(name: str) -> Shape:
    if name not in PRESETS:
        raise ConfigError(f"--preset: got {name!r}, expected one of {', '.join(PRESETS)}")
    return PRESETS[name]


def summary(shape: Shape, seq_len: int, batch: int = 1) -> dict:
    """Numbers for one shape at one sequence length (bytes, plus decimal MB/GB)."""
    shape.validate()
    per_tok = shape.kv_bytes_per_token()
    kv = shape.kv_bytes(seq_len, batch)
    attn = shape.attn_matrix_bytes(seq_len, batch)
    return {
        "kv_bytes_per_token": per_tok,
        "kv_mb_per_token": per_tok / 1e6,
        "kv_bytes": kv,
        "kv_gb": kv / 1e9,
        "attn_matrix_bytes": attn,
        "attn_matrix_gb": attn / 1e9,
        "kv_reduction_vs_mha": shape.n_head / shape.n_kv_head,
    }


def _human(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{int(n)} B"


def format_table(shape: Shape, seq_len: int, batch: int) -> str:
    s = summary(shape, seq_len, batch)
    rows = [
        ("attention", f"{shape.kind}: {shape.n_head} query heads, {shape.n_kv_head} KV heads"),
        ("shape", f"{shape.n_layer} layers x d_head {shape.d_head}, {shape.dtype} ({shape.bytes_per_elem} B)"),
        ("KV cache per token", f"{s['kv_bytes_per_token']:,} B ({_human(s['kv_bytes_per_token'])})"),
        (f"KV cache, seq {seq_len}, batch {batch}", f"{s['kv_bytes']:,} B ({_human(s['kv_bytes'])}, "
                                                   f"{s['kv_bytes'] / 2**30:.3g} GiB)"),
        ("attention matrices n^2*h*L", f"{s['attn_matrix_bytes']:,} B ({_human(s['attn_matrix_bytes'])})"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


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

