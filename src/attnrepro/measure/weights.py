"""Attention diagnostics of §1.19.3, computed on the rows a query can actually see.

All functions take weights/logits shaped (..., Tq, Tk) whose queries are the last
Tq of Tk positions (see attention.causal_mask) and return one value per leading
index (e.g. per head) averaged over rows, so callers can reduce further.
"""

from __future__ import annotations

import torch

from attnrepro.model.attention import causal_mask


def visible_keys(t_q: int, t_k: int, causal: bool = True, device: torch.device | str = "cpu") -> torch.Tensor:
    """Number of keys each query row can see, shape (Tq,), on `device`."""
    if not causal:
        return torch.full((t_q,), t_k, device=device)
    return torch.arange(t_k - t_q + 1, t_k + 1, device=device)


def normalized_entropy(p: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Row entropy / log(visible keys), averaged over rows with more than one key.

    1 means uniform over the visible keys, 0 means one-hot.
    """
    p = p.double()
    n = visible_keys(p.shape[-2], p.shape[-1], causal, p.device)
    h = -torch.special.xlogy(p, p).sum(-1)  # 0 log 0 = 0
    keep = n > 1
    return (h[..., keep] / torch.log(n[keep].double())).mean(-1)


def jacobian_fro(p: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of the softmax Jacobian J = diag(p) - p p^T, averaged over rows.

    Closed form: ||J||_F^2 = sum p^2 - 2 sum p^3 + (sum p^2)^2, so the n x n x n
    tensor of per-row Jacobians is never built. Rows with one visible key have
    J = 0 and are included (this matches the chapter's step-0 value of 0.2017).
    """
    p = p.double()
    s2 = (p * p).sum(-1)
    s3 = (p * p * p).sum(-1)
    return (s2 - 2 * s3 + s2 * s2).clamp_min(0).sqrt().mean(-1)


def jacobian_fro_explicit(p_row: torch.Tensor) -> torch.Tensor:
    """Reference: build J for one row and take its norm (tests only; O(n^2))."""
    p_row = p_row.double()
    J = torch.diag(p_row) - torch.outer(p_row, p_row)
    return torch.linalg.matrix_norm(J)


def logit_std(logits: torch.Tensor, causal: bool = True) -> float:
    """Standard deviation over unmasked entries only, pooled over all leading dims."""
    if causal:
        allowed = causal_mask(logits.shape[-2], logits.shape[-1], device=logits.device)
        vals = logits[..., allowed]
    else:
        vals = logits.reshape(-1)
    return vals.double().std().item()


def position_stats(p: torch.Tensor) -> dict[str, torch.Tensor]:
    """Diagonal weight, previous-token weight, and the attention centroid distance of each
    query row, dist_i = sum_j (i-j) p_ij (§1.20.3): its mean over rows (`distance`) and its
    standard deviation over rows (`distance_std`, population; large for a "conditional"
    head that looks near for some queries and far for others).

    Rows exclude the query at absolute position 0, which can only see itself
    (unless it is the only query). Every index is made on p's device.
    """
    p = p.double()
    t_q, t_k, dev = p.shape[-2], p.shape[-1], p.device
    pos = torch.arange(t_q, device=dev) + (t_k - t_q)  # absolute position of each query
    rows = torch.nonzero(pos >= 1).flatten() if t_k > 1 else torch.arange(t_q, device=dev)
    pos = pos[rows]
    diag = p[..., rows, pos]
    has_prev = pos >= 1
    prev = torch.where(has_prev, p[..., rows, (pos - 1).clamp_min(0)], torch.zeros((), dtype=p.dtype, device=dev))
    dist = (pos.unsqueeze(-1) - torch.arange(t_k, device=dev)).clamp_min(0).double()
    distance = (p[..., rows, :] * dist).sum(-1)
    return {"diag": diag.mean(-1), "prev": prev.mean(-1), "distance": distance.mean(-1),
            "distance_std": distance.std(-1, correction=0)}


def layer_summary(weights: torch.Tensor, logits: torch.Tensor, causal: bool = True) -> dict:
    """The three training diagnostics for one layer, pooled over batch and heads."""
    return {
        "entropy": normalized_entropy(weights, causal).mean().item(),
        "logit_std": logit_std(logits, causal),
        "jacobian_fro": jacobian_fro(weights).mean().item(),
    }

