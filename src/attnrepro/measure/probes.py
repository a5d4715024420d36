"""Measurements on fixed models: the init sweep (§1.3/§1.19.1), head portraits and
ablation (§1.8.5-1.8.6). (The injected bugs' symptoms are measured inside their runs:
attnrepro.corpus_lm.weight_symptoms.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..attention import causal_mask
from ..config import require, require_positive
from .weights import logit_std, normalized_entropy, position_stats
from ..model import ModelConfig, TinyGPT
from ..training import mean_loss

# ---------------------------------------------------------------- init sweep


@dataclass
class InitSweepConfig:
    """params `init_sweep` (no defaults: params.yaml is the only source of values)."""

    d_heads: list[int]
    vocab_size: int
    block_size: int
    batch_size: int
    n_batches: int
    token_low: int  # tokens drawn from randint(token_low, vocab_size)
    init_std: float  # sigma of the N(0, sigma^2) init, also the prediction's sigma
    model_seed: int  # torch.manual_seed before building each model
    batch_seed: int  # generator of the token batches (shared by every d_head)
    threads: int

    def validate(self, prefix: str = "init_sweep") -> None:
        require(len(self.d_heads) >= 2 and all(d > 0 for d in self.d_heads), f"{prefix}.d_heads",
                self.d_heads, "at least two positive integers")
        require_positive(self, ("block_size", "batch_size", "n_batches", "threads"), prefix)
        require(0 <= self.token_low < self.vocab_size, f"{prefix}.token_low", self.token_low,
                f"in [0, vocab_size={self.vocab_size})")
        require(math.isfinite(self.init_std) and self.init_std > 0, f"{prefix}.init_std", self.init_std,
                "a finite positive number")


def init_model(d_head: int, *, vocab_size: int, block_size: int, init_std: float, seed: int,
               impl: str = "manual") -> TinyGPT:
    """Single-head, single-layer TinyGPT at initialization, unscaled (raw q.k logits); `impl` its attention
    (ModelConfig.impl)."""
    cfg = ModelConfig(vocab_size=vocab_size, block_size=block_size, d_model=d_head, n_head=1, n_layer=1,
                      scaled=False, init_std=init_std, impl=impl)
    torch.manual_seed(seed)
    return TinyGPT(cfg).eval()


def random_batches(n: int, batch: int, block: int, low: int, high: int, seed: int) -> torch.Tensor:
    """n token batches `randint(low, high, (batch, block))` from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n, batch, block), generator=g)


@torch.no_grad()
def measure_init(model: TinyGPT, batches: torch.Tensor, tick: Optional[Callable[[], None]] = None) -> dict:
    """Unscaled logit std (mean of per-batch stds, and pooled), entropy, q/k variance."""
    model.set_record(True)
    attn = model.attentions[0]
    stds, ents, q_vars, k_vars, pooled = [], [], [], [], []
    block = model.blocks[0]
    for x in batches:
        # only layer 0's attention is measured: skip the MLP and the output head
        pos = torch.arange(x.shape[1])
        block.attn(block.ln1(model.tok_emb(x) + model.pos_emb(pos)))
        last = attn.last
        stds.append(logit_std(last["logits"]))
        ents.append(normalized_entropy(last["weights"]).mean().item())
        q_vars.append(last["q"].double().var().item())
        k_vars.append(last["k"].double().var().item())
        allowed = causal_mask(x.shape[1], x.shape[1])
        pooled.append(last["logits"][..., allowed].double().reshape(-1))
        if tick is not None:
            tick()
    model.set_record(False)
    return {
        "logit_std": float(np.mean(stds)),
        "logit_std_pooled": torch.cat(pooled).std().item(),
        "logit_std_batch_sd": float(np.std(stds)),
        "entropy": float(np.mean(ents)),
        "q_var": float(np.mean(q_vars)),
        "k_var": float(np.mean(k_vars)),
    }


def predictions(d_head: int, init_std: float) -> dict:
    """Footnote sqrt(d) and the variance-propagation v*sqrt(d), v = d_model * sigma^2 (eq. 1.1-1.2)."""
    v = d_head * init_std**2
    return {"theory_sqrt_d": math.sqrt(d_head), "v": v, "pred_varprop": v * math.sqrt(d_head)}


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def sweep_fit(rows: list[dict]) -> dict:
    """Which prediction fits: fitted slope vs 0.5 (footnote) and 1.5 (varprop), log ratios."""
    d = [r["d_head"] for r in rows]
    meas = [r["logit_std"] for r in rows]
    lr_sqrt = [abs(math.log10(r["ratio_sqrt_d"])) for r in rows]
    lr_var = [abs(math.log10(r["ratio_varprop"])) for r in rows]
    return {
        "slope_measured": loglog_slope(d, meas),
        "slope_footnote": 0.5,
        "slope_varprop": 1.5,
        "max_abs_log10_ratio_footnote": max(lr_sqrt),
        "max_abs_log10_ratio_varprop": max(lr_var),
        "varprop_fits_better": int(max(lr_var) < min(lr_sqrt)),
    }


