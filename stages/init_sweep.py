"""DVC stage `init_sweep`: how large are the raw q.k logits at initialization? (§1.3, §1.19.1)

Single-head, single-layer TinyGPT per d_head = d_model, no training, the same random
token batches for every d_head; its attention is params `attention.impl` (the entropy
is of that implementation's weights; the logits are q.k, computed alike for every one).
Writes metrics/init_sweep.json (d<N>.logit_std, d<N>.entropy, ... and fit.*),
plots/init_sweep/sweep.csv and sweep.png.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.model.attention_impl import AttentionConfig
from attnrepro.envinfo import environment
from attnrepro.experiments import init_sweep
from attnrepro.experiments.init_sweep import InitSweepConfig
from attnrepro.figures import init_sweep_figure
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(InitSweepConfig, "init_sweep")
    impl = st.section(AttentionConfig, "attention").model_impl()
    st.pin("cpu", cfg.threads, "init_sweep")
    result = init_sweep.run(cfg, impl)
    write_json("metrics/init_sweep.json", result.metrics)
    write_json("metrics/env/init_sweep.json", environment("cpu"))
    out = Path("plots/init_sweep")
    write_csv(out / "sweep.csv", result.rows)
    init_sweep_figure(result.rows, out / "sweep.png")
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__)
