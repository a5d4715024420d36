"""(e) Cost: latency and peak memory of the implementation against SDPA over sequence lengths.

Latency is the median of the project's one timer (measure.timing.measure, the latency stage's
discipline: on CUDA events around back-to-back calls). Peak memory is the
allocator's peak on CUDA; on a Linux CPU it is the rise of the process's resident
high-water mark (VmHWM, reset through /proc/self/clear_refs) during one call, which sees
every buffer large enough to be mapped from the OS (small ones come from malloc's pools
and read as 0), so a peak under RESOLUTION_MIB is reported as "below resolution" and no
growth exponent is fitted through such points. Latency comes with its spread (the 20th and
80th percentiles of the repetitions). Informational: machines are shared and noisy, nothing here is gated.
"""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from attnrepro.audit.checks import CheckResult, Finding, Impl, guarded
from attnrepro.measure.timing import fit_exponent, make_qkv, measure

LENGTHS = (256, 512, 1024)
RESOLUTION_MIB = {"cpu": 1.0, "cuda": 2.0}  # CPU: malloc's pools and thread arenas; CUDA: the allocator's blocks


def resolution(device: str) -> float:
    return RESOLUTION_MIB["cuda" if device.startswith("cuda") else "cpu"]


def mib_text(value: Optional[float], floor: float) -> str:
    if value is None:
        return "n/a"
    return f"below resolution ({floor:g} MiB)" if value < floor else f"{value:.3g} MiB"


def growth(ns, ys, floor: float) -> Optional[float]:
    """How ys grow with n (log-log slope) over the points above `floor`; None with fewer than two."""
    pts = [(n, y) for n, y in zip(ns, ys) if y is not None and y >= floor and y > 0]
    return fit_exponent(*map(list, zip(*pts))) if len(pts) >= 2 else None


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


def cost(impl: Impl, lengths=LENGTHS, heads: int = 4, d_head: int = 64, reps: int = 20) -> CheckResult:
    res = CheckResult("cost")
    guarded(res, lambda: _cost(impl, lengths, heads, d_head, reps, res))
    return res


def spread(p20_p80: list[float]) -> str:
    return f"p20-p80 {p20_p80[0]:.3g}-{p20_p80[1]:.3g}"


def _cost(impl: Impl, lengths, heads: int, d_head: int, reps: int, res: CheckResult) -> None:
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
                t = measure(fn, impl.device, warmup=2, reps=reps, cold=False)
                peak = peak_bytes(fn, impl.device)
            row[f"{name}_ms"] = t["median_ms"]
            row[f"{name}_p20_p80_ms"] = [t["p20_ms"], t["p80_ms"]]
            row[f"{name}_peak_mib"] = None if peak is None else peak / 2**20
        row["time_ratio"] = row["impl_ms"] / row["sdpa_ms"]
        rows.append(row)
    floor = resolution(impl.device)
    res.details.update({"device": impl.device, "dtype": str(dtype).replace("torch.", ""), "heads": heads,
                        "d_head": d_head, "rows": rows, "memory_resolution_mib": floor,
                        "time_exponent": growth(lengths, [r["impl_ms"] for r in rows], 0.0),
                        "memory_exponent": growth(lengths, [r["impl_peak_mib"] for r in rows], floor),
                        "sdpa_memory_exponent": growth(lengths, [r["sdpa_peak_mib"] for r in rows], floor)})
    mem = res.details["memory_exponent"]
    last = rows[-1]
    res.findings.append(Finding(
        "cost", "info", f"at n={last['n']}: {last['impl_ms']:.3g} ms ({spread(last['impl_p20_p80_ms'])}) vs SDPA "
        f"{last['sdpa_ms']:.3g} ms ({spread(last['sdpa_p20_p80_ms'])}), {last['time_ratio']:.2g}x; peak memory "
        f"{mib_text(last['impl_peak_mib'], floor)} vs SDPA {mib_text(last['sdpa_peak_mib'], floor)}"
        + ("" if mem is None or math.isnan(mem) else f", growing as n^{mem:.2g}"
           + (" (it materialises the L x S weights)" if mem > 1.6 else ""))))
