"""TinyGPT: the chapter's small decoder-only model, configurable enough to also be
the companion documents' models (separate/fused projections, biases, untied head).

Pre-LN blocks: x = x + attn(ln1(x)); x = x + mlp(ln2(x)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnrepro.config import UserError, require
from attnrepro.model.attention import BUGS, QKNorm, QKNormKind, attention, external_attention
from attnrepro.model.attention_impl import resolve_identity


@dataclass
class ModelConfig:
    """TinyGPT's settings. No defaults: params.yaml states every model (train.models, failures.model,
    kv_cache.model) and the companion experiments state theirs in their modules."""
    vocab_size: Optional[int]  # None in a run's spec: the task takes it from the data
    block_size: int
    d_model: int
    n_head: int
    # per-head width of q and k (the d_k of 1/sqrt(d_k)); null = d_head. v keeps d_head, so only the
    # width of q.k changes (the critical stage's one-variable curve). A value equal to d_head is
    # stored as null (__post_init__): one run, one key.
    d_qk: Optional[int]
    n_layer: int
    scaled: bool  # divide scores by sqrt(d_k) (d_k: d_qk, or d_head when null)
    bug: str  # injected failure mode, see attention.BUGS
    causal: bool
    # manual (attnrepro.model.attention) | a callable with SDPA's signature, by its identity
    # package.module:function@<source sha256> (params attention.impl; attnrepro.model.attention_impl)
    impl: str
    fused_qkv: bool  # one Linear(d, 3d) or three Linear(d, d)
    qkv_bias: bool
    proj_bias: bool
    mlp_ratio: int
    activation: Literal["gelu", "relu"]
    dropout: float
    tie_weights: bool
    head_bias: bool
    init_std: float
    # gpt2: N(0, init_std), residual projections N(0, init_std/sqrt(2 n_layer));
    # normal: every weight N(0, init_std); torch: PyTorch's own defaults
    init: Literal["gpt2", "normal", "torch"]
    # QK-norm (attention.QKNorm): none | layernorm (LayerNorm on q and k, ViT-22B) | l2 (unit q
    # and k times a learned gain, Henry et al. 2020). `scaled` still decides the 1/sqrt(d_head).
    qk_norm: QKNormKind
    # initial gain of the l2 form; null = Henry et al.'s log2(block^2 - block) (11.98 at block 64)
    qk_gain_init: Optional[float]

    def __post_init__(self):
        # the one place a q/k width equal to the value width becomes null: such a spec is the same
        # run as one that leaves d_qk null, and RunSpec keys it as one (tests/test_model.py)
        if (self.d_qk is not None and isinstance(self.n_head, int) and self.n_head > 0
                and self.d_qk * self.n_head == self.d_model):
            self.d_qk = None

    @property
    def d_head(self) -> int:
        """The per-head width of v (and of q and k unless d_qk says otherwise)."""
        return self.d_model // self.n_head

    @property
    def d_k(self) -> int:
        """The per-head width of q and k: the d_k of 1/sqrt(d_k)."""
        return self.d_head if self.d_qk is None else self.d_qk

    def validate(self, prefix: str = "model") -> None:
        for name in ("block_size", "d_model", "n_head", "n_layer", "mlp_ratio"):
            val = getattr(self, name)
            require(val > 0, f"{prefix}.{name}", val, "a positive integer")
        require(self.d_qk is None or self.d_qk > 0, f"{prefix}.d_qk", self.d_qk,
                "a positive integer, or null (= d_head)")
        require(self.vocab_size is None or self.vocab_size > 0, f"{prefix}.vocab_size", self.vocab_size,
                "a positive integer (or null: from the data)")
        require(
            self.d_model % self.n_head == 0,
            f"{prefix}.d_model",
            self.d_model,
            f"a multiple of n_head ({self.n_head})",
        )
        require(self.bug in BUGS, f"{prefix}.bug", self.bug, "one of " + ", ".join(BUGS))
        require(0.0 <= self.dropout < 1.0, f"{prefix}.dropout", self.dropout, "in [0, 1)")
        require(self.init_std > 0, f"{prefix}.init_std", self.init_std, "a positive number")
        require(self.qk_gain_init is None or self.qk_norm == "l2", f"{prefix}.qk_gain_init", self.qk_gain_init,
                "null unless qk_norm is 'l2' (only that form has a gain)")
        require(self.qk_gain_init is None or (math.isfinite(self.qk_gain_init) and self.qk_gain_init > 0),
                f"{prefix}.qk_gain_init", self.qk_gain_init, "a finite positive number, or null")
        require(self.impl == "manual" or ":" in self.impl, f"{prefix}.impl", self.impl,
                "'manual' or package.module:function")
        require(
            self.impl == "manual" or self.bug == "correct",
            f"{prefix}.impl",
            self.impl,
            "'manual' when a bug is injected (another implementation cannot inject the project's bugs)",
        )


def _external(identity: str):
    return resolve_identity(identity).fn  # only for a user's implementation: the builtin never loads a module


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, dqk = cfg.d_model, cfg.n_head * cfg.d_k  # dqk == d unless d_qk decouples q and k from v
        if cfg.fused_qkv:
            self.qkv = nn.Linear(d, 2 * dqk + d, bias=cfg.qkv_bias)
        else:
            self.q = nn.Linear(d, dqk, bias=cfg.qkv_bias)
            self.k = nn.Linear(d, dqk, bias=cfg.qkv_bias)
            self.v = nn.Linear(d, d, bias=cfg.qkv_bias)
        self.proj = nn.Linear(d, d, bias=cfg.proj_bias)
        if cfg.qk_norm == "layernorm":  # one LayerNorm over d_k each for q and k, shared by the heads
            self.q_norm, self.k_norm = nn.LayerNorm(cfg.d_k), nn.LayerNorm(cfg.d_k)
        elif cfg.qk_norm == "l2":
            init = cfg.qk_gain_init if cfg.qk_gain_init is not None else math.log2(cfg.block_size ** 2 - cfg.block_size)
            self.qk_gain = nn.Parameter(torch.tensor(float(init)))
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.record = False
        self.last: Optional[dict] = None  # weights and logits of the last recorded call
        self.external = None if cfg.impl == "manual" else _external(cfg.impl)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v split into heads: q and k (B, H, T, d_k), v (B, H, T, d_head)."""
        B, T, d = x.shape
        H, dk = self.cfg.n_head, self.cfg.d_k
        if self.cfg.fused_qkv:
            q, k, v = self.qkv(x).split([H * dk, H * dk, d], dim=2)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        return (q.view(B, T, H, dk).transpose(1, 2), k.view(B, T, H, dk).transpose(1, 2),
                v.view(B, T, H, d // H).transpose(1, 2))

    def qk_norm(self) -> Optional[QKNorm]:
        if self.cfg.qk_norm == "layernorm":
            return QKNorm("layernorm", self.q_norm.weight, self.q_norm.bias, self.k_norm.weight, self.k_norm.bias)
        if self.cfg.qk_norm == "l2":
            return QKNorm("l2", gain=self.qk_gain)
        return None

    def forward(self, x: torch.Tensor, kv_cache=None) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.project(x)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)
        norm = self.qk_norm()
        if self.external is not None:
            res = external_attention(self.external, q, k, v, scaled=cfg.scaled, causal=cfg.causal, qk_norm=norm,
                                     dropout_p=cfg.dropout if self.training else 0.0, weights=self.record)
            if self.record:
                self.last = {"weights": res.weights, "logits": res.logits, "q": q.detach(), "k": k.detach()}
            y = res.out
        else:
            res = attention(q, k, v, scaled=cfg.scaled, causal=cfg.causal, bug=cfg.bug, qk_norm=norm)
            if self.record:
                self.last = {"weights": res.weights.detach(), "logits": res.logits.detach(),
                             "q": q.detach(), "k": k.detach()}
            y = self.attn_drop(res.weights) @ v if cfg.dropout > 0 and self.training else res.out
        B, H, T, dh = y.shape
        return self.proj(y.transpose(1, 2).reshape(B, T, H * dh))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(d)
        act = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()
        self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_ratio * d), act, nn.Linear(cfg.mlp_ratio * d, d))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, kv_cache=None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), kv_cache))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyGPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        if cfg.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size is None: set it from the data before building the model")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        self._init_weights()

    def _init_weights(self) -> None:
        if self.cfg.init == "torch":
            return
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.n_layer) if self.cfg.init == "gpt2" else std
        for name, mod in self.named_modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                if name == "head" and self.cfg.tie_weights:
                    continue  # shares the embedding matrix, already initialized
                resid = name.endswith("attn.proj") or name.endswith("mlp.2")
                nn.init.normal_(mod.weight, mean=0.0, std=resid_std if resid else std)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights counted once

    @property
    def attentions(self) -> list[SelfAttention]:
        return [b.attn for b in self.blocks]

    def set_record(self, on: bool) -> None:
        """Make every attention layer keep its weights/logits of the next forward."""
        for a in self.attentions:
            a.record = on
            if not on:
                a.last = None

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, kv_caches=None):
        B, T = idx.shape
        start = kv_caches[0].length if kv_caches else 0
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, kv_caches[i] if kv_caches else None)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss


