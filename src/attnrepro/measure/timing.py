"""Timing utilities: a timer, summary statistics and the timing discipline the latency and
kv_cache experiments share (attnrepro.experiments.latency, attnrepro.experiments.kv_cache).

Timing discipline (`measure`): the first call is timed on its own (cold: CUDA context,
kernel selection, allocator growth), then a warm-up, then `reps` timed repetitions. We report
median, p20, p80, mean and the coefficient of variation (std / mean) of the repetitions.

- CPU: `warmup` untimed calls, then `reps` calls each timed by time.perf_counter.
- CUDA (`measure_cuda`), so that the kernel is measured, not the 20-40 us of Python and SDPA
  dispatch in front of a 5-10 us kernel on an idle GPU: the warm-up runs for at least
  CUDA_WARMUP_S seconds (and at least `warmup` calls: clocks up, caches and allocator settled);
  each timed repetition is a pair of CUDA events around `calls_per_rep` back-to-back calls
  (enough for CUDA_REP_MS of GPU time, the queue kept full), with no synchronize between
  repetitions; a call's time is the repetition's over its calls.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import numpy as np
import torch
from torch.nn.attention import SDPBackend


class Timer:
    """Times a callable in milliseconds: CUDA events on CUDA, perf_counter on CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return 1000.0 * (time.perf_counter() - t0)


def summarize(times_ms: list[float]) -> dict:
    q = np.percentile(np.asarray(times_ms), [20, 50, 80])
    mean = statistics.fmean(times_ms)
    std = statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0
    return {"median_ms": float(q[1]), "p20_ms": float(q[0]), "p80_ms": float(q[2]), "mean_ms": mean,
            "cv": std / mean if mean > 0 else math.nan, "reps": len(times_ms)}


CUDA_WARMUP_S = 0.25  # a CUDA warm-up lasts at least this long
CUDA_REP_MS = 2.0  # one timed CUDA repetition spans at least this much GPU time ...
CUDA_MAX_CALLS = 1000  # ... in at most this many back-to-back calls


def calls_per_rep(per_call_ms: float) -> int:
    """Back-to-back calls in one timed CUDA repetition: enough for CUDA_REP_MS, at most CUDA_MAX_CALLS."""
    if not per_call_ms > 0:
        return CUDA_MAX_CALLS
    return max(1, min(CUDA_MAX_CALLS, math.ceil(CUDA_REP_MS / per_call_ms)))


def _events() -> tuple:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def measure_cuda(fn: Callable[[], object], warmup: int, reps: int, cold: bool = True) -> dict:
    """The CUDA discipline of the module docstring: `summarize` of `reps` repetitions, each a pair of
    events around calls_per_rep back-to-back calls, after a time-based warm-up; `calls_per_rep` and
    `warmup_calls` are reported beside it."""
    first = Timer("cuda")(fn) if cold else None
    t0, calls = time.perf_counter(), 0
    while calls < warmup or time.perf_counter() - t0 < CUDA_WARMUP_S:
        fn()
        torch.cuda.synchronize()
        calls += 1
    start, end = _events()
    start.record()
    for _ in range(8):  # the per-call time that sizes a repetition
        fn()
    end.record()
    torch.cuda.synchronize()
    inner = calls_per_rep(start.elapsed_time(end) / 8)
    pairs = [_events() for _ in range(reps)]
    for start, end in pairs:
        start.record()
        for _ in range(inner):
            fn()
        end.record()
    torch.cuda.synchronize()
    out = summarize([float(s.elapsed_time(e)) / inner for s, e in pairs])
    out.update(calls_per_rep=inner, warmup_calls=calls + 8)
    if cold:
        out["cold_ms"] = first
    return out


def measure(fn: Callable[[], object], device: str, warmup: int, reps: int, cold: bool = True) -> dict:
    """Summary of `reps` timed calls after `warmup` untimed ones (`summarize`); with `cold`,
    the first call is timed on its own before the warm-up (cold_ms). On CUDA: `measure_cuda`."""
    if device.startswith("cuda"):
        return measure_cuda(fn, warmup, reps, cold)
    timer = Timer(device)
    first = timer(fn) if cold else None
    for _ in range(warmup):
        fn()
    out = summarize([timer(fn) for _ in range(reps)])
    if cold:
        out["cold_ms"] = first
    return out


def make_qkv(n: int, heads: int, d_head: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(1, heads, n, d_head, generator=g).to(device=device, dtype=dtype) for _ in range(3)]


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> str:
    """The kernel F.scaled_dot_product_attention picks for these inputs (FLASH_ATTENTION,
    EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH, ...); "unknown" where this torch does not say."""
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal)).name
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return "unknown"


def fit_exponent(ns: list[int], ms: list[float]) -> float:
    """Slope of log(time) against log(n) by least squares (2 = quadratic)."""
    if len(ns) < 2:
        return math.nan
    slope, _ = np.polyfit(np.log(np.asarray(ns, float)), np.log(np.asarray(ms, float)), 1)
    return float(slope)
