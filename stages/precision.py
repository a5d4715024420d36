"""DVC stage `precision`: fp32 / fp16 / bf16 behaviour of attention (§1.6.4, §1.11.3, §1.16, §1.17).

Writes metrics/precision.json (numbers only; flags as 0/1), metrics/env/precision.json
and plots/precision/forward.csv (one row per d_head x scaled x softmax x dtype x q/k scale).
Deterministic: every draw is seeded, nothing is timed.

Sections of the metrics file:
  finfo         max, ln(max), eps, tiny per dtype
  round_trip    1.001 stored in fp16 / bf16
  softmax       naive vs stable softmax of softmax_logits in fp64/fp32/fp16/bf16
  overflow      inf count of exp(float32 N(0, std)) over overflow_shape (numpy default_rng)
  four_sigma    the footnote's sqrt(d) logit std, 4 sigma vs ln(65504) = 11.1
  forward_<qk>  attention.attention forward in each dtype: share of non-finite outputs
  mask          additive-mask pitfalls (checkpoint 16)
  accumulation  summing a 4096-position softmax row in low precision (checkpoint 17)
  parity        attention vs F.scaled_dot_product_attention, hand-written backward vs autograd (fp64)
"""

from __future__ import annotations

import argparse
import math

from attnrepro.experiments import precision as nm
from attnrepro.config import load_section, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import write_csv, write_json
from attnrepro.experiments.precision import LOW, PrecisionConfig
from attnrepro.runtime import progress


def finite_only(d: dict) -> dict:
    """Drop nan/inf values (their *_nan / *_inf flags say what happened)."""
    return {k: v for k, v in d.items() if not (isinstance(v, float) and not math.isfinite(v))}


def mask_tag(v: float) -> str:
    return "m" + f"{abs(v):.0e}".replace("e+0", "e").replace("e+", "e")


def forward_grid(cfg: PrecisionConfig) -> tuple[dict, list[dict]]:
    combos = [(label, std, d, scaled, stable, dt) for label, std in cfg.qk_stds_published.items()
              for d in cfg.d_heads for scaled in (True, False) for stable in (True, False) for dt in cfg.dtypes]
    sections: dict[str, dict] = {}
    rows = []
    bar = progress(len(combos), "precision forward")
    for label, std, d, scaled, stable, dt in combos:
        r = nm.forward_overflow(d, qk_std=std, dtype=dt, scaled=scaled, stable=stable, seed=cfg.seed,
                                batch=cfg.batch, heads=cfg.heads, seq=cfg.seq)
        tag = f"{dt}_{'scaled' if scaled else 'unscaled'}_{'stable' if stable else 'naive'}_d{d}"
        sec = sections.setdefault(f"forward_{label}", {"qk_std": std})
        sec[f"{tag}_nonfinite"] = r["nonfinite_frac"]
        if dt == "fp32" and stable:
            sec[f"{'scaled' if scaled else 'unscaled'}_d{d}_logit_absmax"] = r["logit_absmax"]
        rows.append({"qk": label, "qk_std": std, "d_head": d, "scaled": int(scaled), "stable": int(stable),
                     "dtype": dt, **r})
        bar.update(1)
    bar.close()
    return sections, rows


