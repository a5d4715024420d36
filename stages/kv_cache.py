"""DVC stage `kv_cache`: KV-cache memory (eq. 1.20-1.21, §1.8.8) and a real cache for TinyGPT.

1. Formula figures for the presets (Llama-2-70B shape as MHA/GQA/MQA, the two TinyGPT
   configs) and the attention-matrix cases of eq. 1.45 / §1.11.5.
2. A preallocated KV cache on a TinyGPT with a long block (kv_cache.model; untrained
   weights, initialized with `seed`: timing and token identity do not need training):
   allocated bytes vs the formula, greedy and sampled generation with and without the
   cache (must be token-identical), and the per-token latency against context length.
   On CUDA also torch.cuda.memory_allocated before/after building the cache.

Outputs: metrics/kv_cache.json (latency figures are timings: they vary run to run),
metrics/env/kv_cache.json, plots/kv_cache/latency.csv and latency.png.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.envinfo import environment
from attnrepro.experiments import kv_cache
from attnrepro.experiments.kv_cache import ROW_COLUMNS, KVCacheConfig
from attnrepro.figures import kv_latency_figure
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def options(ap) -> None:
    ap.add_argument("--device", help="override kv_cache.device (cpu, cuda, cuda:N, auto)")
    ap.add_argument("--out-root", default=".", help="write metrics/ and plots/ under this folder (default: .)")


def main(st: Stage) -> None:
    cfg = st.section(KVCacheConfig, "kv_cache")
    device = st.pin(st.args.device or cfg.device, cfg.threads, "--device" if st.args.device else "kv_cache.device",
                    timing=True)
    result = kv_cache.run(cfg, device)
    root = Path(st.args.out_root)
    write_csv(root / "plots/kv_cache/latency.csv", result.rows, ROW_COLUMNS)
    kv_latency_figure(result.rows, root / "plots/kv_cache/latency.png", result.title)
    write_json(root / "metrics/kv_cache.json", result.metrics)
    write_json(root / "metrics/env/kv_cache.json", environment(device))
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, arguments=options)
