"""The one training loop, and what it is made of: optimizer, schedule, batches, evaluation.

Every model of the project (the chapter's four variants, the injected bugs, the
QK-norm and sensitivity sweeps, digit reversal, the char LM) trains in
`train_loop`; what differs between them is data, not code: the OptimConfig
(AdamW or Adam, which parameters decay, cosine or constant lr, clipping), the batch
source (random windows of a token stream, or a pre-drawn index table), the
evaluation callback and the steps whose attention diagnostics are recorded.

Batches come from their own generator, seeded independently of model
initialization, so every variant of a comparison sees the same batches in the same
order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Literal, Optional, Protocol

import numpy as np
import torch

from attnrepro.config import require, require_positive
from attnrepro.measure.debugger import AttentionDebugger
from attnrepro.measure.weights import layer_summary
from attnrepro.model.transformer import TinyGPT


@dataclass
class OptimConfig:
    steps: int
    batch_size: int
    optimizer: Literal["adamw", "adam"]
    lr: float
    betas: list[float]
    weight_decay: float
    decay: Literal["2d", "all"]  # which parameters weight decay applies to
    schedule: Literal["cosine", "constant"]  # cosine: linear warm-up, then cosine to min_lr_ratio * lr
    warmup: int
    min_lr_ratio: float
    grad_clip: Optional[float]  # max global grad norm; null = no clipping

    def validate(self, prefix: str) -> None:
        require_positive(self, ("steps", "batch_size"), prefix)
        require(math.isfinite(self.lr) and self.lr > 0, f"{prefix}.lr", self.lr, "a finite positive number")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{prefix}.betas",
                self.betas, "two numbers in [0, 1)")
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0, f"{prefix}.weight_decay",
                self.weight_decay, "a finite number >= 0")
        require(self.optimizer == "adamw" or self.weight_decay == 0, f"{prefix}.weight_decay",
                self.weight_decay, "0 with optimizer 'adam' (use 'adamw' for decoupled weight decay)")
        require(self.warmup >= 0, f"{prefix}.warmup", self.warmup, "a non-negative integer")
        require(0 <= self.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        require(self.grad_clip is None or (math.isfinite(self.grad_clip) and self.grad_clip > 0),
                f"{prefix}.grad_clip", self.grad_clip, "a finite positive number, or null for no clipping")


def lr_at(step: int, cfg: OptimConfig) -> float:
    """cosine: linear warm-up, then cosine decay to min_lr_ratio * lr; constant: lr."""
    if cfg.schedule == "constant":
        return cfg.lr
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW or Adam; with decay '2d', weight decay on 2-D weights only (not biases, not LayerNorm)."""
    params = list(model.parameters())  # tied weights appear once
    if cfg.decay == "2d":
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": cfg.weight_decay}]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(groups, lr=cfg.lr, betas=tuple(cfg.betas))


class Batches(Protocol):
    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...


class BatchSampler:
    """Random (x, y) windows of a token stream from a dedicated generator."""
    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int, seed: int, spare: int = 0):
        """Starts are drawn below len - block - spare: with spare 0 the last window's target ends at
        the last token; doc 003's `torch.randint(0, len(data_source) - block_size - 1, ...)` is spare 1."""
        if len(tokens) <= block_size + 1 + spare:
            raise ValueError(f"token stream of {len(tokens)} is too short for block_size {block_size}")
        self.tokens, self.block, self.batch, self.spare = tokens, block_size, batch_size, spare
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.tokens) - self.block - self.spare, (self.batch,), generator=self.gen)
        offsets = torch.arange(self.block, device=self.tokens.device)
        starts = starts.to(self.tokens.device)
        x = self.tokens[starts[:, None] + offsets]
        y = self.tokens[starts[:, None] + offsets + 1]
        return x, y


class IndexedBatches:
    """Rows of fixed (x, y) tensors, taken in the order of a pre-drawn (steps, batch) index table."""
    def __init__(self, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor):
        self.x, self.y, self.indices, self.i = x, y, indices, 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices[self.i]
        self.i += 1
        return self.x[idx], self.y[idx]


def fixed_batches(tokens: torch.Tensor, block_size: int, batch_size: int, n: int, seed: int):
    sampler = BatchSampler(tokens, block_size, batch_size, seed)
    return [sampler.next() for _ in range(n)]


def load_tokens(path) -> torch.Tensor:
    return torch.from_numpy(np.load(path).astype(np.int64))


@torch.no_grad()
def evaluate(model: TinyGPT, batches) -> dict:
    """Mean loss and per-layer attention diagnostics over fixed batches."""
    was_training = model.training
    model.eval()
    model.set_record(True)
    losses, per_layer = [], [[] for _ in model.attentions]
    for x, y in batches:
        _, loss = model(x, y)
        losses.append(loss.item())
        for i, a in enumerate(model.attentions):
            per_layer[i].append(layer_summary(a.last["weights"], a.last["logits"], model.cfg.causal))
    model.set_record(False)
    model.train(was_training)
    out = {"loss": float(np.mean(losses))}
    for i, rows in enumerate(per_layer):
        for key in rows[0]:
            out[f"{key}_l{i}"] = float(np.mean([r[key] for r in rows]))
    return out


