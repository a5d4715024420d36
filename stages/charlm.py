"""DVC stage `charlm`: the tiny character-level LM companion experiment (spec §8).

Trains TinyGPT (the document's configuration, 210,761 parameters) on the eight
sentences of ../seeds/003 §4, records train/val loss every eval_every steps,
writes greedy and sampled continuations of the prompt and the attention maps of
the chosen blocks on attn_text.

Writes metrics/charlm.json, metrics/env/charlm.json, plots/charlm/ (losses.csv,
steps.csv, loss_curve.png, samples.txt, attention_block<N>.png) and
data/charlm/model.pt.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attnrepro.experiments import charlm
from attnrepro.experiments.charlm import CharLMConfig
from attnrepro.figures import attention_grid, cjk_font, loss_curves
from attnrepro.files import write_csv, write_json, write_text
from attnrepro.run.stage import Stage, stage
from attnrepro.staging import atomic_dir

PLOTS = Path("plots/charlm")  # files registered one by one in dvc.yaml (samples.txt is not a plot)


def main(st: Stage) -> None:
    cfg = st.section(CharLMConfig, "charlm")
    st.pin("cpu", cfg.threads, "charlm")
    result = charlm.run(cfg, st.engine)
    with atomic_dir(Path("data/charlm")) as tmp:
        shutil.copyfile(result.checkpoint, tmp / "model.pt")
    write_csv(PLOTS / "losses.csv", result.evals, ["step", "train_loss", "val_loss"])
    write_csv(PLOTS / "steps.csv", result.steps, ["step", "loss"])
    loss_curves(PLOTS / "loss_curve.png", {"charlm": result.evals}, "char LM: fixed-batch loss")
    write_text(PLOTS / "samples.txt", result.samples)
    font = cjk_font()
    for layer in cfg.attn_layers:
        attention_grid(PLOTS / f"attention_block{layer + 1}.png", result.maps[layer:layer + 1].numpy(),
                       list(cfg.attn_text), f"char LM block {layer + 1} on {cfg.attn_text if font else 'attn_text'}",
                       [f"block {layer + 1}"], font=font)
    write_json("metrics/charlm.json", result.metrics)
    write_json("metrics/env/charlm.json", result.env)
    for line in result.lines(cjk_font=font is not None):
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