@torch.no_grad()
def generate(
    model: TinyGPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Sample (temperature > 0) or decode greedily (temperature == 0) new tokens."""
    for _ in range(max_new_tokens):
        ctx = idx[:, -model.cfg.block_size :]
        logits, _ = model(ctx)
        idx = torch.cat([idx, sample_next(logits[:, -1, :], temperature, top_k, generator)], dim=1)
    return idx


def sample_next(logits: torch.Tensor, temperature: float, top_k: Optional[int] = None,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The next token of each row of (B, vocab) logits: greedy when temperature == 0, else sampled
    from softmax(logits / temperature), restricted to the top_k logits when top_k is given.
    Every generation path (generate, kv_cache.generate_cached) uses this one rule."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


@torch.no_grad()
def mean_loss(model: TinyGPT, batches) -> float:
    """Mean loss over fixed batches, in eval mode (no dropout); the training mode is restored."""
    was_training = model.training
    model.eval()
    losses = [model(x, y)[1].item() for x, y in batches]
    model.train(was_training)
    return float(np.mean(losses))


def load_checkpoint(path, key: str = "checkpoint") -> TinyGPT:
    """A TinyGPT from a checkpoint written by a run ({model_config, ..., state_dict}), in eval mode.

    Loads tensors only (weights_only), and turns a missing or unreadable file into one
    line naming `key` and the path instead of torch's traceback."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{key}: {path} not found (run the stage that writes it)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        model = TinyGPT(ModelConfig(**{"d_qk": None, **ckpt["model_config"]}))  # d_qk: older checkpoints lack it
        model.load_state_dict(ckpt["state_dict"])
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{key}: {path} is not a readable checkpoint ({type(e).__name__}); "
                        "rerun the stage that writes it") from None
    return model.eval()
