"""The float64 reference the audit compares against, and the chapter's bugs as hypotheses.

`reference` follows `torch.nn.functional.scaled_dot_product_attention`'s semantics:
is_causal keeps key j for query i when j <= i (the mask aligned top-left, also when
L != S); a boolean attn_mask keeps the keys that are True; a float attn_mask is added
to the scaled scores (is_causal and attn_mask together: both apply, as SDPA's
flash kernel does); scale=None means 1/sqrt(E); a row with no key left returns 0
(what SDPA does since torch 2.5); key and value with fewer heads than the query (grouped-query
attention, enable_gqa=True) serve query head h from key/value head h // (H / Hkv), as
`repeat_interleave` expands them. A `variant` other than "correct" injects one bug, so
the diagnosis can ask which bug an implementation's output matches.
"""

from __future__ import annotations

import math

import torch

# hypothesis -> what it means, in the chapter's words where the chapter has them
HYPOTHESES: dict[str, str] = {
    "correct": "the correct attention",
    "mask_zero": "masked scores filled with 0 instead of -inf (the chapter's mask_zero)",
    "scale_after_softmax": "1/sqrt(d_k) applied to the weights after the softmax (scale_after_softmax)",
    "dk_not_sqrt": "scores divided by d_k instead of sqrt(d_k) (dk_not_sqrt)",
    "unscaled": "no 1/sqrt(d_k) at all when scale=None",
    "scale_ignored": "the `scale` argument ignored (always 1/sqrt(d_k))",
    "future_leak_1": "causal mask off by one: future leak at offset 1",
    "future_leak_2": "causal mask off by two: future leak at offsets 1-2",
    "causal_bottom_right": "causal mask aligned bottom-right (KV-cache style) where SDPA aligns it top-left",
    "causal_ignored": "is_causal ignored: every query sees every key",
    "mask_inverted": "boolean attn_mask inverted (True taken as 'masked out')",
    "mask_ignored": "attn_mask ignored",
    "mask_ignored_when_causal": "attn_mask ignored when is_causal is also set (SDPA applies both)",
    "mask_sign_flipped": "float attn_mask subtracted from the scores instead of added",
    "softmax_axis": "softmax over the queries (dim -2) instead of the keys: each key's column of weights sums to 1",
    "scale_squared": "the scale applied to both q and k: the logits are multiplied by scale squared (1/d_k when "
                     "scale=None, 0.09 for an explicit scale=0.3)",
    "kv_swapped": "key and value swapped: the output is softmax(q v^T) k, not softmax(q k^T) v",
    "gqa_tiled": "grouped-query heads mapped by tiling (key/value head h % Hkv, `repeat`) where SDPA's enable_gqa "
                 "interleaves (head h // (H/Hkv), `repeat_interleave`)",
    "gqa_heads_dropped": "grouped-query attention with key/value heads dropped: every query head reads key/value "
                         "head 0",
}


def keep_mask(L: int, S: int, attn_mask, is_causal: bool, variant: str = "correct", device=None):
    """Boolean (.., L, S) mask of the keys each query may see, or None when nothing is masked."""
    keep = None
    if is_causal and variant != "causal_ignored":
        i = torch.arange(L, device=device).unsqueeze(1)
        j = torch.arange(S, device=device).unsqueeze(0)
        offset = int(variant.rsplit("_", 1)[1]) if variant.startswith("future_leak_") else 0
        if variant == "causal_bottom_right":
            offset = S - L
        keep = j <= i + offset
    if attn_mask is not None and attn_mask.dtype == torch.bool and variant != "mask_ignored" \
            and not (is_causal and variant == "mask_ignored_when_causal"):
        m = ~attn_mask if variant == "mask_inverted" else attn_mask
        keep = m if keep is None else keep & m
    return keep


def applies(variant: str, query, key, value) -> bool:
    """Whether the bug can be computed on these inputs (a k/v swap needs values as wide as the keys)."""
    return variant != "kv_swapped" or key.shape[-1] == value.shape[-1] == query.shape[-1]


def expand_heads(query, key, value, variant: str = "correct"):
    """Key and value with one head per query head: SDPA's enable_gqa (repeat_interleave), or a variant's mapping."""
    H, Hkv = query.shape[-3], key.shape[-3]
    if Hkv == H:
        return key, value
    if variant == "gqa_tiled":
        return (torch.cat([t] * (H // Hkv), dim=-3) for t in (key, value))
    if variant == "gqa_heads_dropped":
        return (t[..., :1, :, :].expand(*t.shape[:-3], H, *t.shape[-2:]) for t in (key, value))
    return (t.repeat_interleave(H // Hkv, dim=-3) for t in (key, value))


def reference(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *,
              variant: str = "correct"):
    """SDPA's result in float64 (or, with `variant`, the result of one bug)."""
    if variant not in HYPOTHESES:
        raise ValueError(f"unknown variant {variant!r}")
    if variant == "kv_swapped":
        key, value = value, key
    k, v = expand_heads(query, key, value, variant)
    q, k, v = query.double(), k.double(), v.double()
    E, L, S = q.shape[-1], q.shape[-2], k.shape[-2]
    default = {"dk_not_sqrt": 1.0 / E, "unscaled": 1.0}.get(variant, 1.0 / math.sqrt(E))
    s_mult = default if scale is None or variant == "scale_ignored" else scale
    if variant == "scale_squared":
        s_mult = (1.0 / math.sqrt(E) if scale is None else scale) ** 2
    s = q @ k.transpose(-2, -1)
    if variant != "scale_after_softmax":
        s = s * s_mult
    if attn_mask is not None and attn_mask.dtype != torch.bool and variant != "mask_ignored" \
            and not (is_causal and variant == "mask_ignored_when_causal"):
        s = s - attn_mask.double() if variant == "mask_sign_flipped" else s + attn_mask.double()
    keep = keep_mask(L, S, attn_mask, is_causal, variant, q.device)
    if keep is not None:
        s = s.masked_fill(~keep, 0.0 if variant == "mask_zero" else -math.inf)
    axis = -2 if variant == "softmax_axis" else -1
    m = s.amax(axis, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a fully masked row: exp(-inf) = 0
    e = torch.exp(s - m)
    z = e.sum(axis, keepdim=True)
    w = e / torch.where(z > 0, z, torch.ones_like(z))
    if variant == "scale_after_softmax":
        w = w * s_mult
    return w @ v
