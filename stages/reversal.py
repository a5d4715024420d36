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

import shutil
from pathlib import Path

from attnrepro.experiments import reversal
from attnrepro.experiments.reversal import ReversalConfig
from attnrepro.figures import attention_grid, loss_curves
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage
from attnrepro.staging import atomic_dir

PLOTS = Path("plots/reversal")


def main(st: Stage) -> None:
    cfg = st.section(ReversalConfig, "reversal")
    st.pin("cpu", cfg.threads, "reversal")  # the evaluation runs here
    result = reversal.run(cfg, st.engine)
    with atomic_dir(Path("data/reversal")) as tmp:
        for name, checkpoint in result.checkpoints.items():
            shutil.copyfile(checkpoint, tmp / f"{name}.pt")
            write_csv(tmp / f"predictions_{name}.csv", result.predictions[name])
    with atomic_dir(PLOTS) as pdir:  # the whole folder is one DVC out
        write_csv(pdir / "losses.csv", result.losses)
        loss_curves(pdir / "loss_curves.png", result.histories, "digit reversal: full-set answer loss")
        for name, m in result.maps.items():
            attention_grid(pdir / f"attention_{name}.png", m.numpy(), result.labels,
                           f"reversal {name}: test sample {cfg.sample_index} (boxes: reverse alignment)",
                           [f"layer {i}" for i in range(m.shape[0])], boxes=result.boxes)
    write_json("metrics/reversal.json", result.metrics)
    write_json("metrics/env/reversal.json", result.env)
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
