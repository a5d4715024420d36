"""What O(n^2) costs in time and memory (§1.14.2, §1.11.5): the `latency` experiment.

Causal attention forward at batch 1, `heads` heads of `d_head`, over sequence
lengths n: the fused kernel (F.scaled_dot_product_attention) and the naive
attention.attention that materializes n x n scores/weights, each point timed with
attnrepro.measure.timing.measure (cold first call, warm-up, timed repetitions).

FLOP convention: a full attention forward costs 4 n^2 d h FLOPs (QK^T and PV,
2 FLOPs per multiply-add); the causal half is counted, 2 n^2 d h, which is the
work a causal kernel actually does. Achieved TFLOP/s = that / mean time on the CPU (as the
committed CPU reference was made), / median time on CUDA.

Fits (`exponent`): on the CPU the log-log slope of the mean time over every n; on CUDA of the
median time over the n where the GPU is occupied, n >= OCCUPIED_FROM_N (below it a batch-1,
8-head forward is launch-bound on a large GPU: n 512 and n 1024 cost about the same), with
`exponent_all` the median fit over every n. CUDA points record the SDPA backend used.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

import torch

from attnrepro.config import require, require_positive
from attnrepro.envinfo import environment, gpu_info
from attnrepro.measure.timing import fit_exponent, make_qkv, measure, sdpa_backend
from attnrepro.model.attention import attention, fused_attention
from attnrepro.progress import progress

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

COLUMNS = ["impl", "dtype", "n", "oom", "median_ms", "p20_ms", "p80_ms", "mean_ms", "cv", "cold_ms", "reps",
           "tflops", "frac_peak", "peak_bytes", "nxn_bytes"]
SERIES_COLUMNS = ["series", "n", "mean_ms", "p20_ms", "p80_ms"]


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
# Matched against the device name (NVML's, else torch's), the longest name it contains wins
# ("H200 NVL" over "H200"); unknown GPUs get no peak.
PEAK_TFLOPS_FP16 = [
    ("H200 NVL", 835.5),  # H200 NVL product brief: 1,671 sparse
    ("H200", 989.4),  # SXM (NVML: "NVIDIA H200"): 1,979 sparse
    ("H100 PCIe", 756.0),
    ("H100 NVL", None),  # two-GPU product brief; no per-GPU dense figure kept here
    ("H100", 989.4),  # SXM5 (NVML: "NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
    ("RTX A6000", 154.8),
    ("L40S", 362.05),
    ("V100", 125.0),  # fp16 only: V100 has no bf16
]

OOM_ERRORS = (torch.OutOfMemoryError, MemoryError)
OCCUPIED_FROM_N = 2048  # the CUDA fit's first n (see the module docstring; judge/conclusions.py cuda_superlinear)


def peak_tflops(gpu_name: str, dtype: str = "fp16") -> Optional[float]:
    if dtype == "bf16" and "V100" in gpu_name:
        return None
    hits = [(len(key), peak) for key, peak in PEAK_TFLOPS_FP16 if key in gpu_name]
    return max(hits)[1] if hits else None


def gpu_name(device: str) -> str:
    """The GPU's name: NVML's (the gpu extra), else torch's."""
    return gpu_info(device).get("gpu_name") or torch.cuda.get_device_name(device)


def causal_flops(n: int, d_head: int, heads: int, batch: int = 1) -> float:
    """2 n^2 d h: half of the full 4 n^2 d h (QK^T + PV) for a causal mask."""
    return 2.0 * n * n * d_head * heads * batch


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
            if impl == "sdpa":
                row["backend"] = sdpa_backend(q, k, v, causal=True)
        row["tflops"] = causal_flops(n, d_head, heads) / (row["median_ms" if cuda else "mean_ms"] * 1e-3) / 1e12
    except OOM_ERRORS:
        row = {"impl": impl, "n": n, "oom": 1}
    finally:
        q = k = v = None  # drop the tensors (the closures hold the names) before emptying the cache
        if cuda:
            torch.cuda.empty_cache()
    # bytes of one n x n matrix per head (the naive path holds several at once)
    row["nxn_bytes"] = n * n * heads * torch.tensor([], dtype=dtype).element_size()
    return row


