"""Floating-point behaviour of attention in fp32 / fp16 / bf16 (§1.6.4, §1.11.3, §1.16, §1.17).

Every function returns plain numbers (or dicts of them) so the `precision` stage
can write them straight into metrics/precision.json. Nothing here is timed and
every random draw takes an explicit seed, so the results are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from attnrepro.config import require, require_positive
from attnrepro.model.attention import attention, causal_mask
from attnrepro.progress import progress

DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
LOW = ("fp32", "fp16", "bf16")  # the dtypes a model runs in


@dataclass
class PrecisionConfig:
    """params `precision` (no defaults: params.yaml is the only source of values). The
    *_published fields are the chapter's own numbers, used as inputs (params.yaml cites where)."""

    seed: int
    threads: int
    softmax_logits: list[float]
    overflow_stds_published: dict[str, float]  # label -> logit std; metric keys overflow.<label>_*
    overflow_shape: list[int]
    overflow_seed: int
    sigma_d_heads: list[int]
    d_heads: list[int]
    dtypes: list[str]
    qk_stds_published: dict[str, float]  # label -> q/k component std; metric sections forward_<label>
    batch: int
    heads: int
    seq: int
    mask_logit_stds_published: dict[str, float]  # label -> logit std; metric keys mask.<label>_*
    mask_values: list[float]
    accum_n: int
    parity_shape: list[int]

    def validate(self, prefix: str = "precision") -> None:
        require_positive(self, ("threads",), prefix)
        require(len(self.softmax_logits) > 0 and all(math.isfinite(v) for v in self.softmax_logits),
                f"{prefix}.softmax_logits", self.softmax_logits, "a non-empty list of finite numbers")
        require(len(self.overflow_shape) > 0 and all(s > 0 for s in self.overflow_shape),
                f"{prefix}.overflow_shape", self.overflow_shape, "a list of positive integers")
        for name in ("sigma_d_heads", "d_heads"):
            vals = getattr(self, name)
            require(len(vals) > 0 and all(d > 0 for d in vals), f"{prefix}.{name}", vals,
                    "a non-empty list of positive integers")
        for dt in self.dtypes:
            require(dt in LOW, f"{prefix}.dtypes", self.dtypes, "a list of fp32, fp16, bf16")
        for name in ("overflow_stds_published", "qk_stds_published", "mask_logit_stds_published"):
            for k, v in getattr(self, name).items():
                require(math.isfinite(v) and v > 0 and k.isidentifier(), f"{prefix}.{name}.{k}", v,
                        "a finite positive number under an identifier-like name")
        require_positive(self, ("batch", "heads", "seq", "accum_n"), prefix)
        for v in self.mask_values:
            require(math.isfinite(v) and v < 0, f"{prefix}.mask_values", self.mask_values,
                    "a list of finite negative numbers")
        require(len(self.parity_shape) == 4 and all(s > 0 for s in self.parity_shape),
                f"{prefix}.parity_shape", self.parity_shape, "[batch, heads, seq, d_head] positive")


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


# ---------------------------------------------------------------- formats (§1.17.1, §1.17.4)

def finfo_table(names: Iterable[str] = ("fp32", "fp16", "bf16")) -> dict[str, dict]:
    """max, ln(max) (the logit at which exp overflows), eps and smallest normal per dtype."""
    out = {}
    for name in names:
        fi = torch.finfo(dtype_of(name))
        out[name] = {"max": float(fi.max), "ln_max": math.log(fi.max), "eps": float(fi.eps),
                     "tiny": float(fi.tiny), "bits": fi.bits}
    return out


def round_trip(x: float, name: str) -> float:
    """x stored in dtype `name` and read back (as the source does with 1.001)."""
    return float(torch.tensor([x], dtype=torch.float32).to(dtype_of(name)).double().item())


# ---------------------------------------------------------------- softmax (§1.6.4)

