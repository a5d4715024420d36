"""DVC stage `corpus`: fetch and verify the Tang poems, tokenize, split.

Outputs: data/corpus/{train,val}.npy, vocab.json, text.txt, raw/, provenance.json
and metrics/corpus.json. Nothing is written unless every check passes.
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
    write_json("metrics/corpus.json", result.metrics)
    write_json("metrics/env/corpus.json", environment())
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__)
