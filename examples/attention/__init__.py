"""Attention implementations to audit with `attnrepro audit examples.attention.<module>:<function>`.

chunked              chunked online-softmax attention (FlashAttention's algorithm) in plain torch: correct
mask_zero            masked scores filled with 0 instead of -inf
no_max_subtraction   softmax without subtracting the row maximum
dk_not_sqrt          scores divided by d_k instead of sqrt(d_k)
scale_after_softmax  the 1/sqrt(d_k) applied to the weights, after the softmax
future_leak          causal mask off by one: each query also sees the next key

Every one has the signature of torch.nn.functional.scaled_dot_product_attention. The five
wrong ones are the textbook formula with one line changed (marked BUG), each a different
class of bug; `attnrepro audit` names each.
"""
