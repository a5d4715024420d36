"""One attention function with explicit switches.

The correct attention and every injected bug of the chapter's §1.11 are the same
code path, so a comparison between them is controlled by construction. The fused
`torch.nn.functional.scaled_dot_product_attention` path sits beside it for speed
and for parity tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F

Bug = Literal["correct", "mask_zero", "scale_after_softmax", "no_stable_softmax", "dk_not_sqrt"]
BUGS: tuple[str, ...] = Bug.__args__  # type: ignore[attr-defined]


QKNormKind = Literal["none", "layernorm", "l2"]


@dataclass
class QKNorm:
    """Normalise q and k per head (over their width d_k) before the dot product (§1.7.8, §1.26.5).

    layernorm  LayerNorm of q and of k with their own learned scale and bias (ViT-22B)
    l2         q / ||q|| and k / ||k||, and the scores times a learned scalar `gain`
               (Henry et al. 2020, "Query-Key Normalization for Transformers")
    The tensors are the owning module's parameters; see model.SelfAttention.
    """
    kind: QKNormKind
    q_weight: Optional[torch.Tensor] = None
    q_bias: Optional[torch.Tensor] = None
    k_weight: Optional[torch.Tensor] = None
    k_bias: Optional[torch.Tensor] = None
    gain: Optional[torch.Tensor] = None

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "layernorm":
            d = (q.shape[-1],)
            return F.layer_norm(q, d, self.q_weight, self.q_bias), F.layer_norm(k, d, self.k_weight, self.k_bias)
        if self.kind == "l2":
            return F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        return q, k


@dataclass
class AttentionResult:
    out: torch.Tensor  # (B, H, Tq, Dv)
    weights: Optional[torch.Tensor]  # (B, H, Tq, Tk) or None on the fused path
    logits: Optional[torch.Tensor]  # scores entering the mask/softmax, (B, H, Tq, Tk)


def causal_mask(t_q: int, t_k: int, device=None) -> torch.Tensor:
    """Boolean (t_q, t_k) mask, True where query i may see key j.

    Queries are the last t_q positions of the t_k keys (as with a KV cache), so
    query i sits at absolute position t_k - t_q + i and sees keys 0..that position.
    """
    offset = t_k - t_q
    if offset < 0:
        raise ValueError(f"more queries ({t_q}) than keys ({t_k})")
    i = torch.arange(t_q, device=device).unsqueeze(1)
    j = torch.arange(t_k, device=device).unsqueeze(0)
    return j <= i + offset


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scaled: bool = True,
    causal: bool = True,
    bug: str = "correct",
    qk_norm: Optional[QKNorm] = None,
    trace: Optional[dict] = None,
) -> AttentionResult:
    """softmax(q k^T / sqrt(d) + mask) v, written out step by step; d = q.shape[-1], the width of
    q and k (d_k), which v need not share (ModelConfig.d_qk).

    scaled: divide scores by sqrt(d) (the variable under study).
    causal: hide future keys.
    bug: one of BUGS; "correct" is the textbook formula, the others inject the
        failure modes of §1.11:
        mask_zero            masked scores filled with 0 instead of -inf
        scale_after_softmax  divide the *weights* by sqrt(d) instead of the scores
        no_stable_softmax    exp(scores) / sum without subtracting the row max
        dk_not_sqrt          divide scores by d instead of sqrt(d)
    qk_norm: normalise q and k first (QKNorm); with `scaled` the 1/sqrt(d) still applies,
        so QK-norm can be tried on top of the scaling or in place of it.
    trace: if a dict is given, the four intermediate tensors of §1.13.3 are stored
        in it under "scores", "masked", "exp", "weights" (for debugging overflow).
    """
    if bug not in BUGS:
        raise ValueError(f"unknown attention bug {bug!r}; expected one of {', '.join(BUGS)}")
    d = q.shape[-1]
    if qk_norm is not None and qk_norm.kind != "none":
        q, k = qk_norm.apply(q, k)
    scores = q @ k.transpose(-2, -1)
    if qk_norm is not None and qk_norm.gain is not None:
        scores = scores * qk_norm.gain
    if bug == "dk_not_sqrt":
        scores = scores / d
    elif scaled and bug != "scale_after_softmax":
        scores = scores / math.sqrt(d)
    logits = scores

    if causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        fill = 0.0 if bug == "mask_zero" else float("-inf")
        scores = scores.masked_fill(~allowed, fill)
    masked = scores

    if bug == "no_stable_softmax":
        e = torch.exp(scores)
    else:
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = e / e.sum(dim=-1, keepdim=True)
    if bug == "scale_after_softmax":
        weights = weights / math.sqrt(d)

    if trace is not None:
        trace.update(scores=logits, masked=masked, exp=e, weights=weights)
    return AttentionResult(out=weights @ v, weights=weights, logits=logits)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scaled: bool = True, causal: bool = True,
    qk_norm: Optional[QKNorm] = None,
) -> torch.Tensor:
    """The same correct attention through PyTorch's fused kernel (no weights returned)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scaled else 1.0
    if qk_norm is not None and qk_norm.kind != "none":
        q, k = qk_norm.apply(q, k)
        if qk_norm.gain is not None:
            q = q * qk_norm.gain
    t_q, t_k = q.shape[-2], k.shape[-2]
    if causal and t_q != t_k:
        # is_causal aligns the mask top-left; a KV cache needs it bottom-right.
        mask = causal_mask(t_q, t_k, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def external_attention(
    fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scaled: bool = True, causal: bool = True,
    qk_norm: Optional[QKNorm] = None, dropout_p: float = 0.0, weights: bool = False,
) -> AttentionResult:
    """Attention through a user's callable with SDPA's signature (params attention.impl).

    scaled passes scale=None, so the callable's own default 1/sqrt(d) is what trains; unscaled
    passes scale=1. SDPA's signature returns no weights: with `weights`, they are read off by a
    second, gradient-free call with the identity matrix as the values (W @ I = W), and the
    logits are q.k times the scale, computed here (a callable exposes no logits)."""
    if qk_norm is not None and qk_norm.kind != "none":
        q, k = qk_norm.apply(q, k)
        if qk_norm.gain is not None:
            q = q * qk_norm.gain
    scale = None if scaled else 1.0
    t_q, t_k = q.shape[-2], k.shape[-2]
    # is_causal aligns the mask top-left; a KV cache needs it bottom-right
    kw = {"attn_mask": causal_mask(t_q, t_k, device=q.device)} if causal and t_q != t_k else {"is_causal": causal}
    out = fn(q, k, v, dropout_p=dropout_p, scale=scale, **kw)
    if not weights:
        return AttentionResult(out=out, weights=None, logits=None)
    with torch.no_grad():
        eye = torch.eye(t_k, dtype=q.dtype, device=q.device).expand(*k.shape[:-2], t_k, t_k)
        w = fn(q, k, eye, scale=scale, **kw)
        logits = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scaled else 1.0)
    return AttentionResult(out=out, weights=w, logits=logits)
