"""The corpus_lm task: the chapter's LM on the Tang-poetry token stream, as a run.

Every chapter run goes through here: the four variants of the train stage, the
injected bugs of the failures stage, and every sweep over seeds, d_head, QK-norm
forms and protocol choices. `prepare` adapts the data (inputs train.npy, val.npy,
vocab.json); `before` and `after` take the measurements the spec's `LMMeasure` asks
for. What this module computes is versioned by NUMERICS["corpus_lm"] (attnrepro.run.execute).

Failure-symptom entropy (`weight_symptoms`, metrics/failures.json `<variant>.entropy`):
the normalized entropy of the ROW-RENORMALIZED weights q = p / sum_j p_j, divided by
log(number of keys the row can actually give weight to): every key (t_k) when the
variant's mask leaks (MASK_LEAKS, i.e. mask_zero), the causal count i+1 otherwise;
averaged over rows with more than one such key. So every variant's `entropy` lies in
[0, 1] and the variants are comparable: scale_after_softmax (rows summing to
1/sqrt(d_head)) gets the entropy of the softmax it actually computed, and mask_zero
(weight on future keys) is measured against the keys it really spreads over.
`entropy_raw` keeps the naive value (entropy of p as it is, / log(causal keys)),
which is outside [0, 1] for those two bugs; `entropy_support_all_keys` is 1 when the
normalization used all keys.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np
import torch

from attnrepro.data.tokenizer import Tokenizer
from attnrepro.measure.weights import normalized_entropy, position_stats
from attnrepro.model.attention import causal_mask
from attnrepro.model.transformer import TinyGPT, generate, mean_loss
from attnrepro.run.loop import BatchSampler, TrainingLog, evaluate, fixed_batches, qk_scale
from attnrepro.run.spec import Prepared, RunSpec, with_vocab


def loss_summary(history: list[dict], window: int) -> dict:
    losses = [r["loss"] for r in history]
    tail = losses[-window:]
    return {"loss_start": losses[0], "loss_final": sum(tail) / len(tail), "loss_last_step": losses[-1],
            "grad_norm_final": history[-1]["grad_norm"]}


def chapter_summary(history: list[dict], final: dict, summary_steps, scale_init: dict, scale_final: dict) -> dict:
    """The §9 contract of metrics/train.json for one variant (loss keys come from loss_summary)."""
    out = {"val_loss_final": final["loss"]}
    # layer-0 values under the contract's names, every layer with an _l<i> suffix
    for key in ("entropy", "logit_std", "jacobian_fro"):
        out[f"{key}_final"] = final[f"{key}_l0"]
        for k, v in final.items():
            if k.startswith(key + "_l"):
                out[f"{key}_final_{k.rsplit('_', 1)[1]}"] = v
    for step in sorted(summary_steps):
        if step < len(history):
            for key in ("entropy", "logit_std", "jacobian_fro"):
                out[f"{key}_step{step}"] = history[step][f"{key}_l0"]
    for k, v in scale_init.items():
        out[f"init_{k}"] = v
    for k, v in scale_final.items():
        out[f"trained_{k}"] = v
    return out


@dataclass(frozen=True)
class LMData:
    val_batches: int  # the fixed validation batches: how many ...
    val_seed: int  # ... and the seed that draws them


@dataclass(frozen=True)
class Sample:
    prompt: str
    tokens: int
    temperature: float
    seed: int


@dataclass(frozen=True)
class LMMeasure:
    """What a corpus_lm run measures after training, besides its loss summary."""
    loss_window: int  # loss_final = mean training loss of the last loss_window steps
    summary_steps: list[int]  # diagnostics of these steps go into the summary
    diagnostics: bool  # the chapter's §9 contract (chapter_summary) on the validation batches
    qk_scale: bool  # ... with the q/k scale before and after training
    symptoms: bool  # the failure symptoms of the attention weights (weight_symptoms)
    sample: Optional[Sample]  # a generated sample, written to sample.txt


@dataclass
class LMState:
    itos: list[str]
    val: list  # the fixed validation batches


def prepare(spec: RunSpec, inputs: Mapping[str, bytes], device: str) -> Prepared:
    """The chapter's LM on the Tang-poetry token stream (inputs: train.npy, val.npy, vocab.json)."""
    itos = json.loads(inputs["vocab.json"].decode("utf-8"))
    train_ids = torch.from_numpy(np.load(io.BytesIO(inputs["train.npy"])).astype(np.int64)).to(device)
    val_ids = torch.from_numpy(np.load(io.BytesIO(inputs["val.npy"])).astype(np.int64)).to(device)
    mcfg = with_vocab(spec, len(itos))
    batch = spec.optim.batch_size
    val = fixed_batches(val_ids, mcfg.block_size, batch, spec.data.val_batches, seed=spec.data.val_seed)
    return Prepared(mcfg, BatchSampler(train_ids, mcfg.block_size, batch, seed=spec.batch_seed),
                    state=LMState(itos, val))


