"""Timing utilities: a timer, summary statistics and the timing discipline the latency and
kv_cache experiments share (attnrepro.experiments.latency, attnrepro.experiments.kv_cache).

Timing discipline (`measure`): the first call is timed on its own (cold: CUDA context,
kernel selection, allocator growth), then `warmup` untimed calls, then `reps` timed calls,
each bracketed by CUDA events with a synchronize on CUDA (time.perf_counter on CPU). We
report median, p20, p80, mean and the coefficient of variation (std / mean).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import numpy as np
import torch


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


def measure(fn: Callable[[], object], device: str, warmup: int, reps: int, cold: bool = True) -> dict:
    """Summary of `reps` timed calls after `warmup` untimed ones (`summarize`); with `cold`,
    the first call is timed on its own before the warm-up (cold_ms)."""
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


def fit_exponent(ns: list[int], ms: list[float]) -> float:
    """Slope of log(time) against log(n) by least squares (2 = quadratic)."""
    if len(ns) < 2:
        return math.nan
    slope, _ = np.polyfit(np.log(np.asarray(ns, float)), np.log(np.asarray(ms, float)), 1)
    return float(slope)
