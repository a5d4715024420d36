"""The chapter's controlled comparison as run specs: its config, its variants, its gaps.

A variant is a model preset plus ModelConfig switches (`scaled`, and anything else
ModelConfig has). Variant `v` with seed `s` is one RunSpec of the corpus_lm task;
the seed drives both the init draw and the batch order, so at one seed every
variant of one shape starts from the same weights and sees the same batches (the
pairing of scaled and unscaled). The train stage runs one seed; the seed sweep and
the exercises run many through the same builder, so the store shares their runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..attention import BUGS
from ..config import ConfigError, from_dict, require, require_positive
from ..corpus_lm import LMData, LMMeasure, Sample
from ..model import ModelConfig
from ..runspec import RunSpec
from ..training import OptimConfig

CORPUS = Path("data/corpus")
CORPUS_FILES = ("train.npy", "val.npy", "vocab.json")


def corpus_inputs(folder: Path = CORPUS) -> dict[str, bytes]:
    """The token arrays and vocabulary a corpus_lm run reads (made by the corpus stage)."""
    missing = [n for n in CORPUS_FILES if not (Path(folder) / n).is_file()]
    if missing:
        raise ConfigError(f"{folder}: {', '.join(missing)} missing (run `dvc repro corpus` first)")
    return {n: (Path(folder) / n).read_bytes() for n in CORPUS_FILES}


def vocab_size(folder: Path = CORPUS) -> int:
    import json

    return len(json.loads((Path(folder) / "vocab.json").read_text(encoding="utf-8")))


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
            eval_every=self.val_every,
            measure=LMMeasure(loss_window=self.loss_window, summary_steps=sorted(self.diag_steps), diagnostics=True,
                              qk_scale=True, sample=Sample(prompt=self.sample_prompt, tokens=self.sample_tokens,
                                                           temperature=self.sample_temperature,
                                                           seed=self.sample_seed)),
            threads=self.threads, device=device, label=label)


def family_model(base: dict, d_head: int, min_d_model: int, **switches) -> ModelConfig:
    """The critical-d_head family (exercise 2): the preset `base` with d_model the smallest multiple
    of d_head that is at least min_d_model, and n_head = d_model / d_head (vocab_size None, from the data)."""
    d_model = d_head * -(-min_d_model // d_head)
    spec = {**base, "d_model": d_model, "n_head": d_model // d_head, **switches, "vocab_size": None}
    return from_dict(ModelConfig, spec, prefix=f"critical.d_head {d_head}")


def d_head_of(cfg: TrainConfig, variant: str) -> int:
    return model_config(cfg.models, cfg.variants[variant], f"train.variants.{variant}").d_head


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


# ---------------------------------------------------------------- the sweep stages' params

@dataclass
class SeedsConfig:
    seeds: list[int]  # paired seeds; include train.seed to share the train stage's runs

    def validate(self, prefix: str = "seeds") -> None:
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds (a spread needs them)")


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


@dataclass
class QKNormConfig:
    references: list[str]  # train.variants to compare with (the plain scaled and unscaled models)
    forms: dict[str, dict]  # name -> a variant: {model: <preset>, qk_norm: ..., scaled: ...}
    seeds: list[int]

    def validate(self, prefix: str = "qknorm") -> None:
        require(len(self.forms) > 0, f"{prefix}.forms", self.forms, "at least one form")
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")


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
