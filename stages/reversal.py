"""DVC stage `reversal`: the digit-reversal companion experiment (spec §8).

Trains every variant of params `reversal.variants` (default: 4 heads, 1 head, no
causal mask) from identical initial weights on the same pre-drawn batches (one
sweep on the run engine: the variants train in parallel, unchanged ones come from
the run store), then
scores greedy generation from the 8-token prompt on the test set, measures the
reverse-alignment attention on one test sample, toggles the mask at inference and
checks parity with torch.nn.MultiheadAttention.

Writes metrics/reversal.json, metrics/env/reversal.json, plots/reversal/
(losses.csv: step and <variant>_{train,val,batch}_loss, one column per series for `dvc plots`;
loss_curves.png, attention_<variant>.png) and data/reversal/
(<variant>.pt checkpoints, predictions_<variant>.csv on the test set).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from attnrepro.figures import attention_grid, loss_curves
from attnrepro.config import load_section, read_params, run_stage
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.io import atomic_dir, write_csv, write_json
from attnrepro.model import load_checkpoint
from attnrepro.reversal import (ALIGN_KEYS, ALIGN_QUERIES, BOS, EOS, PROMPT_LEN, SEP, ReversalConfig,
                                evaluate_variant, loss_rows, make_splits, run_spec)
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

PLOTS = Path("plots/reversal")
NAMES = {BOS: "BOS", SEP: "SEP", EOS: "EOS"}


def wide_losses(histories: dict[str, list[dict]]) -> list[dict]:
    """One row per evaluation step, one column per variant and loss (<variant>_train_loss, ...)."""
    steps = sorted({r["step"] for hist in histories.values() for r in hist})
    cols = {(name, r["step"]): r for name, hist in histories.items() for r in hist}
    return [{"step": s, **{f"{name}_{k}": cols.get((name, s), {}).get(k) for name in histories
                           for k in ("train_loss", "val_loss", "batch_loss")}} for s in steps]


def token_labels(seq: torch.Tensor) -> list[str]:
    return [NAMES.get(t, str(t)) for t in seq[:-1].tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    cfg = load_section(ReversalConfig, "reversal", args.params)
    engine = engine_config(read_params(args.params), args.scheduler, args.workers)
    records = run_sweep("reversal", [run_spec(cfg, name) for name in cfg.variants], {}, engine)
    require_ok(records, "reversal")

    setup_determinism(cfg.threads, "cpu")  # the evaluation below runs here
    splits = make_splits(cfg.n_train, cfg.n_val, cfg.n_test, cfg.data_seed)
    models, metrics, histories, preds, maps = {}, {}, {}, {}, {}
    for name, rec in zip(cfg.variants, records):
        models[name] = load_checkpoint(rec.path / "model.pt", f"reversal run {name}")
        histories[name] = loss_rows(rec.read("evals.json"), rec.read("history.json"))
        metrics[name], preds[name], maps[name] = evaluate_variant(models[name], splits, histories[name], cfg)
        m = metrics[name]
        print(f"{name}: digit_acc {m['digit_acc']:.4f} seq_acc {m['seq_acc']:.4f} "
              f"align_l0 {m['align_l0']:.4f} align_l1 {m['align_l1']:.4f} "
              f"prefix_change off {m['prefix_change_mask_off']:.6f} on {m['prefix_change_mask_on']:.1g}")

    test = splits["test"]
    sample = test[cfg.sample_index]
    with atomic_dir(Path("data/reversal")) as tmp:
        for name, rec in zip(cfg.variants, records):
            shutil.copyfile(rec.path / "model.pt", tmp / f"{name}.pt")
            pred = preds[name]
            write_csv(tmp / f"predictions_{name}.csv", [
                {"index": i, "prompt": " ".join(map(str, test[i, 1:PROMPT_LEN - 1].tolist())),
                 "truth": " ".join(map(str, test[i, PROMPT_LEN:].tolist())),
                 "predicted": " ".join(map(str, pred[i].tolist())),
                 "correct": int(bool((pred[i] == test[i, PROMPT_LEN:]).all()))}
                for i in range(len(test))])
    with atomic_dir(PLOTS) as pdir:  # the whole folder is one DVC out
        write_csv(pdir / "losses.csv", wide_losses(histories))
        loss_curves(pdir / "loss_curves.png", histories, "digit reversal: full-set answer loss")
        boxes = list(zip(ALIGN_QUERIES, ALIGN_KEYS))
        for name, m in maps.items():
            attention_grid(pdir / f"attention_{name}.png", m.numpy(), token_labels(sample),
                           f"reversal {name}: test sample {cfg.sample_index} (boxes: reverse alignment)",
                           [f"layer {i}" for i in range(m.shape[0])], boxes=boxes)
    config = {"n_train": cfg.n_train, "n_val": cfg.n_val, "n_test": cfg.n_test, "steps": cfg.steps,
              "batch_size": cfg.batch_size, "lr": cfg.lr}
    write_json("metrics/reversal.json", {"config": config, **metrics})
    write_json("metrics/env/reversal.json", stage_environment("cpu", [r.read("env.json") for r in records]))


if __name__ == "__main__":
    run_stage(main)
