"""DVC stage `init_sweep`: how large are the raw q.k logits at initialization? (§1.3, §1.19.1)

Single-head, single-layer TinyGPT per d_head = d_model, no training, the same random
token batches for every d_head. Writes metrics/init_sweep.json (d<N>.logit_std,
d<N>.entropy, ... and fit.*), plots/init_sweep/sweep.csv and sweep.png.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from attnrepro.config import load_section, require, require_positive, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import write_csv, write_json
from attnrepro.probe_plots import init_sweep_figure
from attnrepro.probes import init_model, measure_init, predictions, random_batches, sweep_fit
from attnrepro.runtime import progress


@dataclass
class InitSweepConfig:
    d_heads: list[int] = field(default_factory=lambda: [32, 64, 128, 256, 512])
    vocab_size: int = 300
    block_size: int = 32
    batch_size: int = 8
    n_batches: int = 400
    token_low: int = 2  # tokens drawn from randint(token_low, vocab_size)
    init_std: float = 0.02  # sigma of the N(0, sigma^2) init, also the prediction's sigma
    model_seed: int = 0  # torch.manual_seed before building each model
    batch_seed: int = 0  # generator of the token batches (shared by every d_head)
    threads: int = 2

    def validate(self, prefix: str = "init_sweep") -> None:
        require(len(self.d_heads) >= 2 and all(d > 0 for d in self.d_heads), f"{prefix}.d_heads",
                self.d_heads, "at least two positive integers")
        require_positive(self, ("block_size", "batch_size", "n_batches", "threads"), prefix)
        require(0 <= self.token_low < self.vocab_size, f"{prefix}.token_low", self.token_low,
                f"in [0, vocab_size={self.vocab_size})")
        require(self.init_std > 0, f"{prefix}.init_std", self.init_std, "a positive number")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = load_section(InitSweepConfig, "init_sweep", args.params)
    setup_determinism(cfg.threads, "cpu")

    batches = random_batches(cfg.n_batches, cfg.batch_size, cfg.block_size, cfg.token_low, cfg.vocab_size,
                             cfg.batch_seed)
    rows = []
    bar = progress(len(cfg.d_heads) * cfg.n_batches, "init_sweep")
    for d in cfg.d_heads:
        model = init_model(d, vocab_size=cfg.vocab_size, block_size=cfg.block_size, init_std=cfg.init_std,
                           seed=cfg.model_seed)
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
