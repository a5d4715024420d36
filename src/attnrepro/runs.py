"""The run: one training run as a pure function of its config, writing one result folder.

A `RunSpec` says everything a run depends on (task, model, optimizer, seeds, steps,
diagnostics schedule, evaluation, measurements, threads, device); the data it
reads are passed in as bytes (`inputs`), so a run needs no shared file system and
its key (`run_key`) can cover the data's content. `execute` trains through the one
loop (`training.train_loop`) and writes:

  spec.json      the key material: spec, input hashes, code digest, torch version
  status.json    {"status": "ok" | "diverged", "reason": ...}
  summary.json   the task's headline numbers (rounded as every metrics file)
  history.json   one row per training step; evals.json one row per evaluation
  model.pt       the checkpoint (not written for a diverged run)
  sample.txt     a generated sample, where the spec asks for one
  env.json, timing.json   where and how fast it ran (not part of the result)

Tasks adapt the data: `corpus_lm` (the chapter's Tang-poetry LM: the four
variants, the injected bugs, every sweep), `charlm` (the eight-sentence char LM)
and `reversal` (digit reversal with a loss mask).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

import torch

from .config import from_dict
from .envinfo import environment
from .io import dumps_json
from .model import ModelConfig, TinyGPT
from .training import Diverged, OptimConfig, RunResult, train_loop

SRC = Path(__file__).resolve().parent
# The modules a run's numbers depend on: their source is part of every run's key, so a
# change to them retrains every run (keep them few and stable). Validation and messages
# (config.py, debugger.py) are not numbers and are left out.
COMMON_CODE = ("attention.py", "model.py", "diagnostics.py", "training.py", "io.py", "runs.py")
TASK_CODE = {"corpus_lm": ("lm.py", "tokenizer.py"), "charlm": ("charlm.py",), "reversal": ("reversal.py",)}


@dataclass(frozen=True)
class RunSpec:
    task: str  # corpus_lm | charlm | reversal
    model: dict  # ModelConfig fields; the task fills in what the data decides (vocab_size, block_size)
    optim: dict  # OptimConfig fields
    seed: int  # torch.manual_seed before the model is built: the init draw (and dropout)
    batch_seed: int  # the batch order's own generator
    data: dict = field(default_factory=dict)  # task settings: fixed evaluation batches, splits, ...
    diag_every: int = 0  # steps whose own forward records attention diagnostics: every N from 0 (0: none) ...
    diag_steps: tuple[int, ...] = ()  # ... and these (a rule, not a list of every step: see DiagSchedule)
    eval_every: int = 0  # evaluate the task's fixed batches every N steps (0: never)
    eval_final: bool = False  # ... and after the last step
    measure: dict = field(default_factory=dict)  # post-training measurements (task-specific)
    threads: int = 1
    device: str = "cpu"
    label: str = field(default="", compare=False)  # a name to show; not part of the key

    def key_material(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("label")
        d["diag_steps"] = sorted(d["diag_steps"])
        return d

    @property
    def steps(self) -> int:
        return int(self.optim["steps"])


@dataclass(frozen=True)
class DiagSchedule:
    """The diagnostics steps of a run as a rule: step in schedule, for any number of steps."""
    every: int
    extra: frozenset[int]
    steps: int

    def __contains__(self, step: int) -> bool:
        return 0 <= step < self.steps and ((self.every > 0 and step % self.every == 0) or step in self.extra)


def code_digest(task: str) -> str:
    h = hashlib.sha256()
    for name in COMMON_CODE + TASK_CODE[task]:
        h.update(name.encode() + b"\0" + (SRC / name).read_bytes() + b"\0")
    return h.hexdigest()


def key_document(spec: RunSpec, inputs: Mapping[str, bytes]) -> dict:
    """Everything a run's result depends on, as JSON-able data."""
    return {"spec": spec.key_material(),
            "inputs": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(inputs.items())},
            "code": code_digest(spec.task), "torch": torch.__version__}


