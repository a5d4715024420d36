"""Exercises 1-2 (§1.20.1-2): the loss gap vs d_head under the train protocol (params `critical`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import from_dict, require
from ..model import ModelConfig

@dataclass
class CriticalConfig:
    d_heads: list[int]  # increasing; the first is the baseline of the onset
    min_d_model: int  # d_model = the smallest multiple of d_head >= min_d_model
    seeds: list[int]
    onset_rise: float  # nats above the first d_head's gap: where "the gap starts to rise clearly"

    def validate(self, prefix: str = "critical") -> None:
        require(len(self.d_heads) >= 3 and self.d_heads == sorted(set(self.d_heads)) and self.d_heads[0] > 0,
                f"{prefix}.d_heads", self.d_heads, "at least 3 increasing positive integers")
        require(self.min_d_model > 0, f"{prefix}.min_d_model", self.min_d_model, "a positive integer")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")
        require(math.isfinite(self.onset_rise) and self.onset_rise > 0, f"{prefix}.onset_rise", self.onset_rise,
                "a positive number of nats")



def critical_model(base: dict, d_head: int, min_d_model: int, **switches) -> ModelConfig:
    """A model of the critical-d_head sweep (exercise 2): the preset `base` with d_model the smallest multiple
    of d_head that is at least min_d_model, and n_head = d_model / d_head (vocab_size None, from the data)."""
    d_model = d_head * -(-min_d_model // d_head)
    spec = {**base, "d_model": d_model, "n_head": d_model // d_head, **switches, "vocab_size": None}
    return from_dict(ModelConfig, spec, prefix=f"critical.d_head {d_head}")


