"""AttentionDebugger: the chapter's exercise §1.20.4 as a tool you attach to a TinyGPT.

Forward hooks on every SelfAttention keep the input of the latest forward pass
(no change to the model code). Call `dbg.step(step, loss)` from your own training
loop after the forward pass and *before* `optimizer.step()`:

- every `every` steps it recomputes each layer's attention from the captured input and
  logs normalized entropy, logit std and ||J||_F (`dbg.history`);
- it raises an `AttentionWarning` (and appends to `dbg.events`) when a layer's entropy
  leaves (entropy_low, entropy_high) or its logit std exceeds `logit_std_max`
  (`grace_steps` silences the entropy-high alert while a fresh model is still uniform);
- on a non-finite loss it re-runs each layer's attention on the captured input with
  `attention(..., trace=dict)` and reports the first of the four §1.13.3 steps
  (scores, masked, exp, weights) that went non-finite, and in which layer
  (`dbg.localize()` returns a `Localization`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch

from attnrepro.measure.weights import layer_summary
from attnrepro.model.attention import attention, causal_mask
from attnrepro.model.transformer import TinyGPT

STEPS = ("scores", "masked", "exp", "weights")


class AttentionWarning(UserWarning):
    """An attention diagnostic left its healthy range, or the loss went non-finite."""


@dataclass
class Localization:
    """Where the first non-finite value appeared. step: 'input', 'qkv' or one of STEPS."""

    layer: Optional[int]
    step: Optional[str]
    detail: str

    @property
    def found(self) -> bool:
        return self.layer is not None


@dataclass
class Event:
    step: int
    layer: Optional[int]
    kind: str  # entropy_high, entropy_low, logit_std_high, non_finite_loss
    value: float
    message: str


def _bad(t: torch.Tensor, allowed: Optional[torch.Tensor]) -> int:
    """Count of non-finite entries; with `allowed`, -inf outside it is expected (the mask)."""
    if allowed is None:
        return int((~torch.isfinite(t)).sum().item())
    return int(torch.isnan(t).sum().item() + (~torch.isfinite(t[..., allowed])).sum().item()
               + torch.isposinf(t[..., ~allowed]).sum().item())


@dataclass
class AttentionDebugger:
    model: TinyGPT
    every: int = 50
    entropy_low: float = 0.01
    entropy_high: float = 0.99
    logit_std_max: float = 50.0
    warn: bool = True  # also emit python warnings (events are always recorded)
    # no entropy-high alerts before this step: with small init (sigma 0.02) attention
    # starts near-uniform by design (§1.3), so a fresh healthy model would trip it
    grace_steps: int = 0
    history: list[dict] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    localizations: list[tuple[int, Localization]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.every <= 0:
            raise ValueError(f"every: got {self.every}, expected a positive integer")
        if not 0 <= self.entropy_low < self.entropy_high <= 1:
            raise ValueError(f"entropy band ({self.entropy_low}, {self.entropy_high}) must satisfy 0 <= low < high <= 1")
        self._inputs: list[Optional[torch.Tensor]] = [None] * len(self.model.attentions)
        self._handles = [a.register_forward_hook(self._hook(i)) for i, a in enumerate(self.model.attentions)]

    def _hook(self, i: int):
        def capture(module, args, output):
            self._inputs[i] = args[0].detach()
        return capture

    def detach(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> "AttentionDebugger":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    # ------------------------------------------------------------------ recomputation

    def _recompute(self, i: int, trace: Optional[dict] = None):
        x = self._inputs[i]
        if x is None:
            raise RuntimeError("no forward pass captured yet: call the model before dbg.step()")
        mod = self.model.attentions[i]
        q, k, v = mod.project(x)
        res = attention(q, k, v, scaled=mod.cfg.scaled, causal=mod.cfg.causal, bug=mod.cfg.bug,
                        qk_norm=mod.qk_norm(), trace=trace)
        return q, k, v, res

    @torch.no_grad()
    def diagnostics(self) -> list[dict]:
        """Entropy, logit std and ||J||_F of each layer for the last captured forward."""
        out = []
        for i, mod in enumerate(self.model.attentions):
            _, _, _, res = self._recompute(i)
            out.append(layer_summary(res.weights, res.logits, mod.cfg.causal))
        return out

    @torch.no_grad()
    def localize(self) -> Localization:
        """Re-run each layer's attention instrumented; the first non-finite step wins."""
        for i, mod in enumerate(self.model.attentions):
            x = self._inputs[i]
            if x is None:
                raise RuntimeError("no forward pass captured yet: call the model before dbg.step()")
            if _bad(x, None):
                return Localization(i, "input", f"layer {i}: its input is already non-finite")
            trace: dict = {}
            q, k, v, _ = self._recompute(i, trace)
            n_qkv = sum(_bad(t, None) for t in (q, k, v))
            if n_qkv:
                return Localization(i, "qkv", f"layer {i}: q/k/v projections have {n_qkv} non-finite values "
                                              "(weights blew up: init or learning rate)")
            allowed = causal_mask(q.shape[-2], k.shape[-2]) if mod.cfg.causal else None
            for name in STEPS:
                t = trace[name]
                n = _bad(t, allowed if name in ("scores", "masked") else None)
                if n:
                    return Localization(i, name, f"layer {i}: first non-finite at step '{name}' ({n} values; "
                                                 f"max |score| {trace['scores'].abs().max().item():.4g})")
        return Localization(None, None, "every attention step is finite: the non-finite loss comes from elsewhere")

    # ------------------------------------------------------------------ the hook into training

    def _event(self, step: int, layer: Optional[int], kind: str, value: float, message: str) -> None:
        self.events.append(Event(step, layer, kind, value, message))
        if self.warn:
            warnings.warn(f"step {step}: {message}", AttentionWarning, stacklevel=3)

    def step(self, step: int, loss) -> Optional[Localization]:
        """Call once per training step, after the forward pass and before optimizer.step().

        Returns the Localization when the loss is non-finite, else None.
        """
        loss = float(loss)
        if not math.isfinite(loss):
            loc = self.localize()
            self.localizations.append((step, loc))
            self._event(step, loc.layer, "non_finite_loss", loss, f"loss is {loss}; {loc.detail}")
            return loc
        if step % self.every:
            return None
        row = {"step": step, "loss": loss}
        for i, d in enumerate(self.diagnostics()):
            for key, val in d.items():
                row[f"{key}_l{i}"] = val
            if d["entropy"] >= self.entropy_high and step >= self.grace_steps:
                self._event(step, i, "entropy_high", d["entropy"],
                            f"layer {i} entropy {d['entropy']:.4f} >= {self.entropy_high}: near-uniform "
                            "attention (over-scaled logits, e.g. dividing by d_k)")
            elif d["entropy"] <= self.entropy_low:
                self._event(step, i, "entropy_low", d["entropy"],
                            f"layer {i} entropy {d['entropy']:.4f} <= {self.entropy_low}: saturated softmax "
                            "(missing 1/sqrt(d_k)?)")
            if d["logit_std"] > self.logit_std_max:
                self._event(step, i, "logit_std_high", d["logit_std"],
                            f"layer {i} logit std {d['logit_std']:.4g} > {self.logit_std_max}")
        self.history.append(row)
        return None
