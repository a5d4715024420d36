"""Attention implementations to audit with `attnrepro audit examples.attention.<module>:<function>`.

chunked              chunked online-softmax attention (FlashAttention's algorithm) in plain torch: correct
mask_zero            masked scores filled with 0 instead of -inf
no_max_subtraction   softmax without subtracting the row maximum
dk_not_sqrt          scores divided by d_k instead of sqrt(d_k)
scale_after_softmax  the 1/sqrt(d_k) applied to the weights, after the softmax
future_leak          causal mask off by one: each query also sees the next key
fp16_scaled_q        computed in the input's dtype, q scaled before q k^T: correct
mask_ignored_when_causal  attn_mask dropped when is_causal is also set
softmax_wrong_axis   softmax over the queries (dim -2)
dropout_always_on    dropout rate hard-coded to 0.1, whatever dropout_p says
mask_fill_finite     masked scores filled with -1e4 instead of -inf
mask_sign_flipped    a float attn_mask subtracted instead of added
bool_mask_inverted   a boolean attn_mask read as "True = masked out"
float_mask_typeerror raises TypeError on a float attn_mask (an input the signature allows)
bool_masks_only      correct, but raises NotImplementedError on a float attn_mask: INCOMPLETE
fp16_plain           q k^T in the input's dtype before the scale: fp16 overflows at logit 16384
causal_bottom_right  is_causal aligned bottom-right (KV-cache style) where SDPA aligns it top-left
gqa_interleaved      grouped- and multi-query attention (enable_gqa), key/value heads repeat_interleave'd: correct
gqa_tiled            grouped-query key/value heads tiled (repeat) instead of interleaved
output_transposed    returns (B, L, H, Ev) where SDPA returns (B, H, L, Ev)
kv_swapped           key and value swapped: softmax(q v^T) k; raises when the values' width is not the keys'

Every one has the signature of torch.nn.functional.scaled_dot_product_attention. The wrong
ones are the textbook formula with one line changed (marked BUG), each a different class of
bug; `attnrepro audit` names each (tests/test_audit.py asserts each first line).
"""
