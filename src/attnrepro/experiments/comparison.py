"""The controlled comparison: loss gaps of scaled vs unscaled pairs, per d_head, and over seeds."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import require
from .protocol import TrainConfig, d_head_of


@dataclass
class SeedsConfig:
    seeds: list[int]  # paired seeds; include train.seed to share the train stage's runs

    def validate(self, prefix: str = "seeds") -> None:
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds (a spread needs them)")



def pairs_by_dhead(cfg: TrainConfig) -> dict[int, dict[bool, str]]:
    """{d_head: {scaled: variant name}} over the variants that differ only in `scaled`."""
    out: dict[int, dict[bool, str]] = {}
    for name, v in cfg.variants.items():
        out.setdefault(d_head_of(cfg, name), {})[bool(v.get("scaled", True))] = name
    return out


def comparison(metrics: dict, pairs: dict[int, dict[bool, str]]) -> dict:
    """Loss gaps (unscaled - scaled) per d_head, and the largest d_head's gap over the smallest's."""
    out, gap = {}, {}
    for d_head, pair in sorted(pairs.items()):
        if set(pair) != {True, False}:
            continue
        for key in ("loss_final", "val_loss_final"):
            g = metrics[pair[False]][key] - metrics[pair[True]][key]
            out[f"gap_d{d_head}_{key}"] = g
            gap.setdefault(key, []).append(g)
    for key, gs in gap.items():
        if len(gs) >= 2 and gs[0] != 0:
            out[f"gap_ratio_{key}"] = gs[-1] / gs[0]  # largest d_head over smallest
    return out


