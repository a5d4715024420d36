"""DVC stage `init_sweep`: how large are the raw q.k logits at initialization? (§1.3, §1.19.1)

Single-head, single-layer TinyGPT per d_head = d_model, no training, the same random
token batches for every d_head; its attention is params `attention.impl` (the entropy
is of that implementation's weights; the logits are q.k, computed alike for every one).
Writes metrics/init_sweep.json (d<N>.logit_std, d<N>.entropy, ... and fit.*),
plots/init_sweep/sweep.csv and sweep.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnrepro.audit.load import AttentionConfig
from attnrepro.config import load_section, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import write_csv, write_json
from attnrepro.figures import init_sweep_figure
from attnrepro.measure.probes import InitSweepConfig, init_model, measure_init, predictions, random_batches, sweep_fit
from attnrepro.runtime import progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = load_section(InitSweepConfig, "init_sweep", args.params)
    impl = load_section(AttentionConfig, "attention", args.params).model_impl()
    setup_determinism(cfg.threads, "cpu")

    batches = random_batches(cfg.n_batches, cfg.batch_size, cfg.block_size, cfg.token_low, cfg.vocab_size,
                             cfg.batch_seed)
    rows = []
    bar = progress(len(cfg.d_heads) * cfg.n_batches, "init_sweep")
    for d in cfg.d_heads:
        model = init_model(d, vocab_size=cfg.vocab_size, block_size=cfg.block_size, init_std=cfg.init_std,
                           seed=cfg.model_seed, impl=impl)
        m = measure_init(model, batches, tick=lambda: bar.update(1))
        p = predictions(d, cfg.init_std)
        rows.append({"d_head": d, **m, **p, "ratio_sqrt_d": m["logit_std"] / p["theory_sqrt_d"],
                     "ratio_varprop": m["logit_std"] / p["pred_varprop"]})
    bar.close()

    metrics = {f"d{r['d_head']}": {k: v for k, v in r.items() if k != "d_head"} for r in rows}
    metrics["fit"] = sweep_fit(rows)
    write_json("metrics/init_sweep.json", metrics)
    write_json("metrics/env/init_sweep.json", environment("cpu"))
    out = Path("plots/init_sweep")
    write_csv(out / "sweep.csv", rows)
    init_sweep_figure(rows, out / "sweep.png")
    for r in rows:
        print(f"d{r['d_head']:<4} std {r['logit_std']:.4f} (pooled {r['logit_std_pooled']:.4f})  "
              f"sqrt(d) {r['theory_sqrt_d']:.2f} ratio {r['ratio_sqrt_d']:.4f}  "
              f"v*sqrt(d) {r['pred_varprop']:.4f} ratio {r['ratio_varprop']:.3f}  entropy {r['entropy']:.4f}")
    print(f"fitted log-log slope {metrics['fit']['slope_measured']:.3f}")


if __name__ == "__main__":
    run_stage(main)