def softmax_naive(z: torch.Tensor) -> torch.Tensor:
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_stable(z: torch.Tensor) -> torch.Tensor:
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_demo(values=(100.0, 101.0, 102.0), names=("fp64", "fp32", "fp16", "bf16")) -> dict:
    """Naive vs stable softmax of `values` in each dtype.

    Per dtype: naive_nan (1 if any nan), naive_p<i>, stable_p<i> (nan becomes null).
    The source's numpy snippet runs in numpy's default float64, where exp(102) =
    2e44 is finite, so its naive softmax does *not* give nan there; it does in
    float32 and narrower, where exp overflows beyond ln(max) = 88.7 / 11.1.
    """
    out = {}
    for name in names:
        z = torch.tensor(values, dtype=dtype_of(name))
        naive, stable = softmax_naive(z).double(), softmax_stable(z).double()
        row = {"naive_nan": int(torch.isnan(naive).any()), "exp_max_inf": int(torch.isinf(torch.exp(z)).any())}
        for i in range(len(values)):
            row[f"naive_p{i}"] = float(naive[i])
            row[f"stable_p{i}"] = float(stable[i])
        out[name] = row
    return out


def exp_overflow_count(std: float, shape=(4, 8), seed: int = 0, dtype=np.float32) -> int:
    """§1.11.3: logits ~ N(0, std) drawn with numpy default_rng(seed), cast to float32;
    how many exp(z) are inf."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, std, size=shape).astype(dtype)
    with np.errstate(over="ignore"):
        return int(np.isinf(np.exp(z)).sum())


def four_sigma_table(d_heads: Iterable[int], threshold: float | None = None) -> dict[str, dict]:
    """§1.17.2 under the footnote's assumption (q, k components of variance 1): unscaled
    logits have std sqrt(d); 4 std is the 'common maximum'; compare with ln(65504)."""
    threshold = math.log(torch.finfo(torch.float16).max) if threshold is None else threshold
    out = {}
    for d in d_heads:
        std = math.sqrt(d)
        out[f"d{d}"] = {"std": std, "four_sigma": 4 * std, "overflows_fp16": int(4 * std > threshold),
                        "scaled_four_sigma": 4.0, "scaled_overflows_fp16": int(4.0 > threshold)}
    return out


# ---------------------------------------------------------------- the real forward

def qkv(seed: int, shape: tuple[int, ...], qk_std: float, dtype: torch.dtype):
    """q, k with component std `qk_std`, v ~ N(0, 1), drawn in float64 then cast."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    return (q * qk_std).to(dtype), (k * qk_std).to(dtype), v.to(dtype)


def forward_overflow(d_head: int, *, qk_std: float, dtype: str, scaled: bool, stable: bool,
                     seed: int, batch: int = 1, heads: int = 4, seq: int = 64) -> dict:
    """Run attention.attention (causal) in `dtype`; count non-finite outputs.

    stable=False injects the chapter's bug "no_stable_softmax" (exp without max).
    Returns nonfinite_frac (share of output elements that are inf/nan), rows_bad
    (share of query rows with any non-finite output) and logit_absmax (in fp64).
    """
    q, k, v = qkv(seed, (batch, heads, seq, d_head), qk_std, dtype_of(dtype))
    with torch.no_grad():
        res = attention(q, k, v, scaled=scaled, causal=True, bug="correct" if stable else "no_stable_softmax")
    bad = ~torch.isfinite(res.out)
    logits = res.logits.double()
    return {
        "nonfinite_frac": float(bad.double().mean()),
        "rows_bad": float(bad.any(dim=-1).double().mean()),
        "logit_absmax": float(logits[torch.isfinite(logits)].abs().max()) if torch.isfinite(logits).any() else math.inf,
    }


# ---------------------------------------------------------------- additive masks (checkpoint 16)

def additive_mask_value(mask_value: float, dtype: str) -> float:
    """What a large negative additive-mask constant becomes when stored in `dtype`."""
    return float(torch.tensor(mask_value, dtype=torch.float64).to(dtype_of(dtype)).double())


