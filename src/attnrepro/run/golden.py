"""Golden outputs: tiny runs of every task whose numbers guard the numerics versions.

A run's store key names its task's numerics version (attnrepro.run.execute.NUMERICS), not the
bytes of the code, so a change that moves numbers must bump that version, or the store
would serve results the new code would not produce. Each case below is a tiny run (tens
of steps, one thread) of one path: the chapter's LM with its diagnostics, each injected
bug, both QK-norm forms, the char LM and digit reversal. Its summary, per-step history
and evaluations are committed under tests/golden/; tests/test_golden.py runs the cases
again and compares.

The comparison allows for float order (another CPU's kernels: AVX2 or AVX-512, Intel or
AMD), measured as the difference between one and two threads on one machine, and no
more: a change to any constant of the model moves the numbers far beyond it.

Regenerate with `python scripts/golden.py` after bumping NUMERICS for the tasks that moved.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from attnrepro.model.transformer import ModelConfig
from attnrepro.run.execute import NUMERICS, execute_to_bytes
from attnrepro.run.loop import OptimConfig
from attnrepro.run.spec import RunSpec
from attnrepro.run.task_charlm import CharLMData
from attnrepro.run.task_lm import LMData, LMMeasure, Sample
from attnrepro.run.task_reversal import SEQ_LEN, VOCAB, ReversalData

GOLDEN = Path(__file__).resolve().parents[3] / "tests" / "golden"
# Relative tolerance of a golden comparison. Measured (scripts/golden.py --measure): one vs two
# threads on a 2-core AMD EPYC moved no value by more than RTOL_MEASURED (one unit of the 6
# significant digits the run's files keep); allowed: about 14x that, for other CPUs' float order.
# A LayerNorm eps of 1e-6 instead of 1e-5 moves every case but charlm by 1.1e-3 to 1.2e-2 (charlm's
# LayerNorm inputs have unit variance there, so eps moves them by ~5e-6: below what 6 digits show).
RTOL_MEASURED = 7e-6
RTOL = 1e-4
ATOL = 1e-7  # values that are zero up to float noise (a causal mask's future weight)
STEPS = 24

_SMALL = dict(vocab_size=None, block_size=16, d_model=32, n_head=2, d_qk=None, n_layer=2, scaled=True,
              bug="correct", causal=True, impl="manual", fused_qkv=True, qkv_bias=False, proj_bias=False, mlp_ratio=2,
              activation="gelu", dropout=0.0, tie_weights=True, head_bias=False, init_std=0.02, init="gpt2",
              qk_norm="none", qk_gain_init=None)
_OPTIM = OptimConfig(steps=STEPS, batch_size=4, optimizer="adamw", lr=3e-3, betas=[0.9, 0.95], weight_decay=0.1,
                     decay="2d", schedule="cosine", warmup=4, min_lr_ratio=0.1, grad_clip=1.0)
_LM_DATA = LMData(val_batches=2, val_seed=7)
_CHAPTER = LMMeasure(loss_window=4, summary_steps=[0, 12], diagnostics=True, qk_scale=True, symptoms=False,
                     sample=Sample(prompt="\u79e6\u5ddd", tokens=6, temperature=0.8, seed=0))
_SYMPTOMS = LMMeasure(loss_window=4, summary_steps=[], diagnostics=False, qk_scale=False, symptoms=True, sample=None)


def _lm(model: dict, measure: LMMeasure, label: str, **spec) -> RunSpec:
    return RunSpec(task="corpus_lm", model=ModelConfig(**{**_SMALL, **model}), optim=_OPTIM, seed=0, batch_seed=0,
                   data=_LM_DATA, diag_every=6, diag_steps=(), eval_every=8, eval_final=True, measure=measure,
                   threads=1, device="cpu", label=label, **spec)


def cases() -> dict[str, RunSpec]:
    out = {"corpus_lm": _lm({}, _CHAPTER, "chapter LM"),
           "corpus_lm_unscaled": _lm({"scaled": False, "n_head": 1}, _CHAPTER, "chapter LM, unscaled, d_head 32")}
    for bug in ("mask_zero", "scale_after_softmax", "no_stable_softmax", "dk_not_sqrt"):
        out[f"failures_{bug}"] = _lm({"bug": bug}, _SYMPTOMS, f"injected bug {bug}")
    out["qknorm_layernorm"] = _lm({"qk_norm": "layernorm"}, _CHAPTER, "QK-norm layernorm")
    out["qknorm_l2"] = _lm({"qk_norm": "l2", "scaled": False}, _CHAPTER, "QK-norm l2")
    out["charlm"] = RunSpec(
        task="charlm",
        model=ModelConfig(**{**_SMALL, "fused_qkv": False, "proj_bias": True, "activation": "relu", "dropout": 0.1,
                             "tie_weights": False, "head_bias": True, "init": "torch"}),
        optim=replace(_OPTIM, betas=[0.9, 0.999], decay="all", schedule="constant", warmup=0, min_lr_ratio=1.0,
                      grad_clip=None),
        seed=1, batch_seed=2, data=CharLMData(repeat=20, val_fraction=0.1, eval_batches=2, eval_seed=3),
        diag_every=0, diag_steps=(), eval_every=8, eval_final=True, measure=None, threads=1, device="cpu",
        label="char LM")
    out["reversal"] = RunSpec(
        task="reversal",
        model=ModelConfig(**{**_SMALL, "vocab_size": VOCAB, "block_size": SEQ_LEN, "fused_qkv": False,
                             "qkv_bias": True, "proj_bias": True, "tie_weights": False, "head_bias": True,
                             "init": "normal"}),
        optim=replace(_OPTIM, optimizer="adam", betas=[0.9, 0.999], weight_decay=0.0, decay="all",
                      schedule="constant", warmup=0, min_lr_ratio=1.0),
        seed=42, batch_seed=1, data=ReversalData(n_train=256, n_val=64, n_test=64, data_seed=0),
        diag_every=0, diag_steps=(), eval_every=8, eval_final=True, measure=None, threads=1, device="cpu",
        label="digit reversal")
    return out


def inputs(task: str) -> dict[str, bytes]:
    """The cases' inputs: a seeded synthetic token stream (corpus_lm), the package's sentences (charlm)."""
    if task == "charlm":
        return {"text": (Path(__file__).parents[1] / "data" / "charlm_sentences.txt").read_bytes()}
    if task == "reversal":
        return {}
    itos = ["<pad>", "<unk>", "\n", "\u79e6", "\u5ddd", "\u96c4", "\u5e1d", "\u5b85", "\uff0c", "\u3002"]
    rng = np.random.default_rng(0)
    out = {"vocab.json": json.dumps(itos, ensure_ascii=False).encode()}
    for name, n in (("train.npy", 4000), ("val.npy", 600)):
        buf = io.BytesIO()
        np.save(buf, ((np.arange(n) * 5) % 7 + 2 + (rng.random(n) < 0.15)).astype(np.uint16))
        out[name] = buf.getvalue()
    return out


def run_case(spec: RunSpec, threads: int = 1) -> dict:
    """The case's numbers: summary, history and evaluations (threads: for measuring the tolerance)."""
    files = execute_to_bytes(replace(spec, threads=threads), inputs(spec.task))
    out = {"numerics": NUMERICS[spec.task], "task": spec.task}
    for name in ("status", "summary", "history", "evals"):
        out[name] = json.loads(files[f"{name}.json"])
    if "sample.txt" in files:  # generation shares the model's sampling: text compared exactly
        out["sample"] = files["sample.txt"].decode("utf-8")
    return out


