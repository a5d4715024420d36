"""The corpus' character-level tokenizer: <pad>, <unk>, then the most frequent characters.

Its own module because runs decode their generated samples with it: it is part of
every corpus_lm run's key (attnrepro.runs), so it must not change with the corpus
fetching code.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

PAD, UNK = "<pad>", "<unk>"


@dataclass
class Tokenizer:
    itos: list[str]

    @classmethod
    def build(cls, text: str, vocab_size: int) -> "Tokenizer":
        """<pad>, <unk>, then the most frequent characters (newline included).

        Ties are broken by code point so the vocabulary never depends on dict order.
        """
        counts = Counter(text)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls([PAD, UNK] + [c for c, _ in ranked[: vocab_size - 2]])

    @property
    def stoi(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.itos)}

    def encode(self, text: str) -> np.ndarray:
        stoi = self.stoi
        return np.array([stoi.get(c, 1) for c in text], dtype=np.uint16)

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] if int(i) > 1 else "□" for i in ids)
