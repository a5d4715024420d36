"""Grouped-query attention with the key/value heads tiled instead of interleaved.

`repeat` lays the key/value heads out 0, 1, 0, 1 for 4 query heads and 2 key/value heads;
SDPA's enable_gqa (and Llama's repeat_kv) give each key/value head a block of consecutive
query heads, 0, 0, 1, 1. With one key/value head (multi-query) the two agree, so only
grouped-query inputs show it; every result is still a plausible attention output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    dtype = query.dtype
    work = torch.promote_types(dtype, torch.float32)  # half inputs computed in float32
    query, key, value = query.to(work), key.to(work), value.to(work)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat(1, group, 1, 1), value.repeat(1, group, 1, 1)  # BUG: repeat_interleave(group, dim=-3)
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
    return (weights @ value).to(dtype)