def _leaves(obj, path: str = "") -> Iterator[tuple[str, object]]:
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from _leaves(obj[k], f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def largest_difference(expected: dict, got: dict, atol: float = ATOL) -> tuple[float, str]:
    """The largest relative difference of any number (0 within `atol`; inf where the structure differs), and where."""
    a, b = dict(_leaves(expected)), dict(_leaves(got))
    if a.keys() != b.keys():
        where = sorted(a.keys() ^ b.keys())[0]
        return math.inf, f"{where} is {'missing' if where in a else 'new'}"
    worst, where = 0.0, ""
    for k, x in a.items():
        y = b[k]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            d = 0.0 if abs(x - y) <= atol else abs(x - y) / max(abs(x), abs(y))
        else:
            d = 0.0 if x == y else math.inf
        if d > worst:
            worst, where = d, f"{k}: {x!r} -> {y!r}"
    return worst, where


def verdict(name: str, expected: dict, got: dict) -> Optional[str]:
    """None when the case still gives its golden numbers, else the one line to show."""
    task = expected["task"]
    if expected["numerics"] != NUMERICS[task]:
        return (f"golden {name}: tests/golden/{name}.json is for NUMERICS[{task!r}] = {expected['numerics']}, "
                f"the code declares {NUMERICS[task]}: regenerate (python scripts/golden.py)")
    worst, where = largest_difference(expected, got)
    if worst > RTOL:
        return (f"golden {name}: numbers moved ({where}; relative {worst:.2g} > {RTOL:.0e}): "
                f"bump NUMERICS[{task!r}] and regenerate (python scripts/golden.py)")
    return None


def path(name: str) -> Path:
    return GOLDEN / f"{name}.json"


def write(name: str, result: dict) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    path(name).write_text(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