def additive_mask_leak(logit_std: float, mask_value: float, *, dtype: str = "fp32", seq: int = 64,
                       seed: int = 0) -> dict:
    """scores + mask_value * (1 - mask) (the additive pitfall) vs masked_fill(-inf).

    Causal mask over `seq` positions, logits ~ N(0, logit_std). Returns the mean
    weight mass on masked (future) positions per query row, its maximum, and
    whether any weight is non-finite. The -inf masked_fill version leaks exactly 0.
    """
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(seq, seq, generator=g, dtype=torch.float64) * logit_std).to(dtype_of(dtype))
    allowed = causal_mask(seq, seq)
    keep = allowed.to(logits.dtype)
    scores = logits + mask_value * (1 - keep)
    p = softmax_stable(scores).double()
    leak = (p * (~allowed)).sum(-1)
    return {"leak_mean": float(leak[torch.isfinite(leak)].mean()) if torch.isfinite(leak).any() else math.nan,
            "leak_max": float(leak[torch.isfinite(leak)].max()) if torch.isfinite(leak).any() else math.nan,
            "nan": int(torch.isnan(p).any()), "logit_absmax": float(logits.double().abs().max())}


def fully_masked_row(mask_value: float | None, dtype: str) -> dict:
    """A query row whose keys are all masked (e.g. a padding query).

    mask_value None = masked_fill(-inf). Returns nan (1/0) and the weight of key 0
    (uniform 1/n when the additive constant is finite, nan when it is -inf)."""
    n = 8
    scores = torch.linspace(-1, 1, n, dtype=torch.float64).to(dtype_of(dtype))
    if mask_value is None:
        scores = scores.masked_fill(torch.ones(n, dtype=torch.bool), float("-inf"))
    else:
        scores = scores + mask_value * torch.ones(n, dtype=scores.dtype)
    p = softmax_stable(scores).double()
    return {"nan": int(torch.isnan(p).any()), "w0": float(p[0])}


# ---------------------------------------------------------------- accumulation (checkpoint 17)

def accumulation(n: int = 4096, seed: int = 0, logit_std: float = 0.1) -> dict:
    """Sum a softmax row of n positions (weights ~ 1/n ~ 2.4e-4 for n = 4096).

    sequential_<dtype>: a running sum kept in that dtype (rounding after every
    add, as a naive low-precision reduction does); torch_sum_bf16: torch.sum on
    the bf16 tensor (PyTorch accumulates internally in fp32, then rounds once).
    """
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(n, generator=g, dtype=torch.float64) * logit_std, dim=0)
    out = {"n": n, "weight_mean": float(w.mean()), "exact": float(w.sum())}
    for name in ("fp32", "fp16", "bf16"):
        dt = dtype_of(name)
        wd = w.to(dt)
        acc = torch.zeros((), dtype=dt)
        for x in wd:
            acc = acc + x
        out[f"sequential_{name}"] = float(acc)
        out[f"stored_sum_{name}"] = float(wd.double().sum())  # rounding of the weights alone
    out["torch_sum_bf16"] = float(w.to(torch.bfloat16).sum())
    return out


# ---------------------------------------------------------------- parity (§1.14.1, §1.16)

def sdpa_parity(seed: int = 0, shape=(2, 4, 6, 32), causal: bool = True) -> float:
    """Max abs difference between attention.attention and F.scaled_dot_product_attention (float64)."""
    q, k, v = qkv(seed, shape, 1.0, torch.float64)
    mine = attention(q, k, v, scaled=True, causal=causal).out
    if causal:
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(shape[-2], shape[-2]))
    else:
        ref = F.scaled_dot_product_attention(q, k, v)
    return float((mine - ref).abs().max())


def attention_backward(q, k, v, d_out, *, scaled: bool = True, causal: bool = True):
    """Hand-written backward of softmax(q k^T / sqrt(d) + mask) v (§1.16, eq. 1.50-1.54).

    dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)), zero where masked;
    dQ = dS K / sqrt(d); dK = dS^T Q / sqrt(d). Works on any leading batch dims.
    """
    d = q.shape[-1]
    c = 1.0 / math.sqrt(d) if scaled else 1.0
    p = attention(q, k, v, scaled=scaled, causal=causal).weights
    dv = p.transpose(-2, -1) @ d_out
    dp = d_out @ v.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    if causal:
        ds = ds.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], device=q.device), 0.0)
    dq = ds @ k * c
    dk = ds.transpose(-2, -1) @ q * c
    return dq, dk, dv


