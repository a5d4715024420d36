"""`attnrepro kv`: the KV-cache (eq. 1.20) and attention-matrix (eq. 1.45) memory of any decoder
(attnrepro.model.kv_accounting); prints a table, or JSON with --json.

    attnrepro kv --preset llama2-70b-gqa --seq 4096
    attnrepro kv --layers 80 --kv-heads 8 --d-head 128 --dtype fp16 --seq 4096 --batch 1
"""

from __future__ import annotations

import argparse
import decimal
import json
import sys
from dataclasses import asdict, replace

from attnrepro.config import ArgumentParser, ConfigError, UserError
from attnrepro.model.kv_accounting import DTYPE_BYTES, PRESETS, Shape, format_table, preset, summary

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
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
