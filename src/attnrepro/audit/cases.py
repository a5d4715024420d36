"""Inputs of the battery and the tolerance they are judged by.

Tolerance. An output (or gradient) x of an implementation computing in a dtype with unit
roundoff u (eps/2) is compared with the float64 reference r computed from the same rounded
inputs, and passes when

    max|x - r| <= C * R * (1 + Lmax) * (u + u_acc * sqrt(E + S)),   C = 4,

R being max|v| for the output and max|r| for a gradient (floored at max|d_out| max|v|: a
gradient exactly 0 in float64, one visible key, is rounding noise in any other dtype), Lmax the largest |scaled logit|
(an absolute error u*|s| in a logit is a relative error in its weight after exp: this is
what grows with the logits), u_acc the unit roundoff of the accumulation (float32 as every
torch and FlashAttention kernel accumulates half types, float64 for float64), and sqrt(E + S)
the probabilistic growth of rounding errors over the dot products of length E and the sums
over S keys (Higham and Mary 2019). Measured here over the battery's cases, SDPA, a chunked
online softmax and the textbook formula stay below 0.12 of it in every dtype; each example
bug, in the cases it shows in, is above it by at least 1.4e3x in float32, 8.9x in float16 and
1.1x in bfloat16 (the half-precision masked cases, where a bug moves few weights, are the
weakest evidence and never the only one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
C_TOL = 4.0


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def tolerance(dtype: torch.dtype, E: int, S: int, logit_max: float, ref_scale: float) -> float:
    u = unit_roundoff(dtype)
    u_acc = min(u, unit_roundoff(torch.float32))
    return C_TOL * ref_scale * (1.0 + logit_max) * (u + u_acc * math.sqrt(E + S))


@dataclass(frozen=True)
class Case:
    """One call: shapes (batch B, heads H, queries L, keys S, head width E, value width Ev), the mask
    (none | causal | bool | float), the `scale` argument, the dtype, whether to check gradients and the
    key/value heads Hkv (None: H; fewer: grouped-query attention, 1: multi-query, called with enable_gqa)."""
    B: int
    H: int
    L: int
    S: int
    E: int
    Ev: int
    mask: str = "none"
    scale: Optional[float] = None
    dtype: str = "fp32"
    grad: bool = True
    seed: int = 0
    Hkv: Optional[int] = None

    @property
    def gqa(self) -> bool:
        return self.Hkv is not None and self.Hkv != self.H

    @property
    def label(self) -> str:
        sc = "" if self.scale is None else f", scale={self.scale:g}"
        kv = f" Hkv={self.Hkv}" if self.gqa else ""
        return (f"B={self.B} H={self.H}{kv} L={self.L} S={self.S} E={self.E} Ev={self.Ev}, "
                f"{self.mask} mask{sc}, {self.dtype}")

    @property
    def optional(self) -> bool:
        """is_causal with an attn_mask: SDPA's flash kernel combines them, its math path (and the reference
        code in its docs) refuses them; an implementation may decline (raise), but must not drop either."""
        return self.mask.startswith("causal+")

    @property
    def size(self) -> int:
        return self.B * self.H * (self.L * self.E + self.S * (self.E + self.Ev))

    @property
    def valid(self) -> bool:
        """Each key/value head serves a whole group of query heads."""
        return not self.gqa or (self.Hkv < self.H and self.H % self.Hkv == 0)

    def with_shape(self, **dims) -> "Case":
        return replace(self, **dims)

    def inputs(self, device: str = "cpu"):
        """(q, k, v, kwargs, d_out) drawn from the case's seed. `mask` is none, causal, or a mask kind
        (bool, float: L x S; bool_b: B x 1 x L x S; float_h: 1 x H x L x S; bool_lr: the causal mask aligned
        bottom-right, as a KV-cache decode sees it), optionally after "causal+" (is_causal and the mask, as
        SDPA combines them). A bool mask keeps >= 1 key per row among those is_causal leaves. A grouped-query
        case (Hkv < H) passes enable_gqa=True."""
        g = torch.Generator().manual_seed(self.seed)
        Hkv = self.Hkv or self.H
        q = torch.randn(self.B, self.H, self.L, self.E, generator=g)
        k = torch.randn(self.B, Hkv, self.S, self.E, generator=g)
        v = torch.randn(self.B, Hkv, self.S, self.Ev, generator=g)
        d_out = torch.randn(self.B, self.H, self.L, self.Ev, generator=g)
        kw: dict = {"scale": self.scale}
        if self.gqa:
            kw["enable_gqa"] = True
        causal, _, kind = self.mask.rpartition("+")
        if kind == "causal" or causal:
            kw["is_causal"] = True
        shape = {"bool_b": (self.B, 1), "float_h": (1, self.H)}.get(kind, ()) + (self.L, self.S)
        i, j = torch.arange(self.L).unsqueeze(1), torch.arange(self.S).unsqueeze(0)
        if kind in ("bool", "bool_b"):
            m = torch.rand(shape, generator=g) < 0.7
            visible = torch.minimum(torch.arange(self.L), torch.tensor(self.S - 1)) + 1 if causal else \
                torch.full((self.L,), self.S)
            pick = (torch.rand(shape[:-1], generator=g) * visible).long()
            m.scatter_(-1, pick.unsqueeze(-1), True)
            kw["attn_mask"] = m.to(device)
        elif kind == "bool_lr":
            kw["attn_mask"] = (j <= i + (self.S - self.L)).to(device)
        elif kind in ("float", "float_h"):  # ALiBi-like distance penalty plus noise
            bias = -0.1 * (i - j).abs() + 0.5 * torch.randn(shape, generator=g)
            kw["attn_mask"] = bias.to(DTYPES[self.dtype]).to(device)
        dt = DTYPES[self.dtype]
        return (*(t.to(dt).to(device) for t in (q, k, v)), kw, d_out.to(dt).to(device))


def logit_max(q: torch.Tensor, k: torch.Tensor, scale: Optional[float]) -> float:
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) if q.dim() > 2 else k  # grouped-query heads
    return (q.double() @ k.double().transpose(-2, -1)).abs().max().item() * abs(s)


def grid(full: bool = False) -> list[Case]:
    """The parity grid: shapes with non-powers of two, L != S, Ev != E; every mask kind; is_causal with a
    mask; masks broadcast over heads or batch; decode (one query, many keys) in both alignments; explicit
    scales; half types with and without masks; grouped-query (2 key/value heads for 4 or 6 query heads) and
    multi-query (1) attention. `full` adds longer sequences and wider heads."""
    shapes = [(2, 3, 17, 17, 24, 24), (1, 2, 64, 64, 64, 64), (2, 1, 33, 47, 40, 16), (1, 1, 128, 128, 96, 96)]
    if full:
        shapes += [(1, 2, 256, 256, 128, 128), (1, 1, 200, 300, 256, 256), (4, 4, 31, 31, 12, 20)]
    cases = [Case(*s, mask=m, seed=i) for i, s in enumerate(shapes) for m in ("none", "causal", "bool", "float")]
    cases += [Case(*shapes[i], mask=m, seed=20 + i) for i in (0, 2) for m in ("causal+bool", "causal+float")]
    cases += [Case(*shapes[0], mask=m, seed=22) for m in ("bool_b", "float_h")]
    cases += [Case(2, 2, 1, 47, 40, 40, mask="causal", seed=23), Case(2, 2, 1, 47, 40, 40, mask="bool_lr", seed=23),
              Case(1, 2, 4, 47, 40, 40, mask="bool_lr", seed=24)]
    cases += [Case(2, 3, 17, 17, 24, 24, mask=m, scale=sc, seed=7)
              for m in ("none", "causal") for sc in (1.0, 0.3)]
    others = ("fp16", "bf16") + (("fp64",) if full else ())
    cases += [Case(*s, mask=m, dtype=dt, seed=11) for dt in others for s in shapes[:2] for m in ("none", "causal")]
    cases += [Case(*shapes[0], mask=m, dtype=dt, seed=12) for dt in ("fp16", "bf16")
              for m in ("bool", "float", "causal+bool")]
    cases += [Case(2, 4, 17, 17, 24, 24, mask=m, Hkv=hkv, seed=30 + hkv) for hkv in (2, 1) for m in ("none", "causal")]
    cases += [Case(1, 6, 9, 23, 16, 8, mask="bool", Hkv=2, seed=33), Case(2, 4, 1, 47, 40, 40, mask="causal", Hkv=2,
                                                                          seed=34)]
    return cases
