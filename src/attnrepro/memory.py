"""KV-cache and attention-matrix memory accounting (§1.8.7-1.8.8, §1.11.5, eq. 1.20, 1.45).

    KV cache bytes       = 2 * n_layer * n_kv_head * d_head * seq_len * bytes * batch   (eq. 1.20)
    attention matrices   = seq_len^2 * n_head * n_layer * bytes * batch                  (eq. 1.45)

MHA has n_kv_head = n_head, GQA with g groups n_kv_head = g, MQA n_kv_head = 1.
"MB"/"GB" in the chapter are decimal (10^6 / 10^9 bytes): 2,621,440 B = 2.6 MB.

Command line (prints a table; --json for machine-readable output):

    python -m attnrepro.memory --preset llama2-70b-gqa --seq 4096
    python -m attnrepro.memory --layers 80 --kv-heads 8 --d-head 128 --dtype fp16 --seq 4096 --batch 1
"""

from __future__ import annotations

import argparse
import decimal
import json
from dataclasses import asdict, dataclass, replace

from .config import ArgumentParser, ConfigError
from .stage import run_stage

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


MAX_COUNT = 10**15  # sizes beyond this are typos (and their byte counts would not fit a float)


def count(text: str) -> int:
    """An argparse type: a positive integer up to 1e15, written 4096, 4_096 or 4.096e3."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        try:
            d = decimal.Decimal(text)
            value = int(d) if d.is_finite() and d == d.to_integral_value() and abs(d) <= MAX_COUNT else None
        except decimal.InvalidOperation:
            value = None
    if value is None or not 0 < value <= MAX_COUNT:
        shown = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"got {shown!r}, expected a positive integer up to 1e15")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="attnrepro kv",
        description="KV-cache (eq. 1.20) and attention-matrix (eq. 1.45) memory of a decoder. "
                    "Give --preset, or the shape; explicit options override the preset.",
        epilog="presets: " + ", ".join(f"{k} ({v.n_layer}L {v.n_head}/{v.n_kv_head} heads d{v.d_head} {v.dtype})"
                                       for k, v in PRESETS.items()))
    ap.add_argument("--preset", help="a named shape: " + ", ".join(PRESETS))
    ap.add_argument("--layers", type=count, help="number of layers")
    ap.add_argument("--heads", type=count, help="query heads (default: --kv-heads); sets the attention-matrix size")
    ap.add_argument("--kv-heads", type=count, help="K/V heads: = heads for MHA, groups for GQA, 1 for MQA")
    ap.add_argument("--d-head", type=count, help="dimension per head")
    ap.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="element type of the cache")
    ap.add_argument("--seq", type=count, default=4096, help="sequence length (default 4096; at most 1e15)")
    ap.add_argument("--batch", type=count, default=1, help="batch size (default 1)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    return ap


def shape_from_args(args) -> Shape:
    if args.preset:
        base = preset(args.preset)
    else:
        missing = [f"--{n}" for n, v in (("layers", args.layers), ("kv-heads", args.kv_heads),
                                          ("d-head", args.d_head), ("dtype", args.dtype)) if v is None]
        if missing:
            raise ConfigError(f"{', '.join(missing)}: required without --preset")
        base = Shape(args.layers, args.heads or args.kv_heads, args.kv_heads, args.d_head, args.dtype)
    over = {k: v for k, v in (("n_layer", args.layers), ("n_head", args.heads), ("n_kv_head", args.kv_heads),
                              ("d_head", args.d_head), ("dtype", args.dtype)) if v is not None}
    if args.preset and "n_kv_head" in over and "n_head" not in over and over["n_kv_head"] > base.n_head:
        over["n_head"] = over["n_kv_head"]
    shape = replace(base, **over)
    shape.validate()
    return shape


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shape = shape_from_args(args)
    if args.json:
        print(json.dumps({"shape": asdict(shape), "seq": args.seq, "batch": args.batch,
                          **summary(shape, args.seq, args.batch)}, indent=2))
    else:
        print(format_table(shape, args.seq, args.batch))
    return 0


if __name__ == "__main__":
    run_stage(main)