def backward_parity(seed: int = 0, shape=(2, 4, 6, 32), causal: bool = True, scaled: bool = True) -> dict:
    """Max abs error of attention_backward vs autograd through attention.attention (float64)."""
    q, k, v = (t.requires_grad_(True) for t in qkv(seed, shape, 1.0, torch.float64))
    g = torch.Generator().manual_seed(seed + 1)
    d_out = torch.randn(shape, generator=g, dtype=torch.float64)
    attention(q, k, v, scaled=scaled, causal=causal).out.backward(d_out)
    with torch.no_grad():
        dq, dk, dv = attention_backward(q.detach(), k.detach(), v.detach(), d_out, scaled=scaled, causal=causal)
    return {"dq": float((dq - q.grad).abs().max()), "dk": float((dk - k.grad).abs().max()),
            "dv": float((dv - v.grad).abs().max())}


# ---------------------------------------------------------------- the precision stage


def finite_only(d: dict) -> dict:
    """Drop nan/inf values (their *_nan / *_inf flags say what happened)."""
    return {k: v for k, v in d.items() if not (isinstance(v, float) and not math.isfinite(v))}


def mask_tag(v: float) -> str:
    return "m" + f"{abs(v):.0e}".replace("e+0", "e").replace("e+", "e")


def forward_grid(cfg: PrecisionConfig) -> tuple[dict, list[dict]]:
    """The forward_<qk> sections and one row per qk x d_head x scaled x softmax x dtype."""
    combos = [(label, std, d, scaled, stable, dt) for label, std in cfg.qk_stds_published.items()
              for d in cfg.d_heads for scaled in (True, False) for stable in (True, False) for dt in cfg.dtypes]
    sections: dict[str, dict] = {}
    rows = []
    bar = progress(len(combos), "precision forward")
    for label, std, d, scaled, stable, dt in combos:
        r = forward_overflow(d, qk_std=std, dtype=dt, scaled=scaled, stable=stable, seed=cfg.seed,
                             batch=cfg.batch, heads=cfg.heads, seq=cfg.seq)
        tag = f"{dt}_{'scaled' if scaled else 'unscaled'}_{'stable' if stable else 'naive'}_d{d}"
        sec = sections.setdefault(f"forward_{label}", {"qk_std": std})
        sec[f"{tag}_nonfinite"] = r["nonfinite_frac"]
        if dt == "fp32" and stable:
            sec[f"{'scaled' if scaled else 'unscaled'}_d{d}_logit_absmax"] = r["logit_absmax"]
        rows.append({"qk": label, "qk_std": std, "d_head": d, "scaled": int(scaled), "stable": int(stable),
                     "dtype": dt, **r})
        bar.update(1)
    bar.close()
    return sections, rows


def mask_section(cfg: PrecisionConfig) -> dict:
    """The additive-mask pitfalls (checkpoint 16): the metrics' `mask` section."""
    out = {}
    for dt in ("fp16", "bf16"):
        val = additive_mask_value(-1e9, dt)
        out[f"neg1e9_{dt}_is_inf"] = int(math.isinf(val))
        if math.isfinite(val):
            out[f"neg1e9_{dt}_value"] = val
        out[f"fullrow_add1e9_{dt}_nan"] = fully_masked_row(-1e9, dt)["nan"]
        out[f"fullrow_neginf_{dt}_nan"] = fully_masked_row(None, dt)["nan"]
    out["fullrow_add1e9_fp32_nan"] = fully_masked_row(-1e9, "fp32")["nan"]
    out["fullrow_add1e9_fp32_w0"] = fully_masked_row(-1e9, "fp32")["w0"]
    for label, std in cfg.mask_logit_stds_published.items():
        for mv in cfg.mask_values:
            for dt in cfg.dtypes:
                r = additive_mask_leak(std, mv, dtype=dt, seq=cfg.seq, seed=cfg.seed)
                key = f"{label}_{mask_tag(mv)}_{dt}"
                out[f"{key}_leak_mean"] = r["leak_mean"]
                out[f"{key}_leak_max"] = r["leak_max"]
                out[f"{key}_nan"] = r["nan"]
        out[f"{label}_logit_absmax"] = additive_mask_leak(std, -1e9, seq=cfg.seq, seed=cfg.seed)["logit_absmax"]
    return finite_only(out)


