"""attnrepro audit package.module:function [--json PATH] [--full] [--time-limit S] [--device D]

Exit status: 0 the implementation passes; 1 a check fails (FAIL: the page says which and why)
or some cases could not run (INCOMPLETE); 2 bad input (a path that does not import, not
callable, another signature, a first plain call f(q, k, v) that raises or returns the wrong
shape, a gated check that does not return within the time limit).

Raise NotImplementedError for an input you do not support: those cases are reported as not
run (INCOMPLETE), never passed. Any other exception on an input the signature allows is a
FAIL naming the input and the exception's first line.
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
dropout_p=0.0, is_causal=False, scale=None) and name what is wrong:

  determinism two identical calls (dropout_p=0) agree bit for bit; dropout_p > 0 drops at
              that rate and rescales the kept weights by 1/(1 - p)
  parity      forward and backward against a float64 reference: shapes with non-powers of
              two, L != S, Ev != E; no mask, is_causal, boolean and float masks, is_causal
              with a mask, masks broadcast over heads/batch, decode; scale=None, 1 and 0.3;
              fp32, fp16, bf16 (tolerance below)
  invariants  no influence of future keys/values on a causal row; permutation equivariance;
              rows of the weights sum to one; a fully masked row (SDPA returns 0)
  numerics    logits up to 3e4 in each dtype: no inf/nan where the reference has none
  scale       the logit std as d_head grows: which power of d_k divides the logits, where
  cost        latency (median, IQR) and peak memory against SDPA over sequence lengths;
              not gated: below the memory's resolution it says so, a hang is reported

A failure is translated into the likely cause in the chapter's terms (mask_zero,
no_stable_softmax, dk_not_sqrt, scale_after_softmax, a future leak at offset k, a mask
dropped or inverted, a finite mask fill and its value, softmax over the wrong axis, dropout
left on, an overflow above logit L) with the smallest input that shows it; a random output
is named first, numerical-range findings after the functional ones. The current directory is on
sys.path, so `attnrepro audit examples.attention.chunked:chunked_attention` works from the
repository root.
"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="attnrepro audit", description=DESCRIPTION, epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="package.module:function with SDPA's signature")
    p.add_argument("--json", metavar="PATH", help="also write the JSON record here")
    p.add_argument("--full", action="store_true", help="a larger parity grid (longer, wider) and fp64")
    p.add_argument("--no-cost", action="store_true", help="skip the latency/memory comparison")
    p.add_argument("--time-limit", type=float, default=120.0, metavar="S",
                   help="seconds each check may take before the implementation counts as hung (default 120; "
                        "a hung cost comparison is reported and the verdict stands)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu", help="where to run (default cpu)")
    p.add_argument("--interface", choices=("sdpa", "project"), default="sdpa",
                   help="sdpa (default) or project: a function like attnrepro.model.attention.attention "
                        "(q, k, v, *, scaled, causal)")
    return p


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
    target = resolve(args.target, args.interface)
    results = battery(target, device, args.time_limit, args.full, not args.no_cost)
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
