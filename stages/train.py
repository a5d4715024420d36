"""DVC stage `train`: the controlled sqrt(d_k) comparison, every variant of train.variants.

Every variant uses the same seed, the same initialization draw (per model shape)
and the same batches in the same order; the only differences are the model
shape and the `scaled` switch. The attention is params `attention.impl` (the
builtin, or a callable with SDPA's signature: see `attnrepro audit`). The
variants are one sweep on the run engine (attnrepro.run.engine): they train in
parallel, and a variant whose settings did not change is taken from the run
store instead of being trained again.

Writes data/train/<variant>/ (the run's result folder: checkpoint, summary.json,
history.json, sample.txt, ...), plots/train/<variant>.csv (per step, with the
validation loss every val_every steps), metrics/train.json (every variant's
summary plus the gap comparison), metrics/env/train.json and plots/train/samples.md.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attnrepro.model.attention_impl import AttentionConfig
from attnrepro.experiments.comparison import run_train
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.files import write_csv, write_json, write_text
from attnrepro.staging import atomic_dir
from attnrepro.run.stage import Stage, stage
from attnrepro.store.run_store import MANIFEST

RUNS = Path("data/train")
PLOTS = Path("plots/train")


def main(st: Stage) -> None:
    cfg = st.section(TrainConfig, "train")
    attn = st.section(AttentionConfig, "attention")
    device = st.pin(cfg.device, cfg.threads, "train.device")  # the environment record states the runs' threads
    result = run_train(cfg, attn, device, st.engine)

    with atomic_dir(RUNS) as tmp:
        for name, folder in result.folders.items():
            shutil.copytree(folder, tmp / name, ignore=shutil.ignore_patterns(MANIFEST))  # the store's own record
    for name, rows in result.series.items():
        write_csv(PLOTS / f"{name}.csv", rows)
    write_json("metrics/train.json", result.metrics)
    write_json("metrics/env/train.json", result.env)
    write_text(PLOTS / "samples.md", result.samples)
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