def evaluate_val(model: TinyGPT, prep: Prepared) -> dict:
    return {"val_loss": mean_loss(model, prep.state.val)}


def before(model: TinyGPT, spec: RunSpec, prep: Prepared) -> dict:
    """The q/k scale of the fresh model, where the spec measures it."""
    return qk_scale(model, prep.state.val[0][0]) if spec.measure.qk_scale else {}


def after(model: TinyGPT, spec: RunSpec, prep: Prepared, run: TrainingLog, scale_init: dict) -> tuple[dict, dict]:
    m: LMMeasure = spec.measure
    val = prep.state.val
    summary = {"params": model.num_params(), **loss_summary(run.history, m.loss_window)}
    files = {}
    if m.diagnostics:
        final = evaluate(model, val)
        scale_final = qk_scale(model, val[0][0]) if m.qk_scale else {}
        summary.update(chapter_summary(run.history, final, m.summary_steps, scale_init, scale_final))
    if m.symptoms:
        summary.update(weight_symptoms(model, val))
    if m.sample is not None:
        files["sample.txt"] = sample_text(model, Tokenizer(prep.state.itos), m.sample, spec.device)
    return summary, files


def sample_text(model: TinyGPT, tok: Tokenizer, s: Sample, device: str) -> str:
    prompt = torch.from_numpy(tok.encode(s.prompt).astype("int64"))[None].to(device)
    gen = torch.Generator(device=device).manual_seed(s.seed)
    model.eval()
    ids = generate(model, prompt, s.tokens, temperature=s.temperature, generator=gen)
    return tok.decode(ids[0].tolist()) + "\n"


# bugs whose mask leaks weight onto future keys: their rows can spread over all t_k keys
MASK_LEAKS = frozenset({"mask_zero"})


def renormalized_entropy(w: torch.Tensor, leaks: bool) -> torch.Tensor:
    """Normalized entropy of the row-renormalized weights w / w.sum(-1).

    Normalized by log(keys the row can give weight to): all t_k keys when the mask
    leaks, the causal count otherwise; rows with one such key are excluded. In [0, 1]
    for any non-negative weights; equals normalized_entropy(w) when rows sum to 1 and
    nothing leaks. Leading dims are kept (averaged over rows), like normalized_entropy.
    """
    w = w.double()
    q = w / w.sum(-1, keepdim=True)
    return normalized_entropy(q, causal=not leaks)


@torch.no_grad()
def weight_symptoms(model: TinyGPT, batches) -> dict:
    """Entropy, diagonal weight, max row sum and future-key mass of the attention
    weights on fixed batches, layer 0 (the contract's value) and per layer.

    `entropy` is renormalized_entropy (see the module docstring), `entropy_raw` the
    naive normalized entropy of the weights as they are (causal normalization)."""
    leaks = getattr(model.cfg, "bug", "correct") in MASK_LEAKS
    model.eval()
    model.set_record(True)
    acc: dict[str, list[float]] = {}
    for x, _ in batches:
        model(x)
        for li, a in enumerate(model.attentions):
            w = a.last["weights"]
            future = ~causal_mask(w.shape[-2], w.shape[-1], device=w.device)
            vals = {
                "entropy": renormalized_entropy(w, leaks).mean().item(),
                "entropy_raw": normalized_entropy(w).mean().item(),
                "diag_weight": position_stats(w)["diag"].mean().item(),
                "max_row_sum": w.double().sum(-1).max().item(),
                "min_row_sum": w.double().sum(-1).min().item(),
                "future_weight": w[..., future].double().sum().item() / (w[..., 0].numel()),
            }
            for k, v in vals.items():
                acc.setdefault(f"{k}_l{li}", []).append(v)
    model.set_record(False)
    out = {}
    for k, v in acc.items():
        agg = max if k.startswith("max_") else min if k.startswith("min_") else np.mean
        out[k] = float(agg(v))
    for k in ("entropy", "entropy_raw", "diag_weight", "max_row_sum", "min_row_sum", "future_weight"):
        out[k] = out[f"{k}_l0"]
    out["entropy_support_all_keys"] = int(leaks)
    return out
