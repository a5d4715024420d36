"""DVC stage `latency`: what O(n^2) attention costs in time and memory (§1.14.2, §1.11.5).

Causal attention forward, batch 1, `heads` heads of `d_head`, for each n:
  sdpa   F.scaled_dot_product_attention (flash / memory-efficient kernels on CUDA)
  naive  attention.attention, which materializes the n x n scores and weights
Cold first call reported apart from the warm median (p20/p80, CV) of the timed
repetitions; achieved TFLOP/s counts the causal half, 2 n^2 d h (see
attnrepro.experiments.latency); on CUDA also the fraction of the device's dense fp16/bf16
peak (known GPUs only) and the peak memory (torch.cuda.max_memory_allocated).
An out-of-memory error is a data point (oom = 1), not a crash. The exponent is
the log-log least-squares slope of the median time in n.

Device `auto` uses CUDA when present (cuda_* params) and otherwise runs a CPU
sweep with smaller n and fewer repetitions (cpu_* params); metrics.setup.cuda
says which, and GPU-only keys are absent (not zero) on CPU.

Outputs: metrics/latency.json (timings: they vary run to run), metrics/env/latency.json
(device fingerprint: CPU, RAM, GPU name/driver/memory via NVML), plots/latency/latency.csv
(every point, OOM rows included: a table), plots/latency/mean_ms.csv (the plotted series:
one row per measured point, its `series` "<impl> <dtype>" a line of its own in `dvc plots`)
and latency.png.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.experiments import latency
from attnrepro.experiments.latency import COLUMNS, SERIES_COLUMNS, LatencyConfig
from attnrepro.figures import latency_figure
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def options(ap) -> None:
    ap.add_argument("--device", help="override latency.device (cpu, cuda, cuda:N, auto)")
    ap.add_argument("--out-root", default=".", help="write metrics/ and plots/ under this folder (default: .)")


def main(st: Stage) -> None:
    cfg = st.section(LatencyConfig, "latency")
    device = st.pin(st.args.device or cfg.device, cfg.threads, "--device" if st.args.device else "latency.device",
                    timing=True)
    result = latency.run(cfg, device)
    root = Path(st.args.out_root)
    write_csv(root / "plots/latency/latency.csv", result.rows, COLUMNS)
    write_csv(root / "plots/latency/mean_ms.csv", result.series, SERIES_COLUMNS)
    latency_figure(result.rows, root / "plots/latency/latency.png", result.title)
    write_json(root / "metrics/latency.json", result.metrics)
    write_json(root / "metrics/env/latency.json", result.env)
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, arguments=options)
