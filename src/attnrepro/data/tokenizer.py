"""The corpus' character-level tokenizer: <pad>, <unk>, then the most frequent characters.

Its own module because runs decode their generated samples with it: it is part of
every corpus_lm run's key (attnrepro.run.execute), so it must not change with the corpus
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
    def build(cls, text: str, vocab_size: int, count_newline: bool = False) -> "Tokenizer":
        """§1.18.1's CharTokenizer: `cnt = Counter(text.replace("\n", ""))`, then
        `keep = [c for c, _ in cnt.most_common(vocab_size - 2)]` after <pad> and <unk>.

        Newline is never kept, so it encodes as <unk> ("其余映射到 <unk>", the rest map to
        <unk>); `most_common` keeps first-seen order among equal counts. `count_newline`
        counts it like any character (the `choices` stage's `newline: token` arm).
        """
        counts = Counter(text if count_newline else text.replace("\n", ""))
        return cls([PAD, UNK] + [c for c, _ in counts.most_common(vocab_size - 2)])

    @property
    def stoi(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.itos)}

    def encode(self, text: str) -> np.ndarray:
        stoi = self.stoi
        return np.array([stoi.get(c, 1) for c in text], dtype=np.uint16)

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] if int(i) > 1 else "□" for i in ids)
