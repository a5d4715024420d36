"""How large are the raw q.k logits at initialization? (§1.3, §1.19.1): params section `init_sweep`.

A single-head, single-layer TinyGPT per d_head = d_model, untrained, measured on the same random
token batches (attnrepro.measure.probes.measure_init), against the footnote's sqrt(d) and the
variance-propagation prediction v*sqrt(d); the fitted log-log slope says which one holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnrepro.config import UserError, require, require_positive
from attnrepro.measure.probes import measure_init
from attnrepro.measure.timing import fit_exponent
from attnrepro.model.transformer import ModelConfig, TinyGPT
from attnrepro.progress import progress


@dataclass
class InitSweepConfig:
    """params `init_sweep` (no defaults: params.yaml is the only source of values)."""

    d_heads: list[int]
    vocab_size: int
    block_size: int
    batch_size: int
    n_batches: int
    token_low: int  # tokens drawn from randint(token_low, vocab_size)
    init_std: float  # sigma of the N(0, sigma^2) init, also the prediction's sigma
    model_seed: int  # torch.manual_seed before building each model
    batch_seed: int  # generator of the token batches (shared by every d_head)
    threads: int

    def validate(self, prefix: str = "init_sweep") -> None:
        require(len(self.d_heads) >= 2 and all(d > 0 for d in self.d_heads), f"{prefix}.d_heads",
                self.d_heads, "at least two positive integers")
        require_positive(self, ("block_size", "batch_size", "n_batches", "threads"), prefix)
        require(0 <= self.token_low < self.vocab_size, f"{prefix}.token_low", self.token_low,
                f"in [0, vocab_size={self.vocab_size})")
        require(math.isfinite(self.init_std) and self.init_std > 0, f"{prefix}.init_std", self.init_std,
                "a finite positive number")


def init_model(d_head: int, *, vocab_size: int, block_size: int, init_std: float, seed: int,
               impl: str = "manual") -> TinyGPT:
    """Single-head, single-layer TinyGPT at initialization, unscaled (raw q.k logits); `impl` its attention
    (ModelConfig.impl)."""
    cfg = ModelConfig(vocab_size=vocab_size, block_size=block_size, d_model=d_head, n_head=1, d_qk=None, n_layer=1,
                      scaled=False, bug="correct", causal=True, impl=impl, fused_qkv=True, qkv_bias=False,
                      proj_bias=False, mlp_ratio=2, activation="gelu", dropout=0.0, tie_weights=True,
                      head_bias=False, init_std=init_std, init="gpt2", qk_norm="none", qk_gain_init=None)
    torch.manual_seed(seed)
    return TinyGPT(cfg).eval()


def random_batches(n: int, batch: int, block: int, low: int, high: int, seed: int) -> torch.Tensor:
    """n token batches `randint(low, high, (batch, block))` from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n, batch, block), generator=g)


def predictions(d_head: int, init_std: float) -> dict:
    """Footnote sqrt(d) and the variance-propagation v*sqrt(d), v = d_model * sigma^2 (eq. 1.1-1.2)."""
    v = d_head * init_std**2
    return {"theory_sqrt_d": math.sqrt(d_head), "v": v, "pred_varprop": v * math.sqrt(d_head)}


def sweep_fit(rows: list[dict]) -> dict:
    """Which prediction fits: fitted slope vs 0.5 (footnote) and 1.5 (varprop), log ratios."""
    d = [r["d_head"] for r in rows]
    meas = [r["logit_std"] for r in rows]
    lr_sqrt = [abs(math.log10(r["ratio_sqrt_d"])) for r in rows]
    lr_var = [abs(math.log10(r["ratio_varprop"])) for r in rows]
    return {
        "slope_measured": fit_exponent(d, meas),
        "slope_footnote": 0.5,
        "slope_varprop": 1.5,
        "max_abs_log10_ratio_footnote": max(lr_sqrt),
        "max_abs_log10_ratio_varprop": max(lr_var),
        "varprop_fits_better": int(max(lr_var) < min(lr_sqrt)),
    }


@dataclass
class InitSweepResult:
    rows: list  # one row per d_head: the measurement, the predictions and the ratios
    metrics: dict  # d<N>.* per row and fit.*

    def lines(self) -> list[str]:
        """The stage's printed summary: one line per d_head, then the fitted slope."""
        out = [f"d{r['d_head']:<4} std {r['logit_std']:.4f} (pooled {r['logit_std_pooled']:.4f})  "
               f"sqrt(d) {r['theory_sqrt_d']:.2f} ratio {r['ratio_sqrt_d']:.4f}  "
               f"v*sqrt(d) {r['pred_varprop']:.4f} ratio {r['ratio_varprop']:.3f}  entropy {r['entropy']:.4f}"
               for r in self.rows]
        out.append(f"fitted log-log slope {self.metrics['fit']['slope_measured']:.3f}")
        return out


def run(cfg: InitSweepConfig, impl: str) -> InitSweepResult:
    """Every d_head of `cfg.d_heads`, its model's attention `impl` (ModelConfig.impl)."""
    batches = random_batches(cfg.n_batches, cfg.batch_size, cfg.block_size, cfg.token_low, cfg.vocab_size,
                             cfg.batch_seed)
    rows = []
    bar = progress(len(cfg.d_heads) * cfg.n_batches, "init_sweep")
    for d in cfg.d_heads:
        model = init_model(d, vocab_size=cfg.vocab_size, block_size=cfg.block_size, init_std=cfg.init_std,
                           seed=cfg.model_seed, impl=impl)
        m = measure_init(model, batches, tick=lambda: bar.update(1))
        broken = sorted(k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v))
        if broken:
            raise UserError(f"init_sweep: at d_head {d} the attention ({impl}) gives non-finite {', '.join(broken)} "
                            "on random inputs at initialisation (audit it: attnrepro audit <module:function>)")
        p = predictions(d, cfg.init_std)
        rows.append({"d_head": d, **m, **p, "ratio_sqrt_d": m["logit_std"] / p["theory_sqrt_d"],
                     "ratio_varprop": m["logit_std"] / p["pred_varprop"]})
    bar.close()
    metrics = {f"d{r['d_head']}": {k: v for k, v in r.items() if k != "d_head"} for r in rows}
    metrics["fit"] = sweep_fit(rows)
    return InitSweepResult(rows=rows, metrics=metrics)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    fit = metrics.get("fit") if metrics else None
    if not fit:
        return ""
    ds = sorted((int(k[1:]), v) for k, v in metrics.items() if k.startswith("d") and k[1:].isdigit())
    lo, hi = ds[0], ds[-1]
    return (f"At initialisation the logit std grows from {lo[1]['logit_std']:.3g} (d_head {lo[0]}) to "
            f"{hi[1]['logit_std']:.3g} (d_head {hi[0]}), a log-log slope of {fit['slope_measured']:.2f}: the "
            f"variance-propagation prediction (slope {fit['slope_varprop']:g}, off by at most "
            f"{100 * (10 ** fit['max_abs_log10_ratio_varprop'] - 1):.0f}%) "
            f"{'fits better than' if fit.get('varprop_fits_better') else 'does not fit better than'} the footnote's √d "
            f"(slope {fit['slope_footnote']:g}); the unscaled softmax entropy falls to {hi[1]['entropy']:.3g} at "
            f"d_head {hi[0]}.")
