"""Inputs of the battery and the tolerance they are judged by.

Tolerance. An output (or gradient) x of an implementation computing in a dtype with unit
roundoff u (eps/2) is compared with the float64 reference r computed from the same rounded
inputs, and passes when

    max|x - r| <= C * R * (1 + Lmax) * (u + u_acc * sqrt(E + S)),   C = 4,

R being max|v| for the output and max|r| for a gradient, Lmax the largest |scaled logit|
(an absolute error u*|s| in a logit is a relative error in its weight after exp: this is
what grows with the logits), u_acc the unit roundoff of the accumulation (float32 as every
torch and FlashAttention kernel accumulates half types, float64 for float64), and sqrt(E + S)
the probabilistic growth of rounding errors over the dot products of length E and the sums
over S keys (Higham and Mary 2019). Measured here over the battery's cases, SDPA, a chunked
online softmax and the textbook formula stay below 0.12 of it in every dtype; each of the
chapter's bugs, in the cases it shows in, is above it by at least 8x in bfloat16, 69x in
float16 and 1e4x in float32.
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
    (none | causal | bool | float), the `scale` argument, the dtype and whether to check gradients."""
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

    @property
    def label(self) -> str:
        sc = "" if self.scale is None else f", scale={self.scale:g}"
        return (f"B={self.B} H={self.H} L={self.L} S={self.S} E={self.E} Ev={self.Ev}, "
                f"{self.mask} mask{sc}, {self.dtype}")

    @property
    def size(self) -> int:
        return self.B * self.H * (self.L * self.E + self.S * (self.E + self.Ev))

    def with_shape(self, **dims) -> "Case":
        return replace(self, **dims)

    def inputs(self, device: str = "cpu"):
        """(q, k, v, kwargs, d_out) drawn from the case's seed; a bool mask keeps >= 1 key per row."""
        g = torch.Generator().manual_seed(self.seed)
        q = torch.randn(self.B, self.H, self.L, self.E, generator=g)
        k = torch.randn(self.B, self.H, self.S, self.E, generator=g)
        v = torch.randn(self.B, self.H, self.S, self.Ev, generator=g)
        d_out = torch.randn(self.B, self.H, self.L, self.Ev, generator=g)
        kw: dict = {"scale": self.scale}
        if self.mask == "causal":
            kw["is_causal"] = True
        elif self.mask == "bool":
            m = torch.rand(self.L, self.S, generator=g) < 0.7
            m[torch.arange(self.L), torch.randint(0, self.S, (self.L,), generator=g)] = True
            kw["attn_mask"] = m.to(device)
        elif self.mask == "float":  # ALiBi-like distance penalty plus noise
            i, j = torch.arange(self.L).unsqueeze(1), torch.arange(self.S).unsqueeze(0)
            bias = -0.1 * (i - j).abs() + 0.5 * torch.randn(self.L, self.S, generator=g)
            kw["attn_mask"] = bias.to(DTYPES[self.dtype]).to(device)
        dt = DTYPES[self.dtype]
        return (*(t.to(dt).to(device) for t in (q, k, v)), kw, d_out.to(dt).to(device))


def logit_max(q: torch.Tensor, k: torch.Tensor, scale: Optional[float]) -> float:
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return (q.double() @ k.double().transpose(-2, -1)).abs().max().item() * abs(s)


def grid(full: bool = False) -> list[Case]:
    """The parity grid: shapes with non-powers of two, L != S, Ev != E; every mask kind; explicit
    scales; half types on two shapes. `full` adds longer sequences and wider heads."""
    shapes = [(2, 3, 17, 17, 24, 24), (1, 2, 64, 64, 64, 64), (2, 1, 33, 47, 40, 16), (1, 1, 128, 128, 96, 96)]
    if full:
        shapes += [(1, 2, 256, 256, 128, 128), (1, 1, 200, 300, 256, 256), (4, 4, 31, 31, 12, 20)]
    cases = [Case(*s, mask=m, seed=i) for i, s in enumerate(shapes) for m in ("none", "causal", "bool", "float")]
    cases += [Case(2, 3, 17, 17, 24, 24, mask=m, scale=sc, seed=7)
              for m in ("none", "causal") for sc in (1.0, 0.3)]
    others = ("fp16", "bf16") + (("fp64",) if full else ())
    cases += [Case(*s, mask=m, dtype=dt, seed=11) for dt in others for s in shapes[:2] for m in ("none", "causal")]
    return cases
