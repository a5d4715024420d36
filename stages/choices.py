"""DVC stage `choices`: the protocol choices that may move the headline, at paired seeds.

Each arm of `choices.arms` changes one choice the chapter does not settle, the text's line breaks
and the tokenizer's newline rule (corpus.NEWLINE_RULES: the protocol encodes a line break as <unk>)
or an optimizer setting (weight decay), and trains train.variants at every seed of `choices.seeds`.
The baseline at the same seeds is the seeds stage's runs (metrics/dist/train.json), so this sweep
trains only its arms. Per arm: the headline cells (final losses, both gaps, the ratio of mean gaps
with Fieller's interval, the unscaled d_head-256 entropy at step 222, its Jacobian's fall in orders
and its late scales), and each cell's paired difference from the baseline with Holm's correction
over the sweep (experiments.choices).

Writes metrics/choices.json, metrics/env/choices.json and plots/choices/per_seed.csv (one row per
arm and seed).
"""

from __future__ import annotations

from attnrepro.data.corpus import CorpusConfig
from attnrepro.experiments import choices
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    train = st.section(TrainConfig, "train")
    corpus_cfg = st.section(CorpusConfig, "corpus")
    cfg = st.section(choices.ChoicesConfig, "choices")
    device = st.pin(train.device, train.threads, "train.device")
    result = choices.run(train, corpus_cfg, cfg, device, st.engine)

    write_json("metrics/choices.json", result.metrics)
    write_json("metrics/env/choices.json", result.env)
    write_csv("plots/choices/per_seed.csv", result.rows)
    print("\n".join(result.lines()))


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
