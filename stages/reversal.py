"""DVC stage `reversal`: the digit-reversal companion experiment (spec §8).

Trains every variant of params `reversal.variants` (default: 4 heads, 1 head, no
causal mask) from identical initial weights on the same pre-drawn batches, then
scores greedy generation from the 8-token prompt on the test set, measures the
reverse-alignment attention on one test sample, toggles the mask at inference and
checks parity with torch.nn.MultiheadAttention.

Writes metrics/reversal.json, metrics/env/reversal.json, plots/reversal/
(losses.csv, loss_curves.png, attention_<variant>.png) and data/reversal/
(<variant>.pt checkpoints, predictions_<variant>.csv on the test set).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from attnrepro.companion_plots import attention_grid, loss_curves
from attnrepro.config import load_section, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import atomic_dir, write_csv, write_json
from attnrepro.reversal import (ALIGN_KEYS, ALIGN_QUERIES, BOS, EOS, PROMPT_LEN, SEP, ReversalConfig,
                                batch_indices, build_models, evaluate_variant, make_splits, train_model)
from attnrepro.runtime import progress

PLOTS = Path("plots/reversal")
NAMES = {BOS: "BOS", SEP: "SEP", EOS: "EOS"}


def token_labels(seq: torch.Tensor) -> list[str]:
    return [NAMES.get(t, str(t)) for t in seq[:-1].tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = load_section(ReversalConfig, "reversal", args.params)
    setup_determinism(cfg.threads, "cpu")

    splits = make_splits(cfg.n_train, cfg.n_val, cfg.n_test, cfg.data_seed)
    indices = batch_indices(cfg.n_train, cfg.steps, cfg.batch_size, cfg.batch_seed)
    models = build_models(cfg)

    metrics, histories, preds, maps = {}, {}, {}, {}
    for name, model in models.items():
        bar = progress(cfg.steps, f"reversal {name}")

        def tick(step: int, loss: float) -> None:
            bar.update(1)
            if step % 50 == 0:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

        histories[name] = train_model(model, splits, indices, cfg, progress=tick)
        bar.close()
        metrics[name], preds[name], maps[name] = evaluate_variant(model, splits, histories[name], cfg)
        m = metrics[name]
        print(f"{name}: digit_acc {m['digit_acc']:.4f} seq_acc {m['seq_acc']:.4f} "
              f"align_l0 {m['align_l0']:.4f} align_l1 {m['align_l1']:.4f} "
              f"prefix_change off {m['prefix_change_mask_off']:.6f} on {m['prefix_change_mask_on']:.1g}")

    test = splits["test"]
    sample = test[cfg.sample_index]
    with atomic_dir(Path("data/reversal")) as tmp:
        for name, model in models.items():
            torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()},
                       tmp / f"{name}.pt")
            pred = preds[name]
            write_csv(tmp / f"predictions_{name}.csv", [
                {"index": i, "prompt": " ".join(map(str, test[i, 1:PROMPT_LEN - 1].tolist())),
                 "truth": " ".join(map(str, test[i, PROMPT_LEN:].tolist())),
                 "predicted": " ".join(map(str, pred[i].tolist())),
                 "correct": int(bool((pred[i] == test[i, PROMPT_LEN:]).all()))}
                for i in range(len(test))])
    with atomic_dir(PLOTS) as pdir:  # the whole folder is one DVC out
        rows = [{"variant": name, **r} for name, hist in histories.items() for r in hist]
        write_csv(pdir / "losses.csv", rows, ["variant", "step", "train_loss", "val_loss", "batch_loss"])
        loss_curves(pdir / "loss_curves.png", histories, "digit reversal: full-set answer loss")
        boxes = list(zip(ALIGN_QUERIES, ALIGN_KEYS))
        for name, m in maps.items():
            attention_grid(pdir / f"attention_{name}.png", m.numpy(), token_labels(sample),
                           f"reversal {name}: test sample {cfg.sample_index} (boxes: reverse alignment)",
                           [f"layer {i}" for i in range(m.shape[0])], boxes=boxes)
    config = {"n_train": cfg.n_train, "n_val": cfg.n_val, "n_test": cfg.n_test, "steps": cfg.steps,
              "batch_size": cfg.batch_size, "lr": cfg.lr}
    write_json("metrics/reversal.json", {"config": config, **metrics})
    write_json("metrics/env/reversal.json", environment("cpu"))


if __name__ == "__main__":
    run_stage(main)
