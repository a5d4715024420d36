"""DVC stage `choices@<arm>`: one protocol choice that may move the headline, at paired seeds.

Each arm of `choices.arms` changes one choice the chapter does not settle, the text's line breaks
and the tokenizer's newline rule (corpus.NEWLINE_RULES: the protocol encodes a line break as <unk>)
or an optimizer setting (weight decay), and trains train.variants at every seed of `choices.seeds`.
dvc.yaml runs this script once per arm (`foreach`), so an arm's results are kept once it ran and a new
arm trains only its own runs. The baseline at the same seeds is the seeds stage's runs
(metrics/dist/train.json). The headline cells (final losses, both gaps, the ratio of mean gaps with
Fieller's interval, the unscaled d_head-256 entropy at step 222, its Jacobian's fall in orders and
its late scales), and each cell's paired difference from the baseline with Holm's correction over
the arm's cells (experiments.choices).

Writes metrics/choices_<arm>.json, metrics/env/choices_<arm>.json and plots/choices/<arm>.csv (one
row per seed of the baseline and of the arm).
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
    arm = st.args.arm
    result = choices.run(train, corpus_cfg, cfg, arm, device, st.engine)

    write_json(f"metrics/{choices.PREFIX}{arm}.json", result.metrics)
    write_json(f"metrics/env/{choices.PREFIX}{arm}.json", result.env)
    write_csv(f"plots/choices/{arm}.csv", result.rows)
    print("\n".join(result.lines()))


if __name__ == "__main__":
    stage(main, __doc__, engine=True, arguments=lambda ap: ap.add_argument("arm", help="the arm to run: a key of "
                                                                           "params choices.arms"))
