"""Determinism and dropout: two identical calls with dropout_p = 0 must agree bit for bit; with
dropout_p > 0 the weights must be dropped at that rate and the kept ones scaled by 1 / (1 - p).

The weights are read off with q = 0 (every weight 1/S) and the identity as the values
(out = W @ I = W), so each dropped weight reads 0 and each kept one its dropout-free value / (1 - p). The keep
rate is a binomial proportion over B*H*L*S weights: judged at 6 standard errors. A random
output at dropout_p = 0 is the first thing the diagnosis names: while it lasts, every other
comparison measures noise.
"""

from __future__ import annotations

import math

import torch

from attnrepro.audit.checks import IDENTITY, CheckResult, Finding, Impl, guarded

P_TEST = 0.25
SHAPE = (1, 4, 64, 64)  # B, H, L, S: 16384 weights, the keep rate's standard error 0.0034 at p = 0.25
Z_MAX = 6.0


def uniform_weights(impl: Impl, dropout_p: float, what: str) -> torch.Tensor:
    B, H, L, S = SHAPE
    q = torch.zeros(B, H, L, S, device=impl.device)  # key width = value width (= S): no Ev != E needed
    k = torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(2)).to(impl.device)
    eye = torch.eye(S, device=impl.device).expand(B, H, S, S)
    with torch.no_grad():
        return impl.call(q, k, eye, {"dropout_p": dropout_p}, what).double().cpu()


def determinism(impl: Impl) -> CheckResult:
    res = CheckResult("determinism")
    guarded(res, lambda: _repeat(impl, res))
    if not any(f.cause in ("dropout_on", "nondeterministic") for f in res.findings):
        guarded(res, lambda: _dropout(impl, res))
        for f in res.findings:
            if f.cause.startswith("dropout_"):
                f.via = (IDENTITY,)  # the rates are read off with values = identity
    return res


def _repeat(impl: Impl, res: CheckResult) -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 17, 24, generator=g).to(impl.device) for _ in range(3))
    with torch.no_grad():
        first, second = (impl.call(q, k, v, {"is_causal": True}, "two identical calls, dropout_p=0")
                         for _ in range(2))
    res.details["repeat_max_diff"] = (first.double() - second.double()).abs().max().item()
    if torch.equal(first, second):
        return
    w = uniform_weights(impl, 0.0, "weights with dropout_p=0 (q = 0, values = identity)")
    drop = (w == 0).double().mean().item()
    res.details["drop_rate_at_p0"] = drop
    if drop > 0:
        res.findings.append(Finding(
            "determinism", "fail", f"dropout applied with dropout_p=0: {drop:.1%} of the weights read 0 and two "
            "identical calls differ (a hard-coded dropout rate, or dropout not tied to dropout_p)",
            cause="dropout_on", smallest="B=1 H=1 L=1 S=64, q = 0, dropout_p=0", data={"drop_rate": drop,
            # the headline rounds to 5% so that it is the same whatever the draw (the detail has the rate)
            "headline": f"dropout applied with dropout_p=0 (about {round(drop * 20) * 5}% of the weights zeroed): "
                        "the output is random"}))
    else:
        res.findings.append(Finding(
            "determinism", "fail", f"two identical calls with dropout_p=0 differ by up to "
            f"{res.details['repeat_max_diff']:.3g}: the output is not a function of the inputs",
            cause="nondeterministic", smallest="B=2 H=3 L=S=17 E=24, is_causal, called twice"))


def _dropout(impl: Impl, res: CheckResult) -> None:
    B, H, L, S = SHAPE
    base = uniform_weights(impl, 0.0, "weights with dropout_p=0 (q = 0, values = identity)")
    w = uniform_weights(impl, P_TEST, f"weights with dropout_p={P_TEST} (q = 0, values = identity)")
    live = base != 0  # the weights dropout can drop (a mask applied by mistake zeroes others at any p)
    kept = (w != 0) & live
    rate = kept.double().sum().item() / max(1, live.sum().item())
    se = math.sqrt(P_TEST * (1 - P_TEST) / max(1, live.sum().item()))
    # a kept weight against the same weight without dropout (another normalisation bug cancels out)
    scale = (w[kept] / base[kept]).mean().item() if kept.any() else math.nan
    res.details.update({"dropout_p": P_TEST, "keep_rate": rate, "keep_rate_expected": 1 - P_TEST,
                        "kept_weight_ratio": scale, "expected_kept_weight_ratio": 1 / (1 - P_TEST)})
    if rate == 1.0 and abs(scale - 1) < 1e-3:
        res.findings.append(Finding("determinism", "fail", f"dropout_p={P_TEST} has no effect: every weight is kept "
                                    "and unscaled (dropout_p ignored)", cause="dropout_ignored",
                                    smallest=f"B=1 H=1 L=1 S={S}, q = 0, dropout_p={P_TEST}"))
    elif abs(rate - (1 - P_TEST)) > Z_MAX * se:
        res.findings.append(Finding("determinism", "fail", f"dropout_p={P_TEST} keeps {rate:.3f} of the weights, "
                                    f"expected {1 - P_TEST:.3f} (+- {se:.4f})", cause="dropout_rate",
                                    smallest=f"B=1 H=4 L=S={S}, q = 0, dropout_p={P_TEST}"))
    elif abs(scale * (1 - P_TEST) - 1) > 0.01:
        res.findings.append(Finding("determinism", "fail", f"dropout_p={P_TEST}: a kept weight is {scale:.4g} times "
                                    f"its value without dropout, expected 1/(1 - p) = {1 / (1 - P_TEST):.4g} (kept "
                                    "weights not rescaled)",
                                    cause="dropout_unscaled", smallest=f"B=1 H=1 L=1 S={S}, q = 0, dropout_p={P_TEST}"))
