"""The run: one training run as a pure function of its config, writing one result folder.

A `RunSpec` says everything a run depends on (task, model, optimizer, seeds, steps,
diagnostics schedule, evaluation, measurements, threads, device); the data it
reads are passed in as bytes (`inputs`), so a run needs no shared file system and
its key (`run_key`) can cover the data's content. `execute` trains through the one
loop (`run.loop.train_loop`) and writes:

  spec.json      the key material: spec, input hashes, numerics version, torch version
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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import torch

from attnrepro.config import ConfigError, from_dict
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.files import dumps_json
from attnrepro.model.transformer import ModelConfig, TinyGPT
from attnrepro.run import task_charlm as charlm
from attnrepro.run import task_lm as corpus_lm
from attnrepro.run import task_reversal as reversal
from attnrepro.run.loop import Diverged, OptimConfig, TrainingLog, train_loop
from attnrepro.run.spec import DiagSchedule, Prepared, RunSpec
from attnrepro.store.run_store import key_of, spec_record

# The numerics version of each task: part of every run's key, in place of the code's bytes.
# Bump a task's number in the same change as anything that moves its numbers (the model, the
# attention, the training loop, the diagnostics, the task's module, the determinism settings);
# tests/test_golden.py fails with one line naming the task when its numbers moved, and
# `python scripts/golden.py` writes the new golden outputs. A change that moves no number
# (a comment, a rename, a message) keeps every key, so nothing retrains.
NUMERICS = {"corpus_lm": 1, "charlm": 2, "reversal": 1}


@dataclass(frozen=True)
class Task:
    """What differs between tasks, as named functions: `prepare` reads the inputs, `evaluate` runs
    every eval_every steps, `before` measures the fresh model and `after` the trained one
    (-> summary, extra text files). `data` and `measure` are the types of the spec's fields."""
    prepare: Callable[[RunSpec, Mapping[str, bytes], str], Prepared]
    evaluate: Callable[[TinyGPT, Prepared], dict]
    before: Callable[[TinyGPT, RunSpec, Prepared], dict]
    after: Callable[[TinyGPT, RunSpec, Prepared, TrainingLog, dict], tuple[dict, dict[str, str]]]
    data: type
    measure: Optional[type]


TASKS = {
    "corpus_lm": Task(corpus_lm.prepare, corpus_lm.evaluate_val, corpus_lm.before, corpus_lm.after, corpus_lm.LMData,
                      corpus_lm.LMMeasure),
    "charlm": Task(charlm.prepare, charlm.evaluate, charlm.before, charlm.after, charlm.CharLMData, None),
    "reversal": Task(reversal.prepare, reversal.evaluate, reversal.before, reversal.after, reversal.ReversalData,
                     None),
}


def key_document(spec: RunSpec, inputs: Mapping[str, bytes]) -> dict:
    """Everything a run's result depends on, as JSON-able data: the typed spec, the inputs'
    hashes, the task's numerics version and the torch version."""
    return {"spec": spec.key_material(),
            "inputs": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(inputs.items())},
            "numerics": NUMERICS[spec.task], "torch": torch.__version__}


def run_key(spec: RunSpec, inputs: Mapping[str, bytes]) -> str:
    return key_of(key_document(spec, inputs))


def spec_from_material(material: dict, label: str = "") -> RunSpec:
    """The typed RunSpec of recorded key material (spec.json's "spec"); older records whose model
    lacks a field the data decide (vocab_size) get None there, as a spec made now would, and a model
    without d_qk (its key material leaves a null d_qk out: RunSpec.key_material) gets null."""
    m = dict(material)
    task = m.get("task")
    if task not in TASKS:
        raise ConfigError(f"spec.task: got {task!r}, expected one of {', '.join(TASKS)}")
    t = TASKS[task]
    m["model"] = from_dict(ModelConfig, {"vocab_size": None, "d_qk": None, **m["model"]}, prefix="spec.model")
    m["optim"] = from_dict(OptimConfig, m["optim"], prefix="spec.optim")
    m["data"] = from_dict(t.data, m.get("data") or {}, prefix="spec.data")
    m["measure"] = from_dict(t.measure, m["measure"], prefix="spec.measure") if t.measure and m.get("measure") \
        else None
    m["diag_steps"] = tuple(m.get("diag_steps", ()))
    return RunSpec(**m, label=label)


# ---------------------------------------------------------------- the run function

@contextlib.contextmanager
def pinned_torch(threads: int, device: str):
    """The run's own thread count and deterministic algorithms; the caller's settings come back after."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    old_fill = torch.utils.deterministic.fill_uninitialized_memory
    setup_determinism(threads, device)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det, warn_only=old_warn)
        torch.utils.deterministic.fill_uninitialized_memory = old_fill


def execute(spec: RunSpec, inputs: Mapping[str, bytes], out: Path,
            progress: Optional[Callable[[int], None]] = None) -> dict:
    """Train one run and write its result folder `out` (created); returns its status dict."""
    if spec.task not in TASKS:
        raise ValueError(f"unknown task {spec.task!r}; expected one of {', '.join(TASKS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = key_document(spec, inputs)
    (out / "spec.json").write_bytes(spec_record(doc, key_of(doc), spec.label))
    t0 = time.perf_counter()
    task = TASKS[spec.task]
    with pinned_torch(spec.threads, spec.device):
        cfg = spec.optim
        prep = task.prepare(spec, inputs, spec.device)
        torch.manual_seed(spec.seed)
        model = TinyGPT(prep.model_config).to(spec.device)
        before = task.before(model, spec, prep)
        try:
            run = train_loop(model, prep.batches, cfg,
                             diag_steps=DiagSchedule(spec.diag_every, frozenset(spec.diag_steps), spec.steps),
                             evaluate_fn=lambda m: task.evaluate(m, prep),
                             eval_every=spec.eval_every, eval_final=spec.eval_final,
                             progress=(lambda step, loss: progress(step + 1)) if progress else None)
        except Diverged as e:
            status = {"status": "diverged", "reason": str(e), "step": e.step}
            (out / "status.json").write_text(dumps_json(status), encoding="utf-8")
            return status
        summary, files = task.after(model, spec, prep, run, before)
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
