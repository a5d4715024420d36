"""One-factor changes of the choices the chapter leaves open, in seed sd (params `sensitivity`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import require

SENSITIVITY_FAILURES = "failures_"  # a sensitivity variant failures_<bug> names a model of the failures table


def sensitivity_target(variant: str) -> tuple[str, str]:
    """(metrics file, variant there) that a sensitivity variant names: ("failures", bug) for
    failures_<bug>, else ("train", variant)."""
    if variant.startswith(SENSITIVITY_FAILURES):
        return "failures", variant[len(SENSITIVITY_FAILURES):]
    return "train", variant


@dataclass
class SensitivityConfig:
    seeds: list[int]
    choices: dict[str, dict]  # name -> {optim: {...}} | {model: {...}} | {split: first}
    metrics: dict[str, list[str]]  # train variant or failures_<variant> -> the deviating metrics

    def validate(self, prefix: str = "sensitivity") -> None:
        require(len(self.seeds) >= 2 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 2 different seeds")
        require(bool(self.choices) and "plain" not in self.choices, f"{prefix}.choices", sorted(self.choices),
                "at least one choice, none named 'plain' (the unchanged protocol's name)")
        require(bool(self.metrics) and all(self.metrics.values()), f"{prefix}.metrics", self.metrics,
                "at least one variant, each with at least one metric")
        for name, c in self.choices.items():
            require(isinstance(c, dict) and len(c) == 1 and next(iter(c)) in ("optim", "model", "split"),
                    f"{prefix}.choices.{name}", c, "one of {optim: {...}}, {model: {...}}, {split: first}")
            if "split" in c:
                require(c["split"] == "first", f"{prefix}.choices.{name}.split", c["split"], "first")
            else:
                kind = next(iter(c))
                require(isinstance(c[kind], dict) and bool(c[kind]), f"{prefix}.choices.{name}.{kind}", c[kind],
                        f"a mapping of {'OptimConfig' if kind == 'optim' else 'ModelConfig'} fields")
