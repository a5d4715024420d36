"""The battery: every check of the audit on one attention function, in order, each under a time
limit, after a first plain call; and the audit as a section of the report. The first call must
return a tensor of SDPA's shape, or of a permutation of it (output transposed: a finding of the
checks, not bad input). A gated check that hangs
ends the audit (exit 2); the cost comparison, never gated, is reported as hung and the gated
verdict stands. The gated checks run on one intra-op thread: their inputs are small, and on a
shared machine two OpenMP threads contending with other jobs made parity up to 50 times slower
(0.2 s against 12 s measured); the cost comparison times both sides on one as well."""

from __future__ import annotations

import time
from typing import Callable

import torch

from attnrepro.audit.checks import (CallFailed, CheckResult, Finding, Impl, Unsupported, invariants, numerics, parity,
                                    scale_check)
from attnrepro.audit.cost import cost
from attnrepro.audit.determinism import determinism
from attnrepro.audit.diagnose import diagnose
from attnrepro.audit.render import markdown
from attnrepro.config import UserError
from attnrepro.model.attention_impl import AuditTimeout, Target, call_with_limit, resolve


def first_call(impl: Impl, spec: str, time_limit: float) -> None:
    """f(q, k, v) on a (2, 3, 5, 8) query, on the caller's threads: an exception, or an output that is not a
    tensor of SDPA's shape (or of a permutation of it, or of another dtype, which the checks report), is bad input."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g).to(impl.device) for n in (5, 7, 7))
    what = f"{spec} on a (2, 3, 5, 8) query"
    try:
        call_with_limit(impl.call, time_limit, what, q, k, v, {}, what)
    except Unsupported as e:
        raise UserError(f"{what} raised NotImplementedError: {str(e).partition(': ')[2]}") from None
    except CallFailed as e:
        if e.cause not in ("output_transposed", "wrong_dtype"):
            raise UserError(str(e)) from None


def on_threads(count: int, fn: Callable[[], CheckResult]) -> CheckResult:
    """fn() with `count` intra-op threads, set in the thread that runs it (OpenMP's setting is per thread)."""
    torch.set_num_threads(count)
    return fn()


def battery(target: Target, device: str = "cpu", time_limit: float = 120.0, full: bool = False,
            with_cost: bool = False) -> list[CheckResult]:
    """Every check on `target`, each under the time limit, after a first call (the cost comparison: with_cost)."""
    impl = Impl(target.fn, device)
    first_call(impl, target.spec, time_limit)
    threads = torch.get_num_threads()
    steps = [("determinism", lambda: determinism(impl)), ("parity", lambda: parity(impl, full)),
             ("invariants", lambda: invariants(impl)),
             ("numerics", lambda: numerics(impl)), ("scale", lambda: scale_check(impl))]
    if with_cost:
        steps.append(("cost", lambda: cost(impl)))
    results = []
    try:
        for name, fn in steps:
            t = time.perf_counter()
            try:
                res = call_with_limit(on_threads, time_limit, f"{target.spec}, check {name}", 1, fn)
            except AuditTimeout as e:
                if name != "cost":
                    raise
                res = CheckResult("cost", [Finding("cost", "info", f"hung: {e} (not gated: the verdict stands)")])
            res.seconds = time.perf_counter() - t
            results.append(res)
    finally:
        torch.set_num_threads(threads)
    return results


def report_section(spec: str) -> str:
    """The audit of params attention.impl as a section of report/REPORT.md (no timings: deterministic)."""
    target = resolve(spec)
    results = battery(target)
    return markdown(spec, target.identity, diagnose(results), results)