@dataclass
class PrecisionResult:
    metrics: dict  # the sections of metrics/precision.json (see the precision stage)
    rows: list  # plots/precision/forward.csv: one row per forward_grid combination

    def lines(self) -> list[str]:
        """The stage's printed summary line."""
        sm, overflow = self.metrics["softmax"], self.metrics["overflow"]
        return [f"precision: naive softmax nan fp64/fp32/fp16/bf16 = {sm['fp64_naive_nan']}/{sm['fp32_naive_nan']}/"
                f"{sm['fp16_naive_nan']}/{sm['bf16_naive_nan']}; exp overflow "
                + ", ".join(f"{k} {v}/{overflow['size']}" for k, v in overflow.items() if k.endswith("_inf"))
                + f"; sdpa parity {self.metrics['parity']['sdpa_causal_max_abs_err']:.2e}"]


def run(cfg: PrecisionConfig) -> PrecisionResult:
    """Every section of the precision stage's metrics, and the forward grid's rows."""
    metrics: dict[str, dict] = {}
    metrics["finfo"] = {f"{dt}_{k}": v for dt, row in finfo_table(LOW).items() for k, v in row.items()}
    fp16, bf16 = round_trip(1.001, "fp16"), round_trip(1.001, "bf16")
    metrics["round_trip"] = {"fp16_1p001": fp16, "bf16_1p001": bf16, "fp32_1p001": round_trip(1.001, "fp32"),
                             "fp16_distinguishes": int(fp16 != 1.0), "bf16_distinguishes": int(bf16 != 1.0)}
    metrics["softmax"] = finite_only({f"{dt}_{k}": v for dt, row in softmax_demo(cfg.softmax_logits).items()
                                      for k, v in row.items()})
    size = math.prod(cfg.overflow_shape)
    published = cfg.overflow_stds_published
    metrics["overflow"] = {"size": size, **{f"{label}_std": std for label, std in published.items()},
                           **{f"{label}_inf": exp_overflow_count(std, tuple(cfg.overflow_shape), cfg.overflow_seed)
                              for label, std in published.items()}}
    four = four_sigma_table(cfg.sigma_d_heads)
    metrics["four_sigma"] = {"fp16_ln_max": metrics["finfo"]["fp16_ln_max"],
                             **{f"{d}_{k}": v for d, row in four.items() for k, v in row.items()
                                if k in ("std", "four_sigma", "overflows_fp16")}}
    sections, rows = forward_grid(cfg)
    metrics.update(sections)
    metrics["mask"] = mask_section(cfg)
    metrics["accumulation"] = accumulation(cfg.accum_n, seed=cfg.seed)
    shape = tuple(cfg.parity_shape)
    bwd = backward_parity(cfg.seed, shape)
    bwd_nc = backward_parity(cfg.seed, shape, causal=False)
    metrics["parity"] = {"sdpa_causal_max_abs_err": sdpa_parity(cfg.seed, shape),
                         "sdpa_full_max_abs_err": sdpa_parity(cfg.seed, shape, causal=False),
                         **{f"bwd_causal_{k}_max_abs_err": v for k, v in bwd.items()},
                         **{f"bwd_full_{k}_max_abs_err": v for k, v in bwd_nc.items()}}
    return PrecisionResult(metrics=metrics, rows=rows)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    if not metrics:
        return ""
    out = []
    o = metrics.get("overflow", {})
    if o:
        out.append(f"exp of float32 logits overflows in {o['unscaled_inf']} of {o['size']} entries at std "
                   f"{o['unscaled_std']:g} and {o['scaled_inf']} at std {o['scaled_std']:g}")
    sm = metrics.get("softmax", {})
    if sm:
        nan = [d for d in ("fp32", "fp16", "bf16") if sm.get(f"{d}_naive_nan")]
        out.append(f"the naive softmax gives nan in {', '.join(nan) or 'no format'} where the stable one does not")
    par = metrics.get("parity", {})
    if par:
        out.append(f"the manual attention and its backward agree with SDPA and autograd in float64 to "
                   f"{max(par.values()):.2g}")
    ft = metrics.get("forward_trained", {})
    if ft:
        bad = sorted(k for k, v in ft.items() if v and "stable" in k)
        out.append(f"with trained-scale q and k the stable forward stays finite in "
                   f"{'every' if not bad else 'all but ' + str(len(bad))} format/d_head case")
    text = "; ".join(out) + "."
    return (text[0].upper() + text[1:]) if out else ""
