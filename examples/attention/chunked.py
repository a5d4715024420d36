"""Chunked online-softmax attention in plain torch: FlashAttention's algorithm (Dao et al. 2022).

The keys are visited in blocks; each query row keeps a running maximum m, a running
normaliser l and an unnormalised output acc, rescaled by exp(m_old - m_new) whenever the
maximum grows, so the L x S weight matrix is never built (memory O(L * block) instead of
O(L * S)). Dropout drops weights after the normaliser, as SDPA's. Half-precision inputs are computed in float32 (float64 in float64) and the result is rounded back, as
FlashAttention's kernels accumulate in float32. A query with no visible key returns 0, as
SDPA does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BLOCK = 32  # keys per block


def _block_bias(rows: int, start: int, stop: int, attn_mask, is_causal: bool, device, dtype):
    """Additive mask of keys start..stop-1 (0 or -inf, plus a float attn_mask), or None: built per
    block, so no L x S tensor exists unless the caller passed one."""
    bias = None
    if is_causal:
        keep = torch.arange(start, stop, device=device) <= torch.arange(rows, device=device).unsqueeze(1)
        bias = torch.zeros(keep.shape, device=device, dtype=dtype).masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        block = attn_mask[..., start:stop]
        extra = (torch.zeros(block.shape, device=device, dtype=dtype).masked_fill(~block, -math.inf)
                 if block.dtype == torch.bool else block.to(dtype))
        bias = extra if bias is None else bias + extra
    return bias


def chunked_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    work = torch.promote_types(query.dtype, torch.float32)
    q, k, v = query.to(work) * scale, key.to(work), value.to(work)
    L, S = q.shape[-2], k.shape[-2]
    m = torch.full(q.shape[:-1] + (1,), -math.inf, device=q.device, dtype=work)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), device=q.device, dtype=work)
    for start in range(0, S, BLOCK):
        stop = min(start + BLOCK, S)
        s = q @ k[..., start:stop, :].transpose(-2, -1)
        bias = _block_bias(L, start, stop, attn_mask, is_causal, q.device, work)
        if bias is not None:
            s = s + bias
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # rows with nothing visible yet
        p = torch.exp(s - shift)
        rescale = torch.exp(m - shift)
        l = l * rescale + p.sum(-1, keepdim=True)
        acc = acc * rescale + F.dropout(p, dropout_p) @ v[..., start:stop, :]  # dropped after l: kept / (1 - p)
        m = m_new
    out = acc / torch.where(l > 0, l, torch.ones_like(l))
    return out.to(query.dtype)
