"""DVC stage `heads`: what the 8 heads of the trained d32_scaled model do (§1.8.5-1.8.6).

On fixed validation sequences: per layer/head mean normalized entropy, diagonal
weight, previous-token weight, mean attention distance and, the chapter's exercise 3
(§1.20.3), the spread over query positions of the attention centroid distance
dist_i = sum_j (i-j) p_ij: a head whose centroid moves a lot between positions (near for
some queries, far for others) is "conditional". Uniform causal attention already spreads
by the growth of i alone (uniform_distance_std); a conditional head spreads more. Also
heatmaps per layer, and head ablation (zero the head's d_head input columns of
attn.proj.weight, loss change on fixed validation batches, restore bit-exactly).

Writes metrics/heads.json (l<L>h<H>.entropy, ..., .distance_std, layer<L>.*, base_loss,
the most conditional head and the uniform baseline), plots/heads/heads.csv and
plots/heads/layer<L>.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from attnrepro.audit.load import AttentionConfig
from attnrepro.config import UserError, load_section, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import write_csv, write_json
from attnrepro.model import load_checkpoint
from attnrepro.figures import cjk_font, heads_figure
from attnrepro.measure.probes import (HeadsConfig, ablate_heads, attention_maps, fixed_sequences, head_stats,
                              uniform_distance_std)
from attnrepro.runtime import progress
from attnrepro.training import fixed_batches, load_tokens

CORPUS = Path("data/corpus")
STATS = ("entropy", "diag", "prev", "distance", "distance_std")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = load_section(HeadsConfig, "heads", args.params)
    setup_determinism(cfg.threads, "cpu")

    model = load_checkpoint(cfg.checkpoint, "heads.checkpoint")
    load_section(AttentionConfig, "attention", args.params).check_checkpoint(model.cfg.impl, "heads.checkpoint")
    if cfg.seq_len > model.cfg.block_size:
        raise UserError(f"heads.seq_len: got {cfg.seq_len}, expected at most the model's block_size "
                        f"{model.cfg.block_size}")
    itos = json.loads((CORPUS / "vocab.json").read_text(encoding="utf-8"))
    val_ids = load_tokens(CORPUS / "val.npy")
    seqs = fixed_sequences(val_ids, cfg.n_seqs, cfg.seq_len, cfg.seq_seed)
    maps = attention_maps(model, seqs)
    rows = head_stats(maps)

    batches = fixed_batches(val_ids, model.cfg.block_size, cfg.ablation_batch_size, cfg.ablation_batches,
                            cfg.ablation_seed)
    bar = progress(len(rows), "heads ablation")
    base, ablation = ablate_heads(model, batches, tick=lambda: bar.update(1))
    bar.close()
    for r, a in zip(rows, ablation):
        r["ablation_loss"], r["ablation_delta"] = a["loss"], a["delta"]

    metrics = {f"l{r['layer']}h{r['head']}": {k: r[k] for k in (*STATS, "ablation_delta")} for r in rows}
    for li in range(model.cfg.n_layer):
        lr = [r for r in rows if r["layer"] == li]
        metrics[f"layer{li}"] = {k: float(np.mean([r[k] for r in lr])) for k in (*STATS, "ablation_delta")}
    metrics.update({
        "base_loss": base,
        "layer1_minus_layer0_distance": (metrics["layer1"]["distance"] - metrics["layer0"]["distance"]
                                         if model.cfg.n_layer > 1 else 0.0),
        "max_prev": max(r["prev"] for r in rows),
        "entropy_spread": max(r["entropy"] for r in rows) - min(r["entropy"] for r in rows),
        "max_ablation_delta": max(r["ablation_delta"] for r in rows),
        "n_positions": cfg.n_seqs * cfg.seq_len,
    })
    most = max(rows, key=lambda r: r["distance_std"])
    metrics["conditional"] = {"layer": most["layer"], "head": most["head"], "distance_std": most["distance_std"],
                              "uniform_distance_std": uniform_distance_std(cfg.seq_len)}
    write_json("metrics/heads.json", metrics)
    write_json("metrics/env/heads.json", environment("cpu"))
    out = Path("plots/heads")
    write_csv(out / "heads.csv", rows)
    for li, w in enumerate(maps):
        heads_figure(w, seqs.tolist(), itos, li, out / f"layer{li}.png")
    if cjk_font() is None:
        print("note: no CJK font found, heatmap axes show token ids")
    for r in rows:
        print(f"l{r['layer']}h{r['head']}  entropy {r['entropy']:.3f}  diag {r['diag']:.3f}  prev {r['prev']:.3f}  "
              f"distance {r['distance']:.2f} (sd over positions {r['distance_std']:.2f})  "
              f"ablation {r['ablation_delta']:+.4f}")
    c = metrics["conditional"]
    print(f"most conditional head: l{c['layer']}h{c['head']} (centroid sd {c['distance_std']:.2f}; "
          f"uniform attention {c['uniform_distance_std']:.2f})")


if __name__ == "__main__":
    run_stage(main)