@torch.no_grad()
def qk_scale(model: TinyGPT, x: torch.Tensor) -> dict:
    """Per layer: std of q and k activations, of the logits over causal entries, ||W_qkv||_F."""
    was_training = model.training
    model.eval()
    model.set_record(True)
    model(x)
    out = {}
    for i, a in enumerate(model.attentions):
        last = a.last
        out[f"q_std_l{i}"] = last["q"].double().std().item()
        out[f"k_std_l{i}"] = last["k"].double().std().item()
        out[f"logit_std_l{i}"] = layer_summary(last["weights"], last["logits"], model.cfg.causal)["logit_std"]
        w = a.qkv.weight if model.cfg.fused_qkv else torch.cat([a.q.weight, a.k.weight, a.v.weight])
        out[f"w_qkv_fro_l{i}"] = w.double().norm().item()
    model.set_record(False)
    model.train(was_training)
    return out


class Diverged(RuntimeError):
    """The loss or the gradient went non-finite; says at which step and where."""
    def __init__(self, step: int, what: str, value: float, where: str):
        super().__init__(f"diverged at step {step}: {what} is {value}; {where}")
        self.step, self.what, self.value, self.where = step, what, value, where


def _localize(model: TinyGPT, x: torch.Tensor) -> str:
    """Re-run the forward of the offending batch: the AttentionDebugger names the attention layer and
    operation that went non-finite first; otherwise the first module whose output is non-finite."""
    first: list[str] = []

    def watch(name):
        def hook(module, args, output):
            if not first and isinstance(output, torch.Tensor) and not torch.isfinite(output).all():
                first.append(name)
        return hook

    leaves = [(n, m) for n, m in model.named_modules() if n and not any(m.children())]
    handles = [m.register_forward_hook(watch(n)) for n, m in leaves]
    was_training = model.training
    model.eval()
    try:
        with AttentionDebugger(model, warn=False) as dbg, torch.no_grad():
            model(x)
            loc = dbg.localize()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if loc.found or not first:
        return loc.detail
    return f"attention stayed finite; the first non-finite output is module {first[0]}'s"


def _bad_grads(model: TinyGPT) -> str:
    names = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    return "non-finite gradient in " + ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


@dataclass
class TrainingLog:
    history: list[dict]  # one row per step: step, lr, loss, grad_norm (+ diagnostics on diag steps)
    evals: list[dict]  # one row per evaluation: step (= updates done) + what `evaluate` returned
    seconds: float


def train_loop(
    model: TinyGPT,
    batches: Batches,
    cfg: OptimConfig,
    *,
    diag_steps: set[int] = frozenset(),
    evaluate_fn: Optional[Callable[[TinyGPT], dict]] = None,
    eval_every: int = 0,
    eval_final: bool = False,
    progress: Optional[Callable[[int, float], None]] = None,
) -> TrainingLog:
    """Train for cfg.steps; record loss/lr/grad norm every step, diagnostics on diag_steps.

    Diagnostics come from the attention weights of that step's own forward pass
    (before the update), so recording them costs no extra forward. `evaluate_fn`
    runs on the state after `step` updates, every `eval_every` steps from step 0,
    and after the last step when `eval_final`. A non-finite loss or gradient stops
    the run at once with `Diverged`, naming the step and the first attention layer
    and operation that went non-finite.
    """
    opt = make_optimizer(model, cfg)
    model.train()
    history, evals = [], []
    t0 = time.perf_counter()
    for step in range(cfg.steps + 1):
        due = (eval_every and step % eval_every == 0 and step < cfg.steps) or (step == cfg.steps and eval_final)
        if evaluate_fn is not None and due:
            evals.append({"step": step, **evaluate_fn(model)})
        if step == cfg.steps:
            break
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batches.next()
        record = step in diag_steps
        model.set_record(record)
        _, loss = model(x, y)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            model.set_record(False)
            raise Diverged(step, "the training loss", loss_value, _localize(model, x))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
        if not math.isfinite(grad_norm):
            model.set_record(False)
            raise Diverged(step, "the gradient norm", grad_norm, _bad_grads(model))
        opt.step()
        row = {"step": step, "lr": lr, "loss": loss_value, "grad_norm": grad_norm}
        if record:
            for i, a in enumerate(model.attentions):
                for k, v in layer_summary(a.last["weights"], a.last["logits"], model.cfg.causal).items():
                    row[f"{k}_l{i}"] = v
            model.set_record(False)
        history.append(row)
        if progress is not None:
            progress(step, loss_value)
    return TrainingLog(history=history, evals=evals, seconds=time.perf_counter() - t0)
