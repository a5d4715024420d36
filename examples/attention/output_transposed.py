"""The textbook attention returning (B, L, H, Ev) where SDPA returns (B, H, L, Ev).

Copied from a module that transposes heads back next to the features before its output
projection: the values are right, their layout is not SDPA's.
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
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask if keep is None else keep & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask.to(work)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = F.dropout(torch.nan_to_num(torch.softmax(scores, dim=-1)), dropout_p)
    return (weights @ value).transpose(1, 2).to(dtype)  # BUG: no transpose
