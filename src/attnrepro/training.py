"""The controlled training loop of §1.18/§2: one seed, one batch order, many variants.

Batch indices come from their own generator, seeded independently of model
initialization, so every variant sees the same batches in the same order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .config import require, require_positive
from .diagnostics import layer_summary
from .model import TinyGPT


@dataclass
class OptimConfig:
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.1  # on 2-D weight matrices only
    warmup: int = 100
    min_lr_ratio: float = 0.1  # cosine decays to this fraction of lr
    grad_clip: float = 1.0

    def validate(self, prefix: str) -> None:
        require_positive(self, ("steps", "batch_size"), prefix)
        require(self.lr > 0, f"{prefix}.lr", self.lr, "a positive number")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{prefix}.betas",
                self.betas, "two numbers in [0, 1)")
        require(self.weight_decay >= 0, f"{prefix}.weight_decay", self.weight_decay, ">= 0")
        require(self.warmup >= 0, f"{prefix}.warmup", self.warmup, "a non-negative integer")
        require(0 <= self.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        require(self.grad_clip > 0, f"{prefix}.grad_clip", self.grad_clip, "a positive number")


def lr_at(step: int, cfg: OptimConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on 2-D weights only (not biases, not LayerNorm)."""
    decay, no_decay = [], []
    for p in model.parameters():  # tied weights appear once
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


class BatchSampler:
    """Random (x, y) windows of a token stream from a dedicated generator."""

    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int, seed: int):
        if len(tokens) <= block_size + 1:
            raise ValueError(f"token stream of {len(tokens)} is too short for block_size {block_size}")
        self.tokens, self.block, self.batch = tokens, block_size, batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        # the last window starts at len - block - 1 (its target ends at the last token)
        starts = torch.randint(0, len(self.tokens) - self.block, (self.batch,), generator=self.gen)
        offsets = torch.arange(self.block)
        x = self.tokens[starts[:, None] + offsets]
        y = self.tokens[starts[:, None] + offsets + 1]
        return x, y


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


@dataclass
class RunResult:
    history: list[dict]  # one row per step
    seconds: float


def train(
    model: TinyGPT,
    sampler: BatchSampler,
    cfg: OptimConfig,
    *,
    diag_steps: set[int],
    val_batches=None,
    val_every: int = 0,
    progress: Optional[Callable[[int, float], None]] = None,
) -> RunResult:
    """Train for cfg.steps; record loss/lr/grad norm every step, diagnostics on diag_steps.

    Diagnostics are taken from the attention weights of that step's own forward
    pass (before the update), so recording them costs no extra forward.
    """
    opt = make_optimizer(model, cfg)
    model.train()
    history = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = sampler.next()
        val_loss = None
        if val_batches is not None and val_every and step % val_every == 0:
            val_loss = evaluate(model, val_batches)["loss"]  # state after `step` updates
        record = step in diag_steps
        model.set_record(record)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        row = {"step": step, "lr": lr, "loss": loss.item(), "grad_norm": gn.item()}
        if record:
            for i, a in enumerate(model.attentions):
                for k, v in layer_summary(a.last["weights"], a.last["logits"], model.cfg.causal).items():
                    row[f"{k}_l{i}"] = v
            model.set_record(False)
        if val_loss is not None:
            row["val_loss"] = val_loss
        history.append(row)
        if progress is not None:
            progress(step, row["loss"])
    return RunResult(history=history, seconds=time.perf_counter() - t0)
