"""(e) Cost: latency and peak memory of the implementation against SDPA over sequence lengths.

Latency is torch.utils.benchmark's median (blocked_autorange). Peak memory is the
allocator's peak on CUDA; on a Linux CPU it is the rise of the process's resident
high-water mark (VmHWM, reset through /proc/self/clear_refs) during one call, which sees
every buffer large enough to be mapped from the OS (small ones come from malloc's pools
and read as 0). Informational: machines are shared and noisy, nothing here is gated.
"""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from attnrepro.audit.checks import CheckResult, Finding, Impl, guarded
from attnrepro.measure.timing import fit_exponent, make_qkv

LENGTHS = (256, 512, 1024)


def _status(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def _fix_mmap_threshold() -> None:
    """glibc raises its mmap threshold after large blocks are freed; later ones then come from the heap
    and stay resident, and VmHWM stops seeing them. Pinning the threshold (128 KiB) keeps it honest."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def peak_bytes(fn: Callable[[], object], device: str) -> Optional[int]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = _status("VmRSS")
        fn()
        return max(0, _status("VmHWM") - base)
    except (OSError, AttributeError):
        return None  # not Linux


def _slope(ns, ys) -> Optional[float]:
    """How ys grow with n (log-log slope) over the points measured; None with fewer than two."""
    pts = [(n, y) for n, y in zip(ns, ys) if y and y > 0]
    return fit_exponent(*map(list, zip(*pts))) if len(pts) >= 2 else None


def cost(impl: Impl, lengths=LENGTHS, heads: int = 4, d_head: int = 64, min_run_time: float = 0.2) -> CheckResult:
    res = CheckResult("cost")
    guarded(res, lambda: _cost(impl, lengths, heads, d_head, min_run_time, res))
    return res


def _cost(impl: Impl, lengths, heads: int, d_head: int, min_run_time: float, res: CheckResult) -> None:
    rows = []
    if not impl.device.startswith("cuda"):
        _fix_mmap_threshold()
    dtype = torch.float16 if impl.device.startswith("cuda") else torch.float32
    for n in lengths:
        q, k, v = make_qkv(n, heads, d_head, dtype, impl.device, seed=n)
        row = {"n": n}
        for name, fn in (("impl", lambda: impl.call(q, k, v, {"is_causal": True}, f"cost n={n}")),
                         ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))):
            with torch.no_grad():
                fn()  # warm-up
                t = benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
                peak = peak_bytes(fn, impl.device)
            row[f"{name}_ms"] = t.median * 1e3
            row[f"{name}_peak_mib"] = None if peak is None else peak / 2**20
        row["time_ratio"] = row["impl_ms"] / row["sdpa_ms"]
        rows.append(row)
    res.details.update({"device": impl.device, "dtype": str(dtype).replace("torch.", ""), "heads": heads,
                        "d_head": d_head, "rows": rows,
                        "time_exponent": _slope(lengths, [r["impl_ms"] for r in rows]),
                        "memory_exponent": _slope(lengths, [r["impl_peak_mib"] for r in rows]),
                        "sdpa_memory_exponent": _slope(lengths, [r["sdpa_peak_mib"] for r in rows])})
    mem = res.details["memory_exponent"]
    last = rows[-1]
    res.findings.append(Finding(
        "cost", "info", f"at n={last['n']}: {last['impl_ms']:.3g} ms vs SDPA {last['sdpa_ms']:.3g} ms "
        f"({last['time_ratio']:.2g}x); peak memory "
        + ("n/a" if last["impl_peak_mib"] is None
           else f"{last['impl_peak_mib']:.3g} MiB vs {last['sdpa_peak_mib']:.3g}")
        + ("" if mem is None or math.isnan(mem) else f", growing as n^{mem:.2g}"
           + (" (it materialises the L x S weights)" if mem > 1.6 else ""))))