# ---------------------------------------------------------------- heads


@dataclass
class HeadsConfig:
    """params `heads` (no defaults: params.yaml is the only source of values)."""

    checkpoint: str  # a run's model.pt (the train stage's d32_scaled); its folder is the DVC dep
    n_seqs: int
    seq_len: int
    seq_seed: int
    ablation_batches: int
    ablation_batch_size: int
    ablation_seed: int
    threads: int

    def validate(self, prefix: str = "heads") -> None:
        require(bool(self.checkpoint), f"{prefix}.checkpoint", self.checkpoint, "a checkpoint path")
        require_positive(self, ("n_seqs", "seq_len", "ablation_batches", "ablation_batch_size", "threads"), prefix)
        require(self.seq_len >= 2, f"{prefix}.seq_len", self.seq_len, "at least 2")


def fixed_sequences(tokens: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """n windows of `length` tokens at start positions drawn from a seeded generator."""
    if len(tokens) <= length:
        raise ValueError(f"token stream of {len(tokens)} is too short for sequences of {length}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - length, (n,), generator=g)
    return torch.stack([tokens[s: s + length] for s in starts.tolist()])


@torch.no_grad()
def attention_maps(model: TinyGPT, x: torch.Tensor) -> list[torch.Tensor]:
    """Per layer the attention weights (B, H, T, T) of one forward of the token batch x (B, T),
    in eval mode (the one place that records a model's attention maps)."""
    model.eval()
    model.set_record(True)
    try:
        model(x)
        return [a.last["weights"].clone() for a in model.attentions]
    finally:
        model.set_record(False)


def sequence_maps(model: TinyGPT, seq: torch.Tensor) -> torch.Tensor:
    """(n_layer, n_head, T, T) attention weights of one token sequence seq (T,)."""
    return torch.stack([w[0] for w in attention_maps(model, seq[None])])


def head_stats(maps: list[torch.Tensor]) -> list[dict]:
    """Rows {layer, head, entropy, diag, prev, distance, distance_std}, averaged over sequences;
    distance_std is the spread over query positions of the attention centroid distance (§1.20.3)."""
    rows = []
    for li, w in enumerate(maps):
        ent = normalized_entropy(w).mean(0)  # (H,)
        pos = {k: v.mean(0) for k, v in position_stats(w).items()}
        for h in range(w.shape[1]):
            rows.append({"layer": li, "head": h, "entropy": ent[h].item(),
                         **{k: pos[k][h].item() for k in ("diag", "prev", "distance", "distance_std")}})
    return rows


def uniform_distance_std(seq_len: int) -> float:
    """The centroid-distance spread of uniform causal attention over `seq_len` tokens: what the
    growth of the row index alone gives (dist_i = i/2), the baseline a "conditional" head must beat."""
    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.float64))
    return position_stats(causal / causal.sum(-1, keepdim=True))["distance_std"].item()


@torch.no_grad()
def diag_weight_all_rows(model: TinyGPT, batches) -> float:
    """Layer-0 diagonal weight averaged over every query row, row 0 included (which can only
    see itself): a second protocol for the failures table's diagonal weight."""
    was = model.training
    model.eval()
    model.set_record(True)
    vals = []
    for x, _ in batches:
        model(x)
        w = model.attentions[0].last["weights"].double()
        vals.append(torch.diagonal(w, dim1=-2, dim2=-1).mean().item())
    model.set_record(False)
    model.train(was)
    return float(np.mean(vals))


@torch.no_grad()
def ablate_heads(model: TinyGPT, batches, tick: Optional[Callable[[], None]] = None) -> tuple[float, list[dict]]:
    """Zero each head's d_head input columns of attn.proj.weight in turn; loss delta; restore.

    Raises RuntimeError if a projection is not restored bit-exactly.
    """
    base = mean_loss(model, batches)
    rows = []
    dh = model.cfg.d_head
    for li, attn in enumerate(model.attentions):
        W = attn.proj.weight
        original = W.detach().clone()
        for h in range(model.cfg.n_head):
            cols = slice(h * dh, (h + 1) * dh)
            saved = W[:, cols].clone()
            W[:, cols] = 0
            loss = mean_loss(model, batches)
            W[:, cols] = saved
            if not torch.equal(W, original):
                raise RuntimeError(f"layer {li} head {h}: attn.proj.weight not restored after ablation")
            rows.append({"layer": li, "head": h, "loss": loss, "delta": loss - base})
            if tick is not None:
                tick()
    if mean_loss(model, batches) != base:
        raise RuntimeError("loss after restoring every head differs from the baseline")
    return base, rows


# ---------------------------------------------------------------- failure symptoms
