"""Measurements of attention in fixed models: the logit scale at initialization (§1.3/§1.19.1),
attention maps, per-head statistics and head ablation (§1.8.5-1.8.6), and the failures' second
diagonal-weight protocol. (The injected bugs' symptoms are measured inside their runs:
attnrepro.run.task_lm.weight_symptoms; the experiments using these: attnrepro.experiments.init_sweep,
.heads and .failures.)
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from attnrepro.measure.weights import logit_std, normalized_entropy, position_stats
from attnrepro.model.attention import causal_mask
from attnrepro.model.transformer import TinyGPT, mean_loss

# ---------------------------------------------------------------- init scale


@torch.no_grad()
def measure_init(model: TinyGPT, batches: torch.Tensor, tick: Optional[Callable[[], None]] = None) -> dict:
    """Unscaled logit std (mean of per-batch stds, and pooled), entropy, q/k variance."""
    model.set_record(True)
    attn = model.attentions[0]
    stds, ents, q_vars, k_vars, pooled = [], [], [], [], []
    block = model.blocks[0]
    for x in batches:
        # only layer 0's attention is measured: skip the MLP and the output head
        pos = torch.arange(x.shape[1], device=x.device)
        block.attn(block.ln1(model.tok_emb(x) + model.pos_emb(pos)))
        last = attn.last
        stds.append(logit_std(last["logits"]))
        ents.append(normalized_entropy(last["weights"]).mean().item())
        q_vars.append(last["q"].double().var().item())
        k_vars.append(last["k"].double().var().item())
        allowed = causal_mask(x.shape[1], x.shape[1], device=x.device)
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


# ---------------------------------------------------------------- heads


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
