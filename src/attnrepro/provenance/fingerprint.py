"""The computation's fingerprint: what no float order can change, computed in seconds.

Each probe runs one path of the pipeline's code on fixed inputs made here and returns plain values:
integers where the path is integer (the vocabulary, the token ids, the train/validation split, the
batch order, sampled tokens), the learning rate at every step of the chapter's schedule (Python
floats), the initial weights' statistics, and float64 forward passes, optimizer steps, evaluations and
generation of small models whose weights are drawn by numpy (the same bits on every machine). A float
order moves a float64 value by about 1e-15 relative; the smallest change of the computation the gate
matrix holds (LayerNorm's eps, 1e-6 for 1e-5) moves these by about 1e-6. So unlike the golden runs
(float32, compared at 1e-4: run/golden.py) the fingerprint is compared at RTOL 1e-9 on every machine.

tests/golden/fingerprint.json holds the reference's values (`python scripts/golden.py` writes it);
tests/test_golden.py and `attnrepro check` (the latter reading it at the reference revision) compare.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from attnrepro.data import corpus
from attnrepro.model.attention import attention
from attnrepro.model.kv import generate_cached
from attnrepro.model.transformer import ModelConfig, TinyGPT, generate, load_checkpoint, mean_loss
from attnrepro.run.golden import largest_difference
from attnrepro.run.loop import BatchSampler, OptimConfig, evaluate, fixed_batches, lr_at, train_loop

RTOL = 1e-9  # float64 values; the float-order noise is about 1e-15
# statistics of float32 weights drawn by torch, whose normal differs by an ulp between vector instruction sets:
# without them (ATen's DEFAULT) a mean of 1.3e-5 moved by 1.8e-10
INIT_RTOL, INIT_ATOL = 1e-6, 1e-9
NAME = "fingerprint"

# the chapter's protocol (params train and train.models, §1.18.3), as the code must read it
CHAPTER_OPTIM = OptimConfig(steps=1500, batch_size=32, optimizer="adamw", lr=3e-3, betas=[0.9, 0.95],
                            weight_decay=0.1, decay="all", schedule="cosine", warmup=100, min_lr_ratio=0.1,
                            grad_clip=1.0)
_MODEL = ModelConfig(vocab_size=24, block_size=12, d_model=128, n_head=4, d_qk=None, n_layer=2, scaled=True,
                     bug="correct", causal=True, impl="manual", fused_qkv=True, qkv_bias=False, proj_bias=False,
                     mlp_ratio=2, activation="gelu", dropout=0.0, tie_weights=True, head_bias=False, init_std=0.02,
                     init="gpt2", qk_norm="none", qk_gain_init=None)
MODELS = {"d32_scaled": _MODEL, "d32_unscaled": replace(_MODEL, scaled=False),
          "d256_scaled": replace(_MODEL, d_model=256, n_head=1), "d256_unscaled": replace(_MODEL, d_model=256,
                                                                                           n_head=1, scaled=False)}
# 12 short poems of 4 lines: newlines are frequent enough to rank in the vocabulary if counted
_CHARS = "秦川雄帝宅函谷壯皇居綺殿千尋起離宮百雉餘連甍遙接漢飛觀迥凌虛雲日隱層闕風煙出"
POEMS = ["\n".join("".join(_CHARS[(7 * p + 3 * line + 5 * c * c) % len(_CHARS)] for c in range(5))
                   for line in range(4)) for p in range(12)]


def _numpy_weights(model: TinyGPT, seed: int) -> TinyGPT:
    """The model in float64 with every parameter drawn by numpy: bit for bit the same on every machine.
    Matrices N(0, 1/fan_in) (activations stay of order one), norm gains 1 + N(0, 0.1^2), the rest N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    model = model.double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.from_numpy(rng.standard_normal(tuple(p.shape)))
            if p.dim() >= 2:
                p.copy_(z / math.sqrt(p.shape[-1]))
            elif name.endswith("weight"):
                p.copy_(1 + 0.1 * z)
            else:
                p.copy_(0.1 * z)
    return model


def _tokens(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, vocab, n)).long()


def _round(x, digits: int = 15):
    """Floats to `digits` significant digits (what JSON keeps of them is then the same everywhere); others as they are."""
    return float(f"{x:.{digits}g}") if isinstance(x, float) else x


def _forward(model: TinyGPT, x: torch.Tensor, y: torch.Tensor) -> dict:
    model.eval()
    model.set_record(True)
    with torch.no_grad():
        logits, loss = model(x, y)
    out = {"loss": loss.item(), "logits_sum": logits.sum().item(), "logits_sq": (logits ** 2).sum().item()}
    for i, a in enumerate(model.attentions):
        w = a.last["weights"]
        out[f"entropy_l{i}"] = (-(w * torch.log(w.clamp_min(1e-300))).sum(-1)).mean().item()
        out[f"weight_on_future_l{i}"] = w.triu(1).sum().item()
    model.set_record(False)
    return out


# ---------------------------------------------------------------- the probes

def probe_corpus() -> dict:
    """The tokenizer, the vocabulary, the token ids and the train/validation split (corpus.build)."""
    tok, arrays, metrics = corpus.build(POEMS, vocab_size=14, val_fraction=0.1)
    return {"itos": tok.itos, "train": arrays["train"].tolist(), "val": arrays["val"].tolist(),
            "files_bytes": {k: len(v) for k, v in corpus.input_files(tok, arrays).items()},
            "unk_rate": _round(metrics["unk_rate"])}


