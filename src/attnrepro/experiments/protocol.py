"""The chapter's training protocol (params section `train`) as run specs, and the corpus it reads.

A variant is a model preset plus ModelConfig switches (`scaled`, and anything else
ModelConfig has). Variant `v` with seed `s` is one RunSpec of the corpus_lm task;
the seed drives both the init draw and the batch order, so at one seed every
variant of one shape starts from the same weights and sees the same batches (the
pairing of scaled and unscaled). The train stage runs one seed; the seed sweep and
the exercises run many through the same builder, so the store shares their runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attnrepro.config import ConfigError, from_dict, require, require_positive
from attnrepro.files import read_json
from attnrepro.model.transformer import ModelConfig
from attnrepro.run.loop import OptimConfig
from attnrepro.run.spec import RunSpec
from attnrepro.run.task_lm import LMData, LMMeasure, Sample

CORPUS = Path("data/corpus")
CORPUS_FILES = ("train.npy", "val.npy", "vocab.json")


def corpus_inputs(folder: Path = CORPUS) -> dict[str, bytes]:
    """The token arrays and vocabulary a corpus_lm run reads (made by the corpus stage)."""
    missing = [n for n in CORPUS_FILES if not (Path(folder) / n).is_file()]
    if missing:
        raise ConfigError(f"{folder}: {', '.join(missing)} missing (run `dvc repro corpus` first)")
    return {n: (Path(folder) / n).read_bytes() for n in CORPUS_FILES}


def vocab_size(folder: Path = CORPUS) -> int:
    return len(read_json(Path(folder) / "vocab.json"))


def optim_fields(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(OptimConfig)}


def optim_config(cfg, where: str, **changes) -> OptimConfig:
    """The OptimConfig part of a stage config, with `changes` (validated)."""
    return from_dict(OptimConfig, {**optim_fields(cfg), **changes}, prefix=where)


def model_config(models: dict, variant: dict, where: str, vocab: Optional[int] = None) -> ModelConfig:
    """A variant = {model: <preset>, <ModelConfig switch>: value, ...}; validated into a ModelConfig
    (vocab_size None: a run takes it from the corpus)."""
    if not isinstance(variant, dict) or "model" not in variant:
        raise ConfigError(f"{where}.model: missing (expected one of {', '.join(sorted(models))})")
    require(variant["model"] in models, f"{where}.model", variant["model"], "one of " + ", ".join(sorted(models)))
    switches = {k: v for k, v in variant.items() if k != "model"}
    for key in ("vocab_size",):
        require(key not in switches, f"{where}.{key}", switches.get(key), "not set here (it comes from the corpus)")
    return from_dict(ModelConfig, {**models[variant["model"]], **switches, "vocab_size": vocab}, prefix=where)


@dataclass
class TrainConfig(OptimConfig):
    seed: int  # model init and batch order (separate generators)
    threads: int
    device: str
    diag_every: int
    diag_steps: list[int]  # recorded in addition to every diag_every
    val_every: int
    val_batches: int
    val_seed: int
    loss_window: int  # loss_final = mean training loss of the last loss_window steps
    sample_prompt: str
    sample_tokens: int
    sample_temperature: float
    sample_seed: int
    models: dict[str, dict]
    variants: dict[str, dict]

    def validate(self, prefix: str = "train") -> None:
        super().validate(prefix)
        require_positive(self, ("threads", "diag_every", "val_every", "val_batches", "loss_window", "sample_tokens"),
                         prefix)
        require(len(self.sample_prompt) > 0, f"{prefix}.sample_prompt", self.sample_prompt, "a non-empty prompt")
        require(self.sample_temperature >= 0, f"{prefix}.sample_temperature", self.sample_temperature,
                "a number >= 0 (0: greedy)")
        require(len(self.variants) > 0, f"{prefix}.variants", self.variants, "at least one variant")
        for name, v in self.variants.items():
            model_config(self.models, v, f"{prefix}.variants.{name}")

    def spec(self, variant: str, seed: int, device: str) -> RunSpec:
        """The RunSpec of train.variants[variant] at `seed`."""
        mcfg = model_config(self.models, self.variants[variant], f"train.variants.{variant}")
        return self.run(mcfg, seed, device, f"{variant} seed {seed}")

    def run(self, model: ModelConfig, seed: int, device: str, label: str, **optim) -> RunSpec:
        """A run of this protocol for any model; `optim` overrides OptimConfig fields (the
        sensitivity sweep's one-factor changes)."""
        return RunSpec(
            task="corpus_lm", model=model, optim=optim_config(self, "train", **optim), seed=seed, batch_seed=seed,
            data=LMData(val_batches=self.val_batches, val_seed=self.val_seed),
            diag_every=self.diag_every, diag_steps=tuple(sorted({s for s in self.diag_steps if s < self.steps})),
            eval_every=self.val_every, eval_final=False,
            measure=LMMeasure(loss_window=self.loss_window, summary_steps=sorted(self.diag_steps), diagnostics=True,
                              qk_scale=True, symptoms=False, sample=Sample(prompt=self.sample_prompt, tokens=self.sample_tokens,
                                                           temperature=self.sample_temperature,
                                                           seed=self.sample_seed)),
            threads=self.threads, device=device, label=label)


def d_head_of(cfg: TrainConfig, variant: str) -> int:
    return model_config(cfg.models, cfg.variants[variant], f"train.variants.{variant}").d_head


def series(history: list[dict], evals: list[dict]) -> list[dict]:
    """A run's per-step rows with the validation loss merged in at the steps where it was measured."""
    val = {e["step"]: e["val_loss"] for e in evals}
    return [{**r, "val_loss": val[r["step"]]} if r["step"] in val else r for r in history]


