"""DVC stage `qknorm`: had QK-norm been used from the start, what would the failed experiment
have shown? (§1.7.8, §1.26.5)

The chapter's large model (d_head 256) under the train stage's protocol, with q and k
normalised per head before the dot product (attnrepro.model.attention.QKNorm), in the forms of
`qknorm.forms`: LayerNorm on q and k (ViT-22B; learned scale 1, bias 0 at init) and L2
normalisation with a learned gain (Henry et al. 2020; gain initialised to log2(block^2 -
block) = 11.98 at block 64, their heuristic), each on top of the 1/sqrt(d_k) and in place
of it. The plain scaled and unscaled models at the same seeds are the references (the
seeds stage's runs, shared through the run store). Note the form matters: LayerNorm'd q and
k without any scale give logits of std about sqrt(d_k) = 16 at init.

Writes metrics/qknorm.json (per form and reference: loss, entropy, Jacobian and logit
statistics over seeds), plots/qknorm/per_seed.csv, plots/qknorm/curves.csv (mean training
curves per form) and plots/qknorm/forms.png.
"""

from __future__ import annotations

from typing import Optional

from attnrepro.experiments import qknorm
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.figures import qknorm_figure
from attnrepro.files import as_written, read_csv, write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    train = st.section(TrainConfig, "train")
    cfg = st.section(qknorm.QKNormConfig, "qknorm")
    device = st.pin(train.device, train.threads, "train.device")  # the environment record states the runs' threads
    result = qknorm.run(train, cfg, device, st.engine)

    write_json("metrics/qknorm.json", result.metrics)
    write_json("metrics/env/qknorm.json", result.env)
    write_csv("plots/qknorm/per_seed.csv", result.rows)
    write_csv("plots/qknorm/curves.csv", result.curves)
    figures(st, as_written(result.curves))
    for line in result.lines():
        print(line)


def figures(st: Stage, curves: Optional[list] = None) -> None:
    """forms.png, drawn from the curves as written (plots/qknorm/curves.csv): with --figures-only,
    from that file alone."""
    cfg = st.section(qknorm.QKNormConfig, "qknorm")
    forms = list(dict.fromkeys([*cfg.references, *cfg.forms]))  # as qknorm.run orders them
    curves = read_csv("plots/qknorm/curves.csv") if curves is None else curves
    qknorm_figure(curves, forms, "plots/qknorm/forms.png", len(cfg.seeds))


if __name__ == "__main__":
    stage(main, __doc__, engine=True, figures=figures)
