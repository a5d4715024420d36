"""DVC stage `latency`: what O(n^2) attention costs in time and memory (§1.14.2, §1.11.5).

Causal attention forward, batch 1, `heads` heads of `d_head`, for each n:
  sdpa   F.scaled_dot_product_attention (flash / memory-efficient kernels on CUDA)
  naive  attention.attention, which materializes the n x n scores and weights
Cold first call reported apart from the warm median (p20/p80, CV) of the timed
repetitions; achieved TFLOP/s counts the causal half, 2 n^2 d h (see
attnrepro.benchmark); on CUDA also the fraction of the device's dense fp16/bf16
peak (known GPUs only) and the peak memory (torch.cuda.max_memory_allocated).
An out-of-memory error is a data point (oom = 1), not a crash. The exponent is
the log-log least-squares slope of the median time in n.

Device `auto` uses CUDA when present (cuda_* params) and otherwise runs a CPU
sweep with smaller n and fewer repetitions (cpu_* params); metrics.setup.cuda
says which, and GPU-only keys are absent (not zero) on CPU.

Outputs: metrics/latency.json (timings: they vary run to run), metrics/env/latency.json
(device fingerprint: CPU, RAM, GPU name/driver/memory via NVML), plots/latency/latency.csv
(every point, OOM rows included: a table), plots/latency/median_ms.csv (the plotted series:
one row per measured point, its `series` "<impl> <dtype>" a line of its own in `dvc plots`)
and latency.png.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from attnrepro import benchmark as bm
from attnrepro.benchmark import DTYPES, LatencyConfig
from attnrepro.config import load_section, run_stage
from attnrepro.envinfo import environment, gpu_info, setup_determinism
from attnrepro.io import write_csv, write_json
from attnrepro.figures import latency_figure
from attnrepro.runtime import progress, resolve_device

COLUMNS = ["impl", "dtype", "n", "oom", "median_ms", "p20_ms", "p80_ms", "mean_ms", "cv", "cold_ms", "reps",
           "tflops", "frac_peak", "peak_bytes", "nxn_bytes"]
SERIES_COLUMNS = ["series", "n", "median_ms", "p20_ms", "p80_ms"]


def series_rows(rows: list[dict]) -> list[dict]:
    """The measured points (no OOM rows), each tagged with its series "<impl> <dtype>": what
    `dvc plots` draws as one line per series (dvc.yaml: attention_latency, template `series`)."""
    return [{"series": f"{r['impl']} {r['dtype']}", **r} for r in rows if not r["oom"]]


def sweep(cfg: LatencyConfig, device: str) -> list[dict]:
    cuda = device.startswith("cuda")
    dtypes = cfg.cuda_dtypes if cuda else cfg.cpu_dtypes
    ns, naive_ns = (cfg.cuda_n, cfg.naive_cuda_n) if cuda else (cfg.cpu_n, cfg.naive_cpu_n)
    warmup, reps = (cfg.cuda_warmup, cfg.cuda_reps) if cuda else (cfg.cpu_warmup, cfg.cpu_reps)
    # the naive path only in the first dtype: it is the memory story, not a dtype comparison
    plan = [("sdpa", dt, n) for dt in dtypes for n in ns] + [("naive", dtypes[0], n) for n in naive_ns]
    gpu = gpu_info(device) if cuda else {}
    rows = []
    bar = progress(len(plan), f"latency {device}")
    for impl, dt, n in plan:
        row = bm.run_point(impl, n, heads=cfg.heads, d_head=cfg.d_head, dtype=DTYPES[dt], device=device,
                           warmup=warmup, reps=reps, seed=cfg.seed)
        row["dtype"] = dt
        peak = bm.peak_tflops(gpu.get("gpu_name", ""), dt) if cuda and dt != "fp32" else None
        if peak and "tflops" in row:
            row["frac_peak"] = row["tflops"] / peak
        rows.append(row)
        bar.update(1)
    bar.close()
    return rows


def metrics_from(rows: list[dict], cfg: LatencyConfig, device: str) -> dict:
    cuda = device.startswith("cuda")
    env = environment(device)
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
        for dt in cfg.cuda_dtypes:
            peak = bm.peak_tflops(gpu.get("gpu_name", ""), dt) if dt != "fp32" else None
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
            for k in ("median_ms", "p20_ms", "p80_ms", "cv", "cold_ms", "tflops", "frac_peak", "peak_bytes"):
                if k in p:
                    sec[f"n{n}_{k}"] = p[k]
        if len(ok) >= 2:
            sec["exponent"] = bm.fit_exponent([p["n"] for p in ok], [p["median_ms"] for p in ok])
            sec["exponent_top3"] = bm.fit_exponent([p["n"] for p in ok[-3:]], [p["median_ms"] for p in ok[-3:]])
            sec["ratio_last_first"] = ok[-1]["median_ms"] / ok[0]["median_ms"]
            sec["n_ratio_last_first"] = ok[-1]["n"] / ok[0]["n"]
        sec["oom_count"] = len(pts) - len(ok)
        out[name] = sec
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    ap.add_argument("--device", help="override latency.device (cpu, cuda, cuda:N, auto)")
    ap.add_argument("--out-root", default=".", help="write metrics/ and plots/ under this folder (default: .)")
    args = ap.parse_args()
    cfg = load_section(LatencyConfig, "latency", args.params)
    device = resolve_device(args.device or cfg.device, "--device" if args.device else "latency.device")
    setup_determinism(cfg.threads, device)
    if device.startswith("cuda:"):
        torch.cuda.set_device(int(device.split(":", 1)[1]))  # events and memory stats follow the current device
    root = Path(args.out_root)

    load_start = os.getloadavg()[0]
    rows = sweep(cfg, device)
    metrics = metrics_from(rows, cfg, device)
    metrics["setup"]["load_avg_1m_start"] = load_start  # other processes sharing the CPU
    env = environment(device)
    where = env.get("gpu_name", device) if device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    write_csv(root / "plots/latency/latency.csv", rows, COLUMNS)
    write_csv(root / "plots/latency/median_ms.csv", series_rows(rows), SERIES_COLUMNS)
    latency_figure(rows, root / "plots/latency/latency.png",
                   f"causal attention forward, batch 1, {cfg.heads} heads x d_head {cfg.d_head} ({where})")
    write_json(root / "metrics/latency.json", metrics)
    write_json(root / "metrics/env/latency.json", env)
    for name, sec in metrics.items():
        if "exponent" in sec:
            print(f"latency {name}: exponent {sec['exponent']:.2f}, x{sec['ratio_last_first']:.0f} time for "
                  f"x{sec['n_ratio_last_first']:.0f} n, cold first call {sec['cold_first_ms']:.2f} ms, "
                  f"{sec['oom_count']} OOM")


if __name__ == "__main__":
    run_stage(main)
