"""Adapters to SDPA's signature for attention the project did not write, to audit them:

sdpa_math, sdpa_flash    torch's scaled_dot_product_attention pinned to one CPU backend
                         (a backend that has no kernel for an input raises NotImplementedError;
                         enable_gqa passed through)
mha                      torch.nn.MultiheadAttention with identity projections: (B, H, L, E) as
                         (B, L, H*E), its bool mask convention (True = masked out) and its own
                         scale (1/sqrt(head_dim)) translated
mha_weights              the same with need_weights=True: MultiheadAttention's explicit
                         bmm + softmax path, not SDPA
quantizable_mha          torch.ao.nn.quantizable.MultiheadAttention (float): a separate plain-ops
                         implementation of the same module

Each adapter only translates conventions; whatever the audit finds is the library's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.ao.nn.quantizable import MultiheadAttention as QuantizableMHA
from torch.nn.attention import SDPBackend, sdpa_kernel

NO_KERNEL = ("No viable backend", "No available kernel")


def _pinned(backend, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    try:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    except RuntimeError as e:
        if any(text in str(e) for text in NO_KERNEL):
            raise NotImplementedError(f"{backend.name}: no kernel for this input") from None
        raise


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _pinned(SDPBackend.MATH, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def sdpa_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _pinned(SDPBackend.FLASH_ATTENTION, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _mha_mask(attn_mask, is_causal, B, H, L, S, device):
    """SDPA's (keep = True, or additive) mask as MultiheadAttention's (True = masked out, or additive),
    (L, S) or (B*H, L, S), with is_causal's top-left triangle folded in."""
    mask = None
    if attn_mask is not None:
        mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask
        if mask.dim() > 2:
            mask = mask.expand(B, H, L, S).reshape(B * H, L, S)
    if is_causal:
        above = torch.ones(L, S, dtype=torch.bool, device=device).triu(1)
        if mask is None:
            mask = above
        elif mask.dtype == torch.bool:
            mask = mask | above
        else:
            mask = mask.masked_fill(above, -math.inf)
    return mask


def _mha_call(module_cls, need_weights, query, key, value, attn_mask, dropout_p, is_causal, scale):
    B, H, L, E = query.shape
    S, Ev = key.shape[-2], value.shape[-1]
    if Ev != E:
        raise NotImplementedError("MultiheadAttention: value width must equal the key width (vdim projects)")
    mha = module_cls(H * E, H, dropout=dropout_p, bias=False, batch_first=True, device=query.device,
                     dtype=query.dtype)
    with torch.no_grad():
        projections = [mha.out_proj.weight]
        # the quantizable module projects through linear_Q/K/V (its in_proj_weight is unused)
        projections += [mha.linear_Q.weight, mha.linear_K.weight, mha.linear_V.weight] if hasattr(mha, "linear_Q") \
            else [mha.in_proj_weight]
        for w in projections:
            w.copy_(torch.eye(w.shape[1], dtype=w.dtype).repeat(w.shape[0] // w.shape[1], 1))
    mha.train(dropout_p > 0)
    if scale is not None:  # MultiheadAttention always scales by 1/sqrt(head_dim)
        query = query * (scale * math.sqrt(E))
    flat = [t.transpose(1, 2).reshape(B, t.shape[2], H * t.shape[3]) for t in (query, key, value)]
    out = mha(*flat, attn_mask=_mha_mask(attn_mask, is_causal, B, H, L, S, query.device),
              need_weights=need_weights)[0]
    return out.reshape(B, L, H, E).transpose(1, 2)


def mha(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _mha_call(torch.nn.MultiheadAttention, False, query, key, value, attn_mask, dropout_p, is_causal, scale)


def mha_weights(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _mha_call(torch.nn.MultiheadAttention, True, query, key, value, attn_mask, dropout_p, is_causal, scale)


def quantizable_mha(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _mha_call(QuantizableMHA, True, query, key, value, attn_mask, dropout_p, is_causal, scale)
