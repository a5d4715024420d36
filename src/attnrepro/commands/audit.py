"""attnrepro audit package.module:function [--json PATH] [--full] [--cost] [--time-limit S] [--device D]

Exit status: 0 the implementation passes; 1 a check fails (FAIL: the page says which and why)
or some cases could not run (INCOMPLETE); 2 bad input (a path that does not import, not
callable, another signature, a first plain call f(q, k, v) that raises or returns neither
SDPA's shape nor a permutation of it, a gated check that does not return within the time limit).

Conventions (SDPA's): is_causal aligns the mask top-left (query i sees keys j <= i, also when
L < S, as in a KV-cache decode); a bottom-right alignment is a FAIL (pass an explicit attn_mask
for it). Raise NotImplementedError for an input you do not support: those cases are reported
as not supported (not run: INCOMPLETE), never passed; any other exception (ValueError, ...) on
an input the signature allows is a FAIL naming the input and the exception's first line.
Grouped-query cases (key/value with 1 or 2 heads for the query's 4 or 6) are passed
enable_gqa=True where the signature takes it, and are reported as not supported where it does
not. Tolerance per dtype: 4 R (1 + max|logit|) (u + u_fp32 sqrt(E + S)), u = eps/2 of the dtype
(fp32 6.0e-08, fp16 4.9e-04, bf16 3.9e-03), R = max|v|.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnrepro.config import ArgumentParser, UserError
from attnrepro.files import write_json

DESCRIPTION = """\
Run the chapter's battery against an attention implementation with the signature of
torch.nn.functional.scaled_dot_product_attention (query, key, value, attn_mask=None,
dropout_p=0.0, is_causal=False, scale=None; enable_gqa=False optional) and name what is wrong:

  determinism two identical calls (dropout_p=0) agree bit for bit; dropout_p > 0 drops at
              that rate and rescales the kept weights by 1/(1 - p)
  parity      forward and backward against a float64 reference: shapes with non-powers of
              two, L != S, Ev != E; no mask, is_causal, boolean and float masks, is_causal
              with a mask, masks broadcast over heads/batch, decode; scale=None, 1 and 0.3;
              fp32, fp16, bf16 (tolerance below); grouped- and multi-query (enable_gqa)
  invariants  no influence of future keys/values on a causal row; permutation equivariance;
              rows of the weights sum to one; key and value not swapped; a fully masked
              row (SDPA returns 0)
  numerics    logits up to 3e4 in each dtype: no inf/nan where the reference has none
  scale       the logit std as d_head grows: which power of d_k divides the logits, where
  cost        (--cost) latency and peak memory against SDPA over sequence lengths;
              informational, never gated

A failure is translated into the likely cause in the chapter's terms (mask_zero,
no_stable_softmax, dk_not_sqrt, scale_after_softmax, the scale squared, a future leak at
offset k, a causal mask aligned bottom-right, a mask dropped or inverted, a finite mask fill
and its value, softmax over the wrong axis, dropout left on, key and value swapped, grouped-
query heads tiled instead of interleaved or dropped, an output transposed, an overflow above
logit L) with the smallest input that shows it; a random or transposed output is named first,
numerical-range findings after the functional ones, and a second cause only when a probe the
first does not spoil shows it. The current directory is on sys.path, so `attnrepro audit
examples.attention.chunked:chunked_attention` works from the repository root; a path to a .py
file works too (`attnrepro audit path/to/mine.py:attention`).
"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="attnrepro audit", description=DESCRIPTION, epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="package.module:function (or path/to/file.py:function) with SDPA's signature")
    p.add_argument("--json", metavar="PATH", help="also write the JSON record here")
    p.add_argument("--full", action="store_true", help="a larger parity grid (longer, wider) and fp64")
    p.add_argument("--cost", action="store_true", help="also compare latency and peak memory with SDPA at n = 256, "
                   "512, 1024 (informational; adds 4.5-10 s on 2 loaded cores)")
    p.add_argument("--time-limit", type=float, default=120.0, metavar="S",
                   help="seconds each check may take before the implementation counts as hung (default 120; "
                        "a hung cost comparison is reported and the verdict stands)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu", help="where to run (default cpu)")
    p.add_argument("--interface", choices=("sdpa", "project"), default="sdpa",
                   help="sdpa (default) or project: a function like attnrepro.model.attention.attention "
                        "(q, k, v, *, scaled, causal)")
    return p


def module_spec(target: str) -> str:
    """`path/to/file.py:function` as `file:function`, the file's folder first on sys.path (as `python file.py`
    has it); any other target unchanged."""
    module, sep, attr = target.partition(":")
    if not module.endswith(".py"):
        return target
    path = Path(module).resolve()
    if not path.is_file():
        raise UserError(f"{target}: no file {module}")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path:
        raise UserError(f"{target}: a module named {path.stem!r} is already imported from elsewhere; rename the file")
    sys.path.insert(0, str(path.parent))
    return f"{path.stem}{sep}{attr}"


def run(args) -> tuple[int, dict]:
    import torch  # here, not at the top: `attnrepro audit --help` answers without importing torch

    from attnrepro.audit.battery import battery
    from attnrepro.audit.diagnose import diagnose
    from attnrepro.audit.render import page, record
    from attnrepro.model.attention_impl import resolve

    if args.time_limit <= 0:
        raise UserError(f"--time-limit: got {args.time_limit}, expected a positive number of seconds")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: CUDA is not available here")
    t0 = time.perf_counter()
    target = resolve(module_spec(args.target), args.interface)
    results = battery(target, device, args.time_limit, args.full, args.cost)
    diag = diagnose(results)
    seconds = time.perf_counter() - t0
    env = {"torch": torch.__version__, "device": device, "threads": torch.get_num_threads()}
    sys.stdout.write(page(args.target, target.identity, diag, results, seconds))
    rec = record(args.target, target.identity, target.source, diag, results, seconds, env)
    if args.json:
        write_json(Path(args.json), rec)
    return (0 if diag.verdict == "PASS" else 1), rec


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))[0]
