"""DVC stage `train`: the controlled sqrt(d_k) comparison, every variant of train.variants.

Every variant uses the same seed, the same initialization draw (per model shape)
and the same batches in the same order; the only differences are the model
shape and the `scaled` switch. The attention is params `attention.impl` (the
builtin, or a callable with SDPA's signature: see `attnrepro audit`). The
variants are one sweep on the run engine (attnrepro.sweep): they train in
parallel, and a variant whose settings did not change is taken from the run
store instead of being trained again.

Writes data/train/<variant>/ (the run's result folder: checkpoint, summary.json,
history.json, sample.txt, ...), plots/train/<variant>.csv (per step, with the
validation loss every val_every steps), metrics/train.json (every variant's
summary plus the gap comparison), metrics/env/train.json and plots/train/samples.md.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from attnrepro.audit.load import AttentionConfig
from attnrepro.experiments.comparison import comparison, pairs_by_dhead
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.config import load_section, read_params, run_stage
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.io import atomic_dir, write_csv, write_json, write_text
from attnrepro.runtime import resolve_device
from attnrepro.store import MANIFEST
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

RUNS = Path("data/train")
PLOTS = Path("plots/train")


def series(history: list[dict], evals: list[dict]) -> list[dict]:
    """Per-step rows with the validation loss merged in at the steps where it was measured."""
    val = {e["step"]: e["val_loss"] for e in evals}
    return [{**r, "val_loss": val[r["step"]]} if r["step"] in val else r for r in history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    cfg = load_section(TrainConfig, "train", args.params)
    attn = load_section(AttentionConfig, "attention", args.params)
    engine = engine_config(read_params(args.params), args.scheduler, args.workers)
    device = resolve_device(cfg.device, "train.device")
    setup_determinism(cfg.threads, device)  # the environment record below states the runs' thread count

    specs = [attn.apply(cfg.spec(name, cfg.seed, device)) for name in cfg.variants]
    records = run_sweep("train", specs, corpus_inputs(), engine)
    require_ok(records, "train")

    metrics, samples = {}, []
    with atomic_dir(RUNS) as tmp:
        for name, rec in zip(cfg.variants, records):
            shutil.copytree(rec.path, tmp / name, ignore=shutil.ignore_patterns(MANIFEST))  # the store's own record
            metrics[name] = rec.summary()
            samples.append(f"## {name}\n\n```\n{(rec.path / 'sample.txt').read_text(encoding='utf-8').rstrip()}\n```\n")
    for name, rec in zip(cfg.variants, records):
        write_csv(PLOTS / f"{name}.csv", series(rec.read("history.json"), rec.read("evals.json")))
    metrics["comparison"] = comparison(metrics, pairs_by_dhead(cfg))
    write_json("metrics/train.json", metrics)
    write_json("metrics/env/train.json", stage_environment(device, [r.read("env.json") for r in records]))
    write_text(PLOTS / "samples.md", "# Samples from the prompt, one per variant\n\n" + "\n".join(samples))
    for name in cfg.variants:
        s = metrics[name]
        print(f"{name}: loss {s['loss_start']:.3f} -> {s['loss_final']:.3f}, val {s['val_loss_final']:.3f}, "
              f"entropy {s['entropy_final']:.4f}")
    for k, v in metrics["comparison"].items():
        print(f"{k}: {v:.4f}")


if __name__ == "__main__":
    run_stage(main)
