"""The textbook attention with grouped-query (and multi-query) attention: correct.

Key and value may have fewer heads than the query (enable_gqa=True, as SDPA takes it since
torch 2.5): query head h reads key/value head h // (H / Hkv), each key/value head repeated
for its group of consecutive query heads (`repeat_interleave`), as Llama's repeat_kv does.
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
        key, value = key.repeat_interleave(group, dim=-3), value.repeat_interleave(group, dim=-3)
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
