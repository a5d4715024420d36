"""The four silent bugs of §1.11.7: their runs (params section `failures`) and symptoms."""

from __future__ import annotations

from dataclasses import dataclass

from ..attention import BUGS
from ..config import from_dict, require, require_positive
from ..corpus_lm import LMData, LMMeasure
from ..model import ModelConfig
from ..runspec import RunSpec
from ..training import OptimConfig
from .protocol import optim_config

SYMPTOMS = ("loss_final", "grad_norm_final", "entropy", "diag_weight")  # what a failures run records


@dataclass
class FailuresConfig(OptimConfig):
    seed: int  # model init and batch order, as in train
    threads: int
    device: str
    val_batches: int  # the symptoms are measured on these fixed validation batches
    val_seed: int
    loss_window: int
    model: dict  # ModelConfig fields (vocab_size comes from the corpus, bug from variants)
    variants: list[str]
    spread_seeds: list[int]  # each variant again with these seeds: the seed spread of each symptom

    def validate(self, prefix: str = "failures") -> None:
        super().validate(prefix)
        require_positive(self, ("threads", "val_batches", "loss_window"), prefix)
        require(len(self.variants) > 0 and len(set(self.variants)) == len(self.variants), f"{prefix}.variants",
                self.variants, "a non-empty list without repeats")
        for v in self.variants:
            require(v in BUGS, f"{prefix}.variants", v, "entries from " + ", ".join(BUGS))
        seeds = [self.seed, *self.spread_seeds]
        require(len(self.spread_seeds) > 0 and len(set(seeds)) == len(seeds), f"{prefix}.spread_seeds",
                self.spread_seeds, "at least one seed, without repeats, other than failures.seed "
                "(the symptoms' seed distribution needs two)")
        for key in ("bug", "vocab_size"):
            require(key not in self.model, f"{prefix}.model.{key}", self.model.get(key),
                    "not set here (bug comes from variants, vocab_size from the corpus)")
        from_dict(ModelConfig, {**self.model, "vocab_size": None}, prefix=f"{prefix}.model")

    def spec(self, bug: str, seed: int, device: str, model: dict | None = None, label: str = "",
             **optim) -> RunSpec:
        """The run of `bug` at `seed`; `model` and `optim` override ModelConfig / OptimConfig fields
        (the sensitivity sweep's one-factor changes)."""
        fields = {**self.model, **(model or {}), "bug": bug, "vocab_size": None}
        return RunSpec(
            task="corpus_lm", model=from_dict(ModelConfig, fields, prefix="failures.model"),
            optim=optim_config(self, "failures", **optim), seed=seed, batch_seed=seed,
            data=LMData(val_batches=self.val_batches, val_seed=self.val_seed),
            measure=LMMeasure(loss_window=self.loss_window, symptoms=True),
            threads=self.threads, device=device, label=label or f"{bug} seed {seed}")


