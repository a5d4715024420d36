"""§1.7.8, §1.26.5: the large model with q, k normalised per head (params `qknorm`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import require

@dataclass
class QKNormConfig:
    references: list[str]  # train.variants to compare with (the plain scaled and unscaled models)
    forms: dict[str, dict]  # name -> a variant: {model: <preset>, qk_norm: ..., scaled: ...}
    seeds: list[int]

    def validate(self, prefix: str = "qknorm") -> None:
        require(len(self.forms) > 0, f"{prefix}.forms", self.forms, "at least one form")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")


