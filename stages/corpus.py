"""DVC stage `corpus`: fetch and verify the Tang poems, tokenize, split.

Outputs: data/corpus/{train,val}.npy, vocab.json, text.txt, raw/, provenance.json
and metrics/corpus.json. Nothing is written unless every check passes.
"""

import argparse
import datetime
import json

import numpy as np

from attnrepro import corpus
from attnrepro.config import load_section, run_stage
from attnrepro.envinfo import environment
from attnrepro.io import atomic_dir, dumps_json, write_json

OUT_DIR = "data/corpus"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = ap.parse_args()
    cfg = load_section(corpus.CorpusConfig, "corpus", args.params)

    with atomic_dir(OUT_DIR) as tmp:
        prov = corpus.fetch(cfg, tmp / "raw")
        poems = corpus.load_poems([tmp / "raw" / name for name in cfg.files])
        tok, arrays, metrics = corpus.build(poems, cfg.vocab_size, cfg.val_fraction)
        for split, ids in arrays.items():
            np.save(tmp / f"{split}.npy", ids)
        (tmp / "vocab.json").write_text(json.dumps(tok.itos, ensure_ascii=False, indent=0), encoding="utf-8")
        (tmp / "text.txt").write_text("\n".join(poems) + "\n", encoding="utf-8")
        prov["retrieved_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        prov["split"] = f"last {cfg.val_fraction:g} of the token stream is validation"
        (tmp / "provenance.json").write_text(dumps_json(prov), encoding="utf-8")
    write_json("metrics/corpus.json", metrics)
    write_json("metrics/env/corpus.json", environment())
    print(f"corpus: {metrics['poems']} poems, {metrics['chars']} characters, "
          f"{metrics['distinct_chars']} distinct, vocabulary covers {metrics['coverage']:.1%}")


if __name__ == "__main__":
    run_stage(main)