def sweep(cfg: LatencyConfig, device: str) -> list[dict]:
    """Every point of the device's plan (CUDA or CPU params), one row each."""
    cuda = device.startswith("cuda")
    dtypes = cfg.cuda_dtypes if cuda else cfg.cpu_dtypes
    ns, naive_ns = (cfg.cuda_n, cfg.naive_cuda_n) if cuda else (cfg.cpu_n, cfg.naive_cpu_n)
    warmup, reps = (cfg.cuda_warmup, cfg.cuda_reps) if cuda else (cfg.cpu_warmup, cfg.cpu_reps)
    # the naive path only in the first dtype: it is the memory story, not a dtype comparison
    plan = [("sdpa", dt, n) for dt in dtypes for n in ns] + [("naive", dtypes[0], n) for n in naive_ns]
    name = gpu_name(device) if cuda else ""
    rows = []
    bar = progress(len(plan), f"latency {device}")
    for impl, dt, n in plan:
        row = run_point(impl, n, heads=cfg.heads, d_head=cfg.d_head, dtype=DTYPES[dt], device=device,
                        warmup=warmup, reps=reps, seed=cfg.seed)
        row["dtype"] = dt
        peak = peak_tflops(name, dt) if cuda and dt != "fp32" else None
        if peak and "tflops" in row:
            row["frac_peak"] = row["tflops"] / peak
        rows.append(row)
        bar.update(1)
    bar.close()
    return rows


def metrics_from(rows: list[dict], cfg: LatencyConfig, device: str, env: dict) -> dict:
    """metrics/latency.json: the setup, the device, and per series (<impl>_<dtype>) every point and its fit."""
    cuda = device.startswith("cuda")
    out: dict[str, dict] = {
        "setup": {"cuda": int(cuda), "batch": 1, "heads": cfg.heads, "d_head": cfg.d_head, "causal": 1,
                  "warmup": cfg.cuda_warmup if cuda else cfg.cpu_warmup,
                  "reps": cfg.cuda_reps if cuda else cfg.cpu_reps,
                  "flops_per_forward_coeff": 2, "torch_threads": torch.get_num_threads()},
        "device": {"cpu_cores_logical": env["cpu_cores_logical"], "ram_bytes": env["ram_bytes"]},
    }
    if cuda:
        gpu = gpu_info(device)
        if "gpu_memory_bytes" in gpu:
            out["device"]["gpu_memory_bytes"] = gpu["gpu_memory_bytes"]
        name = gpu_name(device)
        for dt in cfg.cuda_dtypes:
            peak = peak_tflops(name, dt) if dt != "fp32" else None
            if peak:
                out["device"][f"peak_tflops_{dt}"] = peak
    series: dict[str, list[dict]] = {}
    for r in rows:
        series.setdefault(f"{r['impl']}_{r['dtype']}", []).append(r)
    for name, pts in series.items():
        sec: dict = {}
        ok = [p for p in pts if not p["oom"]]
        if ok:
            sec["cold_first_ms"] = ok[0]["cold_ms"]
        for p in pts:
            n = p["n"]
            if p["oom"]:
                sec[f"n{n}_oom"] = 1
                continue
            for k in ("mean_ms", "median_ms", "p20_ms", "p80_ms", "cv", "cold_ms", "tflops", "frac_peak", "peak_bytes",
                      "calls_per_rep"):
                if k in p:
                    sec[f"n{n}_{k}"] = p[k]
        backends = sorted({p["backend"] for p in ok if "backend" in p})
        if backends:
            sec["backend"] = ",".join(backends)
        if len(ok) >= 2 and cuda:
            busy = [p for p in ok if p["n"] >= OCCUPIED_FROM_N]
            sec["exponent"] = fit_exponent([p["n"] for p in busy], [p["median_ms"] for p in busy])
            sec["exponent_all"] = fit_exponent([p["n"] for p in ok], [p["median_ms"] for p in ok])
        elif len(ok) >= 2:
            sec["exponent"] = fit_exponent([p["n"] for p in ok], [p["mean_ms"] for p in ok])
        if len(ok) >= 2:
            sec["exponent_top3"] = fit_exponent([p["n"] for p in ok[-3:]], [p["mean_ms"] for p in ok[-3:]])
            sec["ratio_last_first"] = ok[-1]["mean_ms"] / ok[0]["mean_ms"]
            sec["n_ratio_last_first"] = ok[-1]["n"] / ok[0]["n"]
        sec["oom_count"] = len(pts) - len(ok)
        out[name] = sec
    return out


