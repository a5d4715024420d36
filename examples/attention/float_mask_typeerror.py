"""The textbook attention that accepts only boolean masks and raises TypeError on a float one.

The signature allows a float attn_mask (added to the logits: ALiBi, relative positions);
a TypeError there is a crash the first time a caller passes one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    dtype = query.dtype
    work = torch.promote_types(dtype, torch.float32)  # half inputs computed in float32
    query, key, value = query.to(work), key.to(work), value.to(work)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale
    L, S = scores.shape[-2], scores.shape[-1]
    keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril() if is_causal else None
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be boolean, got {attn_mask.dtype}")  # BUG: float masks are allowed
    if attn_mask is not None:
        keep = attn_mask if keep is None else keep & attn_mask
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return (F.dropout(torch.softmax(scores, dim=-1), dropout_p) @ value).to(dtype)
