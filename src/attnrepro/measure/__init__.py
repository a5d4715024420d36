"""What we measure of attention: weights.py (entropy, softmax Jacobian, logit std, positions),
probes.py (maps, heads, ablation, init scale), head_matching.py (heads matched one-to-one across
runs), health.py (unit checks of an attention function), debugger.py (where a NaN appears),
timing.py (latency and its growth). Imports model and the top modules."""