def probe_batches() -> dict:
    """The batch sampler's order and targets, and the fixed validation batches."""
    tokens = _tokens(200, 50, 1)
    sampler = BatchSampler(tokens, 8, 3, seed=20261014)
    train = [sampler.next() for _ in range(3)]
    val = fixed_batches(tokens, 8, 2, 2, seed=1234)
    return {"train": [[x.tolist(), y.tolist()] for x, y in train], "val": [[x.tolist(), y.tolist()] for x, y in val]}


def probe_schedule() -> dict:
    """The learning rate at every step of the chapter's protocol (warm-up, cosine to the floor)."""
    return {"lr": [_round(lr_at(s, CHAPTER_OPTIM), 13) for s in range(CHAPTER_OPTIM.steps)]}


def probe_init() -> dict:
    """Each chapter model's initial weights (torch's draw at a seed, as a run makes them): every
    parameter's mean and sd (compared at INIT_RTOL)."""
    out = {}
    for name, cfg in MODELS.items():
        torch.manual_seed(20261014)
        model = TinyGPT(cfg)
        out[name] = {k: [_round(p.double().mean().item(), 10), _round(p.double().std().item(), 10)]
                     for k, p in model.named_parameters()}
    return out


def probe_forward() -> dict:
    """Each chapter model's float64 forward pass: loss, logits, attention entropy and future weight per layer."""
    x, y = _tokens(24, 24, 2).view(2, 12), _tokens(24, 24, 3).view(2, 12)
    return {name: _forward(_numpy_weights(TinyGPT(cfg), 7), x, y) for name, cfg in MODELS.items()}


def probe_softmax() -> dict:
    """The float32 attention of the unscaled d_head-256 regime after training (logits in the hundreds, where
    exp overflows without the row max): finite, and within float32's error of the float64 softmax."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 12, 256, generator=g) * 2 for _ in range(3))
    r = attention(q, k, v, scaled=False)
    ref = torch.softmax((q.double() @ k.double().transpose(-2, -1)).masked_fill(
        torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf")), -1)
    return {"finite": bool(torch.isfinite(r.out).all()), "logits_absmax_over_100": bool(r.logits.abs().max() > 100),
            "close_to_float64": bool((r.weights.double() - ref).abs().max() < 1e-5),
            "argmax": r.weights.argmax(-1).flatten().tolist()}


def _trained(steps: int = 6) -> tuple[TinyGPT, list, object]:
    cfg = replace(_MODEL, d_model=32, n_head=2, block_size=8)
    model = _numpy_weights(TinyGPT(cfg), 11)
    tokens = _tokens(300, cfg.vocab_size, 4)
    optim = replace(CHAPTER_OPTIM, steps=steps, batch_size=4, warmup=2, lr=1e-2)
    val = fixed_batches(tokens, cfg.block_size, 4, 2, seed=1234)
    log = train_loop(model, BatchSampler(tokens, cfg.block_size, 4, seed=3), optim,
                     evaluate_fn=lambda m: {"val_loss": mean_loss(m, val)}, eval_every=3, eval_final=True)
    return model, val, log


def probe_training() -> dict:
    """Six float64 optimizer steps of the chapter's protocol (AdamW, betas, decay on every parameter,
    warm-up and cosine, clipping at 1.0, which the large gradients of these weights engage): each step's
    loss, lr and gradient norm, the evaluations, and each parameter's final norm."""
    model, val, log = _trained()
    return {"history": [{k: _round(v) for k, v in row.items()} for row in log.history],
            "evals": [{k: _round(v) for k, v in row.items()} for row in log.evals],
            "norms": {k: _round(p.norm().item()) for k, p in model.named_parameters()},
            "evaluate": {k: _round(v) for k, v in evaluate(model, val).items()}}


def probe_generation() -> dict:
    """Sampled generation with and without the KV cache, at temperature 0.8 from one seed: the token ids."""
    model, _, _ = _trained()
    prompt = torch.tensor([[1, 2, 3]])
    out = {}
    for name, gen in (("plain", generate), ("kv_cache", generate_cached)):
        g = torch.Generator().manual_seed(0)
        out[name] = gen(model, prompt, 5, temperature=0.8, generator=g)[0].tolist()
    return out


def probe_checkpoint() -> dict:
    """A checkpoint as a run writes it (run/execute.py), loaded back (load_checkpoint): its forward pass."""
    model, val, _ = _trained()
    with tempfile.TemporaryDirectory(prefix="attnrepro-fingerprint-") as tmp:
        path = Path(tmp) / "model.pt"
        torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()}, path)
        loaded = load_checkpoint(path).double()
    return {"forward": _forward(loaded, *val[0]), "training": loaded.training}


PROBES: dict[str, Callable[[], dict]] = {
    "corpus": probe_corpus, "batches": probe_batches, "schedule": probe_schedule, "init": probe_init,
    "forward": probe_forward, "softmax": probe_softmax, "training": probe_training,
    "generation": probe_generation, "checkpoint": probe_checkpoint}


def compute() -> dict:
    """Every probe's values, on one thread (the fingerprint does not depend on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: probe() for name, probe in PROBES.items()}
    finally:
        torch.set_num_threads(threads)


def differences(expected: dict, got: dict) -> list[str]:
    """One line per probe whose values differ from `expected` beyond its tolerance (the largest difference)."""
    out = []
    for name in sorted(set(expected) | set(got)):
        if name not in got or name not in expected:
            out.append(f"{name}: {'missing from the code' if name not in got else 'not in the reference'}")
            continue
        rtol, atol = (INIT_RTOL, INIT_ATOL) if name == "init" else (RTOL, 0.0)
        worst, where = largest_difference(expected[name], got[name], atol)
        if worst > rtol:
            out.append(f"{name}: {where}")
    return out
