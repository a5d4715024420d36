"""Attention health checks of §1.11.7/§1.13: four probes that catch the four silent bugs.

Each check runs an attention function on a small synthetic probe and returns a
`HealthResult` (name, passed, measured value, threshold, message). The function
under test is any callable `attn(q, k, v)` returning an `AttentionResult` (or an
`(out, weights)` tuple) with causal masking on; `variant_attention(bug)` gives the
project's own attention with one of `attention.BUGS` switched on.

    check_future_zero   weight on future keys must be exactly 0        (catches mask_zero)
    check_row_sums      every row sums to 1 within ROW_SUM_TOL         (scale_after_softmax)
    check_boundary      logits of std ~5000 give no nan/inf            (no_stable_softmax)
    check_entropy       mean normalized entropy inside (0.01, 0.99)     (dk_not_sqrt)
                        on unit-variance q, k (the footnote's premise)

The probes are deterministic (own seeded generator, float32) and small.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from attnrepro.measure.weights import normalized_entropy
from attnrepro.model.attention import BUGS, AttentionResult, attention, causal_mask

ROW_SUM_TOL = 1e-5  # float32 softmax rows sum to 1 within a few ulps (~1e-7)
BOUNDARY_STD = 5000.0  # the unscaled d256 model's measured logit std is of this order (§1.11.7.3)
ENTROPY_BAND = (0.01, 0.99)

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]


@dataclass(frozen=True)
class HealthResult:
    name: str
    passed: bool
    measured: float
    threshold: float
    message: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Probe:
    """Shape of the synthetic probe: batch, heads, sequence length, d_head, seed."""

    batch: int = 2
    heads: int = 2
    seq: int = 32
    d_head: int = 32
    seed: int = 0


def variant_attention(bug: str = "correct", scaled: bool = True) -> AttnFn:
    """The project's attention with `bug` injected, as a callable attn(q, k, v)."""
    if bug not in BUGS:
        raise ValueError(f"unknown attention bug {bug!r}; expected one of {', '.join(BUGS)}")
    return functools.partial(attention, scaled=scaled, causal=True, bug=bug)


def _run(attn: AttnFn, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    res = attn(q, k, v)
    if isinstance(res, AttentionResult):
        return res.out, res.weights
    out, weights = res
    return out, weights


def _qkv(probe: Probe, std: float = 1.0):
    g = torch.Generator().manual_seed(probe.seed)
    shape = (probe.batch, probe.heads, probe.seq, probe.d_head)
    return tuple(torch.randn(shape, generator=g) * std for _ in range(3))


def future_weight_max(weights: torch.Tensor) -> float:
    """Largest weight any query gives to a key after it (0 for a correct causal mask)."""
    future = ~causal_mask(weights.shape[-2], weights.shape[-1], device=weights.device)
    return weights[..., future].abs().max().item() if future.any() else 0.0


def row_sum_error(weights: torch.Tensor) -> float:
    """max |sum_j w_ij - 1| over all rows (nan if any weight is nan)."""
    return (weights.double().sum(-1) - 1).abs().max().item()


def check_future_zero(attn: AttnFn, probe: Probe = Probe()) -> HealthResult:
    """A query must give exactly zero weight to every key after it."""
    _, w = _run(attn, *_qkv(probe))
    m = future_weight_max(w)
    ok = m == 0.0
    msg = "future keys get weight 0" if ok else f"future keys get weight up to {m:.4g}: the causal mask leaks"
    return HealthResult("check_future_zero", ok, m, 0.0, msg)


def check_row_sums(attn: AttnFn, probe: Probe = Probe(), tol: float = ROW_SUM_TOL) -> HealthResult:
    """Every row of the weights must sum to 1 within `tol`."""
    _, w = _run(attn, *_qkv(probe))
    err = row_sum_error(w)
    ok = err <= tol  # False for nan
    msg = (f"rows sum to 1 within {tol:g}" if ok else
           f"row sums are off by up to {err:.4g} (max row sum {w.double().sum(-1).max().item():.4g})")
    return HealthResult("check_row_sums", ok, err, tol, msg)


def boundary_probe(probe: Probe, logit_std: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v whose *correctly scaled* scores q k^T / sqrt(d) are N(0, logit_std^2) logits.

    k is the identity (d_head = seq), so q @ k^T = q: the logits are fed in directly.
    A bug that changes the scaling changes what reaches the softmax, as it would in a model.
    """
    g = torch.Generator().manual_seed(probe.seed)
    t = probe.seq
    logits = torch.randn(probe.batch, probe.heads, t, t, generator=g) * logit_std
    q = logits * math.sqrt(t)
    k = torch.eye(t).expand(probe.batch, probe.heads, t, t).contiguous()
    v = torch.randn(probe.batch, probe.heads, t, t, generator=g)
    return q, k, v


def check_boundary(attn: AttnFn, probe: Probe = Probe(), logit_std: float = BOUNDARY_STD) -> HealthResult:
    """Logits of std ~5000 (float32) must not produce nan or inf in weights or output."""
    out, w = _run(attn, *boundary_probe(probe, logit_std))
    bad = int((~torch.isfinite(w)).sum().item() + (~torch.isfinite(out)).sum().item())
    ok = bad == 0
    msg = (f"finite at logit std {logit_std:g}" if ok else
           f"{bad} non-finite values at logit std {logit_std:g}: softmax overflows (subtract the row max)")
    return HealthResult("check_boundary", ok, float(bad), 0.0, msg)


def check_entropy(attn: AttnFn, probe: Probe = Probe(), band: tuple[float, float] = ENTROPY_BAND) -> HealthResult:
    """Mean normalized entropy on unit-variance q, k must lie strictly inside `band`.

    With unit-variance q, k (the footnote's premise) correctly scaled logits have std 1,
    so the weights are neither uniform (entropy -> 1: over-scaling) nor one-hot
    (entropy -> 0: missing scaling / saturation).
    """
    _, w = _run(attn, *_qkv(probe))
    h = normalized_entropy(w).mean().item()
    lo, hi = band
    ok = lo < h < hi
    if ok:
        msg = f"entropy {h:.4f} inside ({lo}, {hi})"
    else:
        why = "near-uniform weights: logits over-scaled" if h >= hi else "one-hot weights: softmax saturated"
        if not math.isfinite(h):
            why = "entropy is not finite"
        msg = f"entropy {h:.4f} outside ({lo}, {hi}): {why}"
    return HealthResult("check_entropy", ok, h, lo if h <= lo else hi, msg)  # the bound at stake


CHECKS: dict[str, Callable[..., HealthResult]] = {
    "check_future_zero": check_future_zero,
    "check_row_sums": check_row_sums,
    "check_boundary": check_boundary,
    "check_entropy": check_entropy,
}

# the bug each check is designed to catch
INTENDED: dict[str, str] = {
    "mask_zero": "check_future_zero",
    "scale_after_softmax": "check_row_sums",
    "no_stable_softmax": "check_boundary",
    "dk_not_sqrt": "check_entropy",
}


def run_checks(attn: AttnFn, probe: Probe = Probe()) -> list[HealthResult]:
    """All four checks on one attention function, in a fixed order."""
    with torch.no_grad():
        return [fn(attn, probe) for fn in CHECKS.values()]


def check_matrix(bugs=BUGS, probe: Probe = Probe(), scaled: bool = True) -> dict[str, dict[str, HealthResult]]:
    """{bug: {check name: result}} for the project's attention with each bug injected."""
    return {b: {r.name: r for r in run_checks(variant_attention(b, scaled), probe)} for b in bugs}
