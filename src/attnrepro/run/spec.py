"""What one training run is: a typed `RunSpec`, and what a task hands the training loop.

A run is a pure function of its spec and its input bytes. The spec holds typed
configs (the model, the optimizer, the task's data and measurement settings), so
two specs that mean the same run are equal and serialize to the same key material.
The tasks (`attnrepro.run.execute.TASKS`) turn a spec and inputs into a `Prepared`: the
model config with what the data decide, the batches and the task's own data for
its measurement hooks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from attnrepro.config import from_dict
from attnrepro.model.transformer import ModelConfig
from attnrepro.run.loop import Batches, OptimConfig


@dataclass(frozen=True)
class RunSpec:
    task: str  # a name in attnrepro.run.execute.TASKS
    model: ModelConfig  # vocab_size None: the task takes it from the data
    optim: OptimConfig
    seed: int  # torch.manual_seed before the model is built: the init draw (and dropout)
    batch_seed: int  # the batch order's own generator
    data: Any  # the task's data settings (its TASKS entry names the type)
    diag_every: int  # steps whose own forward records attention diagnostics: every N from 0 (0: none) ...
    diag_steps: tuple[int, ...]  # ... and these (a rule, not a list of every step: see DiagSchedule)
    eval_every: int  # evaluate the task's fixed data every N steps (0: never)
    eval_final: bool  # ... and after the last step
    measure: Any  # the task's post-training measurements (its TASKS entry names the type; None: none)
    threads: int
    device: str
    label: str = field(compare=False)  # a name to show; not part of the key

    def __post_init__(self):
        # every field through its type's coercion: two specs of one run serialize to one key
        for name, value in (("model", self.model), ("optim", self.optim), ("data", self.data),
                            ("measure", self.measure)):
            if dataclasses.is_dataclass(value):
                object.__setattr__(self, name, from_dict(type(value), dataclasses.asdict(value), prefix=name))
            elif name in ("model", "optim"):
                raise TypeError(f"RunSpec.{name}: expected a {'ModelConfig' if name == 'model' else 'OptimConfig'}, "
                                f"got {type(value).__name__}")
        object.__setattr__(self, "diag_steps", tuple(sorted(self.diag_steps)))

    def key_material(self) -> dict:
        """The spec as its key sees it. A model whose q/k width is its d_head (d_qk null; ModelConfig
        stores a d_qk equal to d_head as null) leaves d_qk out: such a run keeps the key it had before
        ModelConfig had the field, so no stored run is re-keyed or retrained."""
        d = dataclasses.asdict(self)
        d.pop("label")
        if d["model"].get("d_qk") is None:
            d["model"].pop("d_qk", None)
        d["diag_steps"] = list(d["diag_steps"])
        return d

    @property
    def steps(self) -> int:
        return self.optim.steps


@dataclass(frozen=True)
class DiagSchedule:
    """The diagnostics steps of a run as a rule: step in schedule, for any number of steps."""
    every: int
    extra: frozenset[int]
    steps: int

    def __contains__(self, step: int) -> bool:
        return 0 <= step < self.steps and ((self.every > 0 and step % self.every == 0) or step in self.extra)


@dataclass
class Prepared:
    """What a task's `prepare` hands the run: the model config (with vocab_size from the data),
    the training batches, the task's own data for its hooks, and extra checkpoint entries."""
    model_config: ModelConfig
    batches: Batches
    state: Any = None
    checkpoint_extra: dict = field(default_factory=dict)


def with_vocab(spec: RunSpec, vocab_size: Optional[int] = None) -> ModelConfig:
    """The spec's model with the vocabulary size the data decide (or the spec's own)."""
    return dataclasses.replace(spec.model, vocab_size=vocab_size if vocab_size is not None else spec.model.vocab_size)
