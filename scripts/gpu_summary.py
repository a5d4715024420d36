"""The figures of a scripts/gpu_check.sh run, as lines for its SUMMARY.txt: per SDPA series the
largest n measured (median, spread, TFLOP/s, % of the dense peak, the backend), the naive path's
memory against the fused kernel's, the latency exponents, and the KV-cache speed-up.

    python scripts/gpu_summary.py <out-root>   # the folder holding metrics/latency.json, metrics/kv_cache.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def ns(sec: dict, key: str) -> list[int]:
    return sorted(int(m.group(1)) for k in sec if (m := re.fullmatch(rf"n(\d+)_{key}", k)))


def latency_lines(m: dict) -> list[str]:
    peaks = ", ".join(f"{k} {v}" for k, v in sorted(m.get("device", {}).items()) if k.startswith("peak_tflops"))
    out = [f"latency on {'CUDA' if m.get('setup', {}).get('cuda') else 'the CPU'}" + (f": {peaks}" if peaks else "")]
    for name, sec in sorted(m.items()):
        if not isinstance(sec, dict) or "oom_count" not in sec:
            continue
        measured = ns(sec, "median_ms")
        if measured:
            n = measured[-1]
            pct = f", {100 * sec[f'n{n}_frac_peak']:.1f}% of peak" if f"n{n}_frac_peak" in sec else ""
            tf = f", {sec[f'n{n}_tflops']:.3g} TFLOP/s" if f"n{n}_tflops" in sec else ""
            out.append(f"  {name} n {n}: median {sec[f'n{n}_median_ms']:.4g} ms "
                       f"(p20 {sec[f'n{n}_p20_ms']:.4g}, p80 {sec[f'n{n}_p80_ms']:.4g}){tf}{pct}"
                       + (f", backend {sec['backend']}" if "backend" in sec else ""))
        fits = ", ".join(f"{k} {sec[k]:.2f}" for k in ("exponent", "exponent_median", "exponent_occupied")
                         if k in sec)
        ooms = [int(k[1:].split("_")[0]) for k in sec if k.endswith("_oom")]
        out.append(f"  {name}: {fits or 'no fit'}; out of memory at n {sorted(ooms) or 'none'}")
    for dt in sorted({k.split("_", 1)[1] for k in m if k.startswith("naive_")}):
        naive, sdpa = m.get(f"naive_{dt}", {}), m.get(f"sdpa_{dt}", {})
        both = sorted(set(ns(naive, "peak_bytes")) & set(ns(sdpa, "peak_bytes")))
        if both:
            n = both[-1]
            a, b = naive[f"n{n}_peak_bytes"], sdpa[f"n{n}_peak_bytes"]
            out.append(f"  memory {dt} n {n}: naive {a / 2**20:.1f} MiB, fused {b / 2**20:.1f} MiB "
                       f"({a / b:.0f}x)" if b else f"  memory {dt} n {n}: naive {a} B, fused {b} B")
    return out


def kv_lines(m: dict) -> list[str]:
    lat = m.get("latency", {})
    n = sorted(int(m.group(1)) for k in lat if (m := re.fullmatch(r"speedup_n(\d+)", k)))
    return [f"kv_cache on {'CUDA' if lat.get('cuda') else 'the CPU'}: speed-up at context {n[-1]} "
            f"{lat[f'speedup_n{n[-1]}']:.3g}x, generation {lat.get('gen_speedup', float('nan')):.3g}x"] if n else []


def main(root: Path) -> None:
    for name, fn in (("latency", latency_lines), ("kv_cache", kv_lines)):
        path = root / "metrics" / f"{name}.json"
        if path.is_file():
            print("\n".join(fn(json.loads(path.read_text(encoding="utf-8")))))
        else:
            print(f"{name}: no metrics (the stage failed: see logs/{name}.log)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
