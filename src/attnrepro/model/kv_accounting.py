"""KV-cache and attention-matrix memory accounting (§1.8.7-1.8.8, §1.11.5, eq. 1.20, 1.45), without torch
(so `attnrepro kv` answers at once).

    KV cache bytes       = 2 * n_layer * n_kv_head * d_head * seq_len * bytes * batch   (eq. 1.20)
    attention matrices   = seq_len^2 * n_head * n_layer * bytes * batch                  (eq. 1.45)

MHA has n_kv_head = n_head, GQA with g groups n_kv_head = g, MQA n_kv_head = 1.
"MB"/"GB" in the chapter are decimal (10^6 / 10^9 bytes): 2,621,440 B = 2.6 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnrepro.config import ConfigError

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
