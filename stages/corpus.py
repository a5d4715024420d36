"""DVC stage `corpus`: fetch and verify the Tang poems, tokenize, split.

Outputs: data/corpus/{train,val}.npy, vocab.json, text.txt, raw/, provenance.json
and metrics/corpus.json. Nothing is written unless every check passes. metrics/corpus.json also
holds, under `by_newline`, the token count, coverage and <unk> rate the text would have under each
newline rule (corpus.NEWLINE_RULES; the protocol's is "unk"): the choices stage's text arms, read
against the chapter's own corpus figures without training anything.
"""

from attnrepro.data import corpus
from attnrepro.envinfo import environment
from attnrepro.files import dumps_json, write_json
from attnrepro.staging import atomic_dir
from attnrepro.run.stage import Stage, stage

OUT_DIR = "data/corpus"


def main(st: Stage) -> None:
    cfg = st.section(corpus.CorpusConfig, "corpus")
    with atomic_dir(OUT_DIR) as tmp:
        result = corpus.prepare(cfg, tmp / "raw")
        for name, data in corpus.input_files(result.tok, result.arrays).items():
            (tmp / name).write_bytes(data)
        (tmp / "text.txt").write_text("\n".join(result.poems) + "\n", encoding="utf-8")
        (tmp / "provenance.json").write_text(dumps_json(result.provenance), encoding="utf-8")
    by_newline = {rule: {k: m[k] for k in ("tokens", "coverage", "unk_rate")}
                  for rule in corpus.NEWLINE_RULES
                  for m in [corpus.build(result.poems, cfg.vocab_size, cfg.val_fraction, rule)[2]]}
    write_json("metrics/corpus.json", {**result.metrics, "by_newline": by_newline})
    write_json("metrics/env/corpus.json", environment())
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__)