def series_rows(rows: list[dict]) -> list[dict]:
    """The measured points (no OOM rows), each tagged with its series "<impl> <dtype>": what
    `dvc plots` draws as one line per series (dvc.yaml: attention_latency, template `series`)."""
    return [{"series": f"{r['impl']} {r['dtype']}", **r} for r in rows if not r["oom"]]


@dataclass
class LatencyResult:
    rows: list[dict]  # every point, OOM rows included (plots/latency/latency.csv)
    metrics: dict  # metrics/latency.json
    env: dict  # metrics/env/latency.json
    title: str  # the figure's title

    @property
    def series(self) -> list[dict]:
        return series_rows(self.rows)

    def lines(self) -> list[str]:
        fit = f" (median, n >= {OCCUPIED_FROM_N})" if self.metrics["setup"]["cuda"] else ""
        return [f"latency {name}: exponent {sec['exponent']:.2f}{fit}, x{sec['ratio_last_first']:.0f} time for "
                f"x{sec['n_ratio_last_first']:.0f} n, cold first call {sec['cold_first_ms']:.2f} ms, "
                f"{sec['oom_count']} OOM" for name, sec in self.metrics.items() if "exponent" in sec]


def run(cfg: LatencyConfig, device: str) -> LatencyResult:
    """The sweep on `device` (resolved, determinism set), its metrics and the machine record."""
    if device.startswith("cuda:"):
        torch.cuda.set_device(int(device.split(":", 1)[1]))  # events and memory stats follow the current device
    load_start = os.getloadavg()[0]
    rows = sweep(cfg, device)
    env = environment(device)
    metrics = metrics_from(rows, cfg, device, env)
    metrics["setup"]["load_avg_1m_start"] = load_start  # other processes sharing the CPU
    where = env.get("gpu_name", device) if device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    title = f"causal attention forward, batch 1, {cfg.heads} heads x d_head {cfg.d_head} ({where})"
    return LatencyResult(rows, metrics, env, title)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    if not metrics:
        return ""
    setup = metrics.get("setup", {})
    impls = {k: v for k, v in sorted(metrics.items()) if isinstance(v, dict) and "exponent" in v}
    if not impls:
        return ""
    where = "on CUDA" if setup.get("cuda") else "on the CPU (no CUDA on this machine: the published GPU timings are not measured)"
    text = (f"Measured {where}: time grows as n^" + ", ".join(f"{v['exponent']:.2f} for {k}" for k, v in impls.items())
            + " over the measured lengths")
    ns = sorted(set.intersection(*[{int(k[1:].split("_")[0]) for k in v if re.fullmatch(r"n\d+_mean_ms", k)}
                                   for v in impls.values()]))
    if ns:
        n = ns[-1]
        t = {k: v[f"n{n}_mean_ms"] for k, v in impls.items()}
        slow, fast = max(t, key=lambda k: (t[k], k)), min(t, key=lambda k: (t[k], k))
        text += (f"; at n = {n} one forward takes {t[fast]:.3g} ms with {fast} and {t[slow]:.3g} ms with {slow} "
                 f"({t[slow] / t[fast]:.1f}×)")
    return text + "."
