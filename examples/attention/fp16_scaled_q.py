"""A correct attention computed in the input's dtype (fp16 stays fp16), q scaled before q k^T.

Scaling q first keeps every intermediate at the size of the scaled logits, so fp16 holds
logits up to 65504 instead of 65504 / sqrt(d_k); the softmax subtracts the row maximum.
A fully masked row returns 0, as scaled_dot_product_attention does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query * scale) @ key.transpose(-2, -1)
    L, S = scores.shape[-2], scores.shape[-1]
    keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril() if is_causal else None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask if keep is None else keep & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))  # a row with no key: 0, not NaN
    return F.dropout(weights, dropout_p) @ value