def mask_section(cfg: PrecisionConfig) -> dict:
    out = {}
    for dt in ("fp16", "bf16"):
        val = nm.additive_mask_value(-1e9, dt)
        out[f"neg1e9_{dt}_is_inf"] = int(math.isinf(val))
        if math.isfinite(val):
            out[f"neg1e9_{dt}_value"] = val
        out[f"fullrow_add1e9_{dt}_nan"] = nm.fully_masked_row(-1e9, dt)["nan"]
        out[f"fullrow_neginf_{dt}_nan"] = nm.fully_masked_row(None, dt)["nan"]
    out["fullrow_add1e9_fp32_nan"] = nm.fully_masked_row(-1e9, "fp32")["nan"]
    out["fullrow_add1e9_fp32_w0"] = nm.fully_masked_row(-1e9, "fp32")["w0"]
    for label, std in cfg.mask_logit_stds_published.items():
        for mv in cfg.mask_values:
            for dt in cfg.dtypes:
                r = nm.additive_mask_leak(std, mv, dtype=dt, seq=cfg.seq, seed=cfg.seed)
                key = f"{label}_{mask_tag(mv)}_{dt}"
                out[f"{key}_leak_mean"] = r["leak_mean"]
                out[f"{key}_leak_max"] = r["leak_max"]
                out[f"{key}_nan"] = r["nan"]
        out[f"{label}_logit_absmax"] = nm.additive_mask_leak(std, -1e9, seq=cfg.seq, seed=cfg.seed)["logit_absmax"]
    return finite_only(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = ap.parse_args()
    cfg = load_section(PrecisionConfig, "precision", args.params)
    setup_determinism(cfg.threads, "cpu")

    metrics: dict[str, dict] = {}
    metrics["finfo"] = {f"{dt}_{k}": v for dt, row in nm.finfo_table(LOW).items() for k, v in row.items()}
    fp16, bf16 = nm.round_trip(1.001, "fp16"), nm.round_trip(1.001, "bf16")
    metrics["round_trip"] = {"fp16_1p001": fp16, "bf16_1p001": bf16, "fp32_1p001": nm.round_trip(1.001, "fp32"),
                             "fp16_distinguishes": int(fp16 != 1.0), "bf16_distinguishes": int(bf16 != 1.0)}
    metrics["softmax"] = finite_only({f"{dt}_{k}": v for dt, row in nm.softmax_demo(cfg.softmax_logits).items()
                                      for k, v in row.items()})
    size = math.prod(cfg.overflow_shape)
    published = cfg.overflow_stds_published
    metrics["overflow"] = {"size": size, **{f"{label}_std": std for label, std in published.items()},
                           **{f"{label}_inf": nm.exp_overflow_count(std, tuple(cfg.overflow_shape), cfg.overflow_seed)
                              for label, std in published.items()}}
    four = nm.four_sigma_table(cfg.sigma_d_heads)
    metrics["four_sigma"] = {"fp16_ln_max": metrics["finfo"]["fp16_ln_max"],
                             **{f"{d}_{k}": v for d, row in four.items() for k, v in row.items()
                                if k in ("std", "four_sigma", "overflows_fp16")}}
    sections, rows = forward_grid(cfg)
    metrics.update(sections)
    metrics["mask"] = mask_section(cfg)
    metrics["accumulation"] = nm.accumulation(cfg.accum_n, seed=cfg.seed)
    shape = tuple(cfg.parity_shape)
    bwd = nm.backward_parity(cfg.seed, shape)
    bwd_nc = nm.backward_parity(cfg.seed, shape, causal=False)
    metrics["parity"] = {"sdpa_causal_max_abs_err": nm.sdpa_parity(cfg.seed, shape),
                         "sdpa_full_max_abs_err": nm.sdpa_parity(cfg.seed, shape, causal=False),
                         **{f"bwd_causal_{k}_max_abs_err": v for k, v in bwd.items()},
                         **{f"bwd_full_{k}_max_abs_err": v for k, v in bwd_nc.items()}}

    write_csv("plots/precision/forward.csv", rows)
    write_json("metrics/precision.json", metrics)
    write_json("metrics/env/precision.json", environment("cpu"))
    sm = metrics["softmax"]
    print(f"precision: naive softmax nan fp64/fp32/fp16/bf16 = {sm['fp64_naive_nan']}/{sm['fp32_naive_nan']}/"
          f"{sm['fp16_naive_nan']}/{sm['bf16_naive_nan']}; exp overflow "
          + ", ".join(f"{k} {v}/{size}" for k, v in metrics["overflow"].items() if k.endswith("_inf"))
          + f"; sdpa parity {metrics['parity']['sdpa_causal_max_abs_err']:.2e}")


if __name__ == "__main__":
    run_stage(main)
