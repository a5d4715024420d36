"""The textbook attention computed in the input's dtype, q k^T before the scale.

Functionally right; in fp16 the raw dot products overflow (65504) once a scaled logit
passes 65504 / sqrt(d_k) (16384 at d_k = 16), long before the softmax sees them.
Two fixes: scale q before q k^T (fp16_scaled_q), or compute the scores in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale  # BUG in fp16: q k^T overflows before the scale
    L, S = scores.shape[-2], scores.shape[-1]
    keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril() if is_causal else None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask if keep is None else keep & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return F.dropout(torch.softmax(scores, dim=-1), dropout_p) @ value