def run_key(spec: RunSpec, inputs: Mapping[str, bytes]) -> str:
    doc = json.dumps(key_document(spec, inputs), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(doc.encode()).hexdigest()


# ---------------------------------------------------------------- tasks

@dataclass
class Prepared:
    """What a task hands the run: a model config, batches, an evaluator and the measurements."""
    model_config: ModelConfig
    batches: object
    evaluate: Optional[Callable[[TinyGPT], dict]] = None
    before: Callable[[TinyGPT], dict] = lambda model: {}  # measured on the fresh model
    after: Callable[[TinyGPT, RunResult, dict], tuple[dict, dict[str, str]]] = \
        lambda model, run, before: ({}, {})  # -> (summary, extra text files)
    checkpoint_extra: dict = field(default_factory=dict)


def model_config(spec: RunSpec, **fixed) -> ModelConfig:
    """The spec's model, with what the data decide (vocab_size, block_size) filled in."""
    return from_dict(ModelConfig, {**spec.model, **fixed}, prefix="model")


# the module of each task: its prepare(spec, inputs, device) -> Prepared adapts the data
TASKS = {"corpus_lm": "attnrepro.lm", "charlm": "attnrepro.charlm", "reversal": "attnrepro.reversal"}


def prepare(spec: RunSpec, inputs: Mapping[str, bytes], device: str) -> Prepared:
    import importlib

    return importlib.import_module(TASKS[spec.task]).prepare(spec, inputs, device)


# ---------------------------------------------------------------- the run function

@contextlib.contextmanager
def pinned_torch(threads: int, device: str):
    """The run's own thread count and deterministic algorithms; the caller's settings come back after."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    from .envinfo import setup_determinism

    setup_determinism(threads, device)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det, warn_only=old_warn)


def execute(spec: RunSpec, inputs: Mapping[str, bytes], out: Path,
            progress: Optional[Callable[[int], None]] = None) -> dict:
    """Train one run and write its result folder `out` (created); returns its status dict."""
    if spec.task not in TASKS:
        raise ValueError(f"unknown task {spec.task!r}; expected one of {', '.join(TASKS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(dumps_json({**key_document(spec, inputs), "label": spec.label}),
                                   encoding="utf-8")
    t0 = time.perf_counter()
    with pinned_torch(spec.threads, spec.device):
        cfg = from_dict(OptimConfig, spec.optim, prefix="optim")
        prep = prepare(spec, inputs, spec.device)
        torch.manual_seed(spec.seed)
        model = TinyGPT(prep.model_config).to(spec.device)
        before = prep.before(model)
        try:
            run = train_loop(model, prep.batches, cfg, diag_steps=DiagSchedule(spec.diag_every, frozenset(spec.diag_steps), spec.steps), evaluate_fn=prep.evaluate,
                             eval_every=spec.eval_every, eval_final=spec.eval_final,
                             progress=(lambda step, loss: progress(step + 1)) if progress else None)
        except Diverged as e:
            status = {"status": "diverged", "reason": str(e), "step": e.step}
            (out / "status.json").write_text(dumps_json(status), encoding="utf-8")
            return status
        summary, files = prep.after(model, run, before)
        torch.save({"model_config": dataclasses.asdict(prep.model_config), **prep.checkpoint_extra,
                    "state_dict": model.state_dict()}, out / "model.pt")
        env = environment(spec.device)  # inside: it records the run's own thread count
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "summary.json").write_text(dumps_json(summary), encoding="utf-8")
    # rows keep their column order (step, lr, loss, ...): the stages' CSVs follow it
    (out / "history.json").write_text(dumps_json(run.history, sort_keys=False), encoding="utf-8")
    (out / "evals.json").write_text(dumps_json(run.evals, sort_keys=False), encoding="utf-8")
    (out / "env.json").write_text(dumps_json(env), encoding="utf-8")
    (out / "timing.json").write_text(dumps_json({"seconds": run.seconds, "ms_per_step": 1000 * run.seconds / cfg.steps,
                                                 "wall_seconds": time.perf_counter() - t0}), encoding="utf-8")
    status = {"status": "ok", "reason": ""}
    (out / "status.json").write_text(dumps_json(status), encoding="utf-8")
    return status


def execute_to_bytes(spec: RunSpec, inputs: Mapping[str, bytes],
                     progress: Optional[Callable[[int], None]] = None) -> dict[str, bytes]:
    """`execute` in a private temporary folder; returns its files (how results travel from a worker)."""
    with tempfile.TemporaryDirectory(prefix="attnrepro-run-") as tmp:
        out = Path(tmp) / "run"
        execute(spec, inputs, out, progress)
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}
