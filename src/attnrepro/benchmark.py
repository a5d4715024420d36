"""What O(n^2) costs in time and memory (§1.14.2, §1.11.5).

Causal attention forward at batch 1, `heads` heads of `d_head`, over sequence
lengths n: the fused kernel (F.scaled_dot_product_attention) and the naive
attention.attention that materializes n x n scores/weights.

Timing discipline: the first call at each n is timed on its own (cold: CUDA
context, kernel selection, allocator growth), then `warmup` untimed calls, then
`reps` timed calls, each bracketed by CUDA events with a synchronize on CUDA
(time.perf_counter on CPU). We report median, p20, p80, mean and the
coefficient of variation (std / mean).

FLOP convention: a full attention forward costs 4 n^2 d h FLOPs (QK^T and PV,
2 FLOPs per multiply-add); the causal half is counted, 2 n^2 d h, which is the
work a causal kernel actually does. Achieved TFLOP/s = that / median time.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from .attention import attention, fused_attention
from .config import require, require_positive

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class LatencyConfig:
    """params `latency` (no defaults: params.yaml is the only source of values)."""

    seed: int
    threads: int
    device: str
    heads: int
    d_head: int
    cuda_n: list[int]
    cuda_dtypes: list[str]
    cuda_warmup: int
    cuda_reps: int
    naive_cuda_n: list[int]
    cpu_n: list[int]
    cpu_dtypes: list[str]
    cpu_warmup: int
    cpu_reps: int
    naive_cpu_n: list[int]

    def validate(self, prefix: str = "latency") -> None:
        require_positive(self, ("threads", "heads", "d_head", "cuda_reps", "cpu_reps"), prefix)
        for name in ("cuda_warmup", "cpu_warmup"):
            require(getattr(self, name) >= 0, f"{prefix}.{name}", getattr(self, name), "a non-negative integer")
        for name in ("cuda_n", "naive_cuda_n", "cpu_n", "naive_cpu_n"):
            vals = getattr(self, name)
            optional = name.startswith("naive")  # the naive path may be left out; the fused one not
            require((optional or len(vals) > 0) and all(n > 0 for n in vals) and vals == sorted(set(vals)),
                    f"{prefix}.{name}", vals, "increasing positive integers" if optional else
                    "a non-empty list of increasing positive integers")
        for name in ("cuda_dtypes", "cpu_dtypes"):
            vals = getattr(self, name)
            require(len(vals) > 0 and all(d in DTYPES for d in vals), f"{prefix}.{name}", vals,
                    "a non-empty list of " + ", ".join(DTYPES))


# Dense (no sparsity) FP16/BF16 tensor-core peak, TFLOP/s, from the vendors' datasheets
# (NVIDIA H200/H100/A100/RTX A6000/L40S/V100 product briefs; sparse figures halved).
# Matched against the NVML device name, first match wins; unknown GPUs get no peak.
PEAK_TFLOPS_FP16 = [
    ("H200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100 NVL", None),  # two-GPU product brief; no per-GPU dense figure kept here
    ("H100", 989.4),  # SXM5 (NVML: "NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
    ("RTX A6000", 154.8),
    ("L40S", 362.05),
    ("V100", 125.0),  # fp16 only: V100 has no bf16
]

OOM_ERRORS = (torch.OutOfMemoryError, MemoryError)


def peak_tflops(gpu_name: str, dtype: str = "fp16") -> Optional[float]:
    if dtype == "bf16" and "V100" in gpu_name:
        return None
    for key, peak in PEAK_TFLOPS_FP16:
        if key in gpu_name:
            return peak
    return None


def causal_flops(n: int, d_head: int, heads: int, batch: int = 1) -> float:
    """2 n^2 d h: half of the full 4 n^2 d h (QK^T + PV) for a causal mask."""
    return 2.0 * n * n * d_head * heads * batch


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


def measure(fn: Callable[[], object], device: str, warmup: int, reps: int) -> dict:
    """Cold first call, then `warmup` untimed calls, then `reps` timed calls."""
    timer = Timer(device)
    cold = timer(fn)
    for _ in range(warmup):
        fn()
    out = summarize([timer(fn) for _ in range(reps)])
    out["cold_ms"] = cold
    return out


def make_qkv(n: int, heads: int, d_head: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(1, heads, n, d_head, generator=g).to(device=device, dtype=dtype) for _ in range(3)]


def run_point(impl: str, n: int, *, heads: int, d_head: int, dtype: torch.dtype, device: str,
              warmup: int, reps: int, seed: int = 0) -> dict:
    """One (impl, n) data point; an out-of-memory error becomes a row with oom = 1."""
    cuda = device.startswith("cuda")
    row = {"impl": impl, "n": n, "oom": 0}
    q = k = v = None
    try:
        q, k, v = make_qkv(n, heads, d_head, dtype, device, seed)
        if impl == "sdpa":
            fn = lambda: fused_attention(q, k, v, scaled=True, causal=True)  # noqa: E731
        elif impl == "naive":
            fn = lambda: attention(q, k, v, scaled=True, causal=True).out  # noqa: E731
        else:
            raise ValueError(f"unknown impl {impl!r}")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with torch.no_grad():
            row.update(measure(fn, device, warmup, reps))
        if cuda:
            row["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        row["tflops"] = causal_flops(n, d_head, heads) / (row["median_ms"] * 1e-3) / 1e12
    except OOM_ERRORS:
        row = {"impl": impl, "n": n, "oom": 1}
    finally:
        del q, k, v
        if cuda:
            torch.cuda.empty_cache()
    # bytes of one n x n matrix per head (the naive path holds several at once)
    row["nxn_bytes"] = n * n * heads * torch.tensor([], dtype=dtype).element_size()
    return row


def fit_exponent(ns: list[int], ms: list[float]) -> float:
    """Slope of log(time) against log(n) by least squares (2 = quadratic)."""
    if len(ns) < 2:
        return math.nan
    slope, _ = np.polyfit(np.log(np.asarray(ns, float)), np.log(np.asarray(ms, float)), 1)
    return float(slope)
