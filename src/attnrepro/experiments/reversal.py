"""The `reversal` stage: the companion digit-reversal transformer (../seeds/000), every variant's run
from the run engine, evaluated on the test set (accuracy, alignment, the causal mask's effect, MHA
parity). The task itself (tokens, data splits, batches, the answer loss) is attnrepro.run.task_reversal.

The model is the project's TinyGPT (one attention implementation); the companion
document's architecture is a ModelConfig: three biased Linear(d, d) projections,
biased output projection, FFN d -> 2d -> d with GELU, untied head with bias, every
weight N(0, 0.02) and biases zero.

"Identical initial weights" across variants: the q/k/v/proj matrices are (d, d)
whatever the head count, so one seed draws the same weights for every variant;
the 1-head variant reads the same q/k/v matrices as one 64-dim head instead of
four 16-dim slices, and the no-mask variant differs only in `causal`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn

from attnrepro.config import require, require_positive
from attnrepro.envinfo import stage_environment
from attnrepro.measure.probes import sequence_maps
from attnrepro.model.transformer import ModelConfig, SelfAttention, TinyGPT, generate, load_checkpoint
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.run.loop import OptimConfig
from attnrepro.run.spec import RunSpec
from attnrepro.run.task_reversal import (ALIGN_KEYS, ALIGN_QUERIES, ANSWER_LEN, BOS, EOS, FUTURE_KEYS, N_DIGITS,
                                         PROMPT_LEN, SEP, SEQ_LEN, VOCAB, ReversalData, answer_loss, make_splits)


@dataclass
class Variant:
    n_head: int
    causal: bool


@dataclass
class ReversalConfig:
    """params `reversal` (no defaults: params.yaml is the only source of values)."""

    seed: int  # model initialization (shared by every variant)
    data_seed: int  # which digit sequences land in train/val/test
    batch_seed: int  # the pre-drawn (steps, batch_size) training indices
    threads: int
    n_train: int
    n_val: int
    n_test: int
    steps: int
    batch_size: int
    lr: float
    grad_clip: float
    eval_every: int
    d_model: int
    n_layer: int
    mlp_ratio: int
    init_std: float
    sample_index: int  # test sample used for alignment, heatmaps and the mask toggle
    variants: dict[str, Variant]

    def validate(self, prefix: str = "reversal") -> None:
        require_positive(self, ("n_train", "n_val", "n_test", "steps", "batch_size", "eval_every", "threads",
                                "d_model", "n_layer", "mlp_ratio"), prefix)
        total = self.n_train + self.n_val + self.n_test
        require(total <= 10 ** N_DIGITS, f"{prefix}.n_train", self.n_train,
                f"n_train + n_val + n_test <= {10 ** N_DIGITS} (distinct digit strings)")
        for name in ("lr", "grad_clip", "init_std"):
            v = getattr(self, name)
            require(math.isfinite(v) and v > 0, f"{prefix}.{name}", v, "a finite positive number")
        require(0 <= self.sample_index < self.n_test, f"{prefix}.sample_index", self.sample_index,
                f"in [0, n_test={self.n_test})")
        require(len(self.variants) > 0, f"{prefix}.variants", self.variants, "at least one variant")
        for name, v in self.variants.items():
            require(v.n_head > 0 and self.d_model % v.n_head == 0, f"{prefix}.variants.{name}.n_head",
                    v.n_head, f"a positive divisor of d_model ({self.d_model})")

    def model_config(self, variant: str) -> ModelConfig:
        v = self.variants[variant]
        return ModelConfig(
            vocab_size=VOCAB, block_size=SEQ_LEN, d_model=self.d_model, n_head=v.n_head, d_qk=None,
            n_layer=self.n_layer, scaled=True, bug="correct", causal=v.causal, impl="manual", fused_qkv=False,
            qkv_bias=True, proj_bias=True, mlp_ratio=self.mlp_ratio, activation="gelu", dropout=0.0, tie_weights=False,
            head_bias=True, init_std=self.init_std, init="normal", qk_norm="none", qk_gain_init=None)


# ---------------------------------------------------------------- training

def run_spec(cfg: ReversalConfig, variant: str) -> RunSpec:
    """One variant as a run: Adam at a constant lr with grad-norm clipping (the document's
    protocol), full-set answer losses every eval_every steps and after the last.

    Every variant starts from the same weights: with one seed, the q/k/v/proj matrices
    are (d, d) whatever the head count, so the init draw is the same for each."""
    optim = OptimConfig(steps=cfg.steps, batch_size=cfg.batch_size, optimizer="adam", lr=cfg.lr,
                        betas=[0.9, 0.999], weight_decay=0.0, decay="all", schedule="constant", warmup=0,
                        min_lr_ratio=1.0, grad_clip=cfg.grad_clip)
    return RunSpec(task="reversal", model=cfg.model_config(variant), optim=optim,
                   seed=cfg.seed, batch_seed=cfg.batch_seed,
                   data=ReversalData(n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test,
                                     data_seed=cfg.data_seed),
                   diag_every=0, diag_steps=(), eval_every=cfg.eval_every, eval_final=True, measure=None,
                   threads=cfg.threads, device="cpu", label=f"reversal {variant}")


def loss_rows(evals: list[dict], history: list[dict]) -> list[dict]:
    """Evaluation rows (losses after `step` updates) with the training batch loss of the last update."""
    return [{**e, "batch_loss": history[e["step"] - 1]["loss"] if e["step"] > 0 else None} for e in evals]


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def generate_answers(model: TinyGPT, prompts: torch.Tensor) -> torch.Tensor:
    """Greedy 7-token continuation of 8-token prompts; the answer is never an input."""
    if prompts.shape[1] != PROMPT_LEN or not bool((prompts[:, -1] == SEP).all()):
        raise ValueError(f"prompts must be (N, {PROMPT_LEN}) sequences ending in SEP")
    was = model.training
    model.eval()
    out = generate(model, prompts, ANSWER_LEN, temperature=0)[:, PROMPT_LEN:]
    model.train(was)
    return out


def accuracy(pred: torch.Tensor, seqs: torch.Tensor) -> dict:
    """digit_acc over the six digit positions; seq_acc needs all six digits and EOS."""
    truth = seqs[:, PROMPT_LEN:]
    ok = pred == truth
    return {"digit_acc": ok[:, :N_DIGITS].float().mean().item(),
            "eos_acc": ok[:, N_DIGITS].float().mean().item(),
            "seq_acc": ok.all(dim=1).float().mean().item()}


def alignment(maps: torch.Tensor, keys=ALIGN_KEYS) -> torch.Tensor:
    """(n_layer, n_head): mean weight of answer queries 7..12 on `keys`, not renormalized."""
    return maps[:, :, ALIGN_QUERIES, keys].mean(dim=-1)


def with_causal(model: TinyGPT, causal: bool) -> TinyGPT:
    """A copy of `model` with the same weights and the mask switched on or off."""
    m = TinyGPT(dataclasses.replace(model.cfg, causal=causal))
    m.load_state_dict(model.state_dict())
    return m.eval()


@torch.no_grad()
def prefix_change(model: TinyGPT, seq: torch.Tensor, causal: bool) -> float:
    """Max |change| of the logits at input positions 0..7 when the future answer digits
    (input positions 8..13) are replaced by (d + s) mod 10 for every shift s = 1..9."""
    m = with_causal(model, causal)
    x = seq[None, :-1]
    base, _ = m(x)
    worst = 0.0
    for s in range(1, 10):
        alt = x.clone()
        alt[:, PROMPT_LEN:] = (alt[:, PROMPT_LEN:] + s) % 10
        logits, _ = m(alt)
        worst = max(worst, (logits[:, :PROMPT_LEN] - base[:, :PROMPT_LEN]).abs().max().item())
    return worst


@torch.no_grad()
def mha_parity(attn: SelfAttention, x: torch.Tensor) -> dict:
    """Max |difference| between `attn` and torch.nn.MultiheadAttention given the same weights."""
    cfg = attn.cfg
    if cfg.fused_qkv or not cfg.qkv_bias or not cfg.proj_bias:
        raise ValueError("parity check expects separate biased q/k/v and a biased output projection")
    d = cfg.d_model
    mha = nn.MultiheadAttention(d, cfg.n_head, bias=True, batch_first=True).to(x.dtype)
    mha.in_proj_weight.copy_(torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
    mha.in_proj_bias.copy_(torch.cat([attn.q.bias, attn.k.bias, attn.v.bias]))
    mha.out_proj.weight.copy_(attn.proj.weight)
    mha.out_proj.bias.copy_(attn.proj.bias)
    mha.eval()
    T = x.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1) if cfg.causal else None  # True = blocked
    ref_out, ref_w = mha(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
    was = (attn.training, attn.record)
    attn.eval()
    attn.record = True
    out = attn(x)
    w = attn.last["weights"]
    attn.train(was[0])
    attn.record = was[1]
    attn.last = None
    return {"out": (out - ref_out).abs().max().item(), "weights": (w - ref_w).abs().max().item()}


@torch.no_grad()
def layer0_input(model: TinyGPT, seqs: torch.Tensor) -> torch.Tensor:
    """What the first attention layer sees: ln1(token + position embeddings)."""
    x = seqs[:, :-1]
    h = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1]))
    return model.blocks[0].ln1(h)


def evaluate_variant(model: TinyGPT, splits: dict, history: list[dict], cfg: ReversalConfig) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Metrics of one trained variant, plus its test predictions and sample attention maps."""
    test = splits["test"]
    pred = generate_answers(model, test[:, :PROMPT_LEN])
    out = {"params": model.num_params(), **accuracy(pred, test)}
    sample = test[cfg.sample_index]
    maps = sequence_maps(model, sample[:-1])  # teacher-forced: the 14 model inputs
    align = alignment(maps)
    future = alignment(maps, FUTURE_KEYS)
    for layer in range(align.shape[0]):
        out[f"align_l{layer}"] = align[layer].mean().item()
        out[f"future_l{layer}"] = future[layer].mean().item()
        for h in range(align.shape[1]):
            out[f"align_l{layer}_h{h}"] = align[layer, h].item()
    out["prefix_change_mask_on"] = prefix_change(model, sample, causal=True)
    out["prefix_change_mask_off"] = prefix_change(model, sample, causal=False)
    parity = mha_parity(model.attentions[0], layer0_input(model, test[:64]))
    out["mha_parity_out_maxabs"] = parity["out"]
    out["mha_parity_weights_maxabs"] = parity["weights"]
    out["train_loss_final"] = history[-1]["train_loss"]
    out["val_loss_final"] = history[-1]["val_loss"]
    out["train_loss_start"] = history[0]["train_loss"]
    out["val_loss_start"] = history[0]["val_loss"]
    out["test_loss"] = answer_loss(model, test)
    return out, pred, maps


# ---------------------------------------------------------------- the stage's experiment

NAMES = {BOS: "BOS", SEP: "SEP", EOS: "EOS"}


def wide_losses(histories: dict[str, list[dict]]) -> list[dict]:
    """One row per evaluation step, one column per variant and loss (<variant>_train_loss, ...)."""
    steps = sorted({r["step"] for hist in histories.values() for r in hist})
    cols = {(name, r["step"]): r for name, hist in histories.items() for r in hist}
    return [{"step": s, **{f"{name}_{k}": cols.get((name, s), {}).get(k) for name in histories
                           for k in ("train_loss", "val_loss", "batch_loss")}} for s in steps]


def token_labels(seq: torch.Tensor) -> list[str]:
    """Axis labels of the model inputs of a sequence (digits, BOS, SEP, EOS)."""
    return [NAMES.get(t, str(t)) for t in seq[:-1].tolist()]


def prediction_rows(test: torch.Tensor, pred: torch.Tensor) -> list[dict]:
    """One row per test sequence: prompt digits, true and predicted answer, whether all match."""
    return [{"index": i, "prompt": " ".join(map(str, test[i, 1:PROMPT_LEN - 1].tolist())),
             "truth": " ".join(map(str, test[i, PROMPT_LEN:].tolist())),
             "predicted": " ".join(map(str, pred[i].tolist())),
             "correct": int(bool((pred[i] == test[i, PROMPT_LEN:]).all()))}
            for i in range(len(test))]


@dataclass
class ReversalResult:
    metrics: dict  # metrics/reversal.json: config, then one section per variant
    histories: dict[str, list[dict]]  # per variant: step, train_loss, val_loss, batch_loss
    predictions: dict[str, list[dict]]  # per variant: prediction_rows on the test set
    maps: dict[str, torch.Tensor]  # per variant: (n_layer, n_head, T, T) on test sample sample_index
    labels: list[str]  # the maps' axis labels
    checkpoints: dict[str, Path]  # per variant: its model.pt in the run store
    env: dict  # metrics/env/reversal.json

    boxes = list(zip(ALIGN_QUERIES, ALIGN_KEYS))  # the reverse-alignment cells of the maps

    @property
    def losses(self) -> list[dict]:
        return wide_losses(self.histories)

    def lines(self) -> list[str]:
        return [f"{name}: digit_acc {m['digit_acc']:.4f} seq_acc {m['seq_acc']:.4f} "
                f"align_l0 {m['align_l0']:.4f} align_l1 {m['align_l1']:.4f} "
                f"prefix_change off {m['prefix_change_mask_off']:.6f} on {m['prefix_change_mask_on']:.1g}"
                for name, m in ((name, self.metrics[name]) for name in self.histories)]


def results(cfg: ReversalConfig, runs: Sequence) -> ReversalResult:
    """Every variant's trained run (finished attnrepro.run.engine.RunRecords, in cfg.variants order)
    evaluated on the test set (evaluate_variant)."""
    splits = make_splits(cfg.n_train, cfg.n_val, cfg.n_test, cfg.data_seed)
    test = splits["test"]
    metrics, histories, preds, maps, paths = {}, {}, {}, {}, {}
    for name, rec in zip(cfg.variants, runs):
        paths[name] = rec.path / "model.pt"
        model = load_checkpoint(paths[name], f"reversal run {name}")
        histories[name] = loss_rows(rec.read("evals.json"), rec.read("history.json"))
        metrics[name], pred, maps[name] = evaluate_variant(model, splits, histories[name], cfg)
        preds[name] = prediction_rows(test, pred)
    config = {"n_train": cfg.n_train, "n_val": cfg.n_val, "n_test": cfg.n_test, "steps": cfg.steps,
              "batch_size": cfg.batch_size, "lr": cfg.lr}
    return ReversalResult({"config": config, **metrics}, histories, preds, maps, token_labels(test[cfg.sample_index]),
                          paths, stage_environment("cpu", runs))


def run(cfg: ReversalConfig, engine: EngineConfig) -> ReversalResult:
    """The variants' runs from the store (the missing ones trained first, in parallel), then their results."""
    records = run_sweep("reversal", [run_spec(cfg, name) for name in cfg.variants], {}, engine)
    require_ok(records, "reversal")
    return results(cfg, records)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    models = {k: v for k, v in (metrics or {}).items() if isinstance(v, dict) and "digit_acc" in v}
    if not models:
        return ""
    return ("; ".join(f"{k}: digit accuracy {100 * v['digit_acc']:.1f}%, sequences {100 * v.get('seq_acc', 0):.1f}%, "
                      f"layer-0 reverse alignment {100 * v.get('align_l0', 0):.1f}%" for k, v in sorted(models.items()))
            + (f". Without the mask, altering future answer digits changes prefix logits by up to "
               f"{models['no_mask']['prefix_change_mask_off']:.3g} (with the mask: "
               f"{models['no_mask'].get('prefix_change_mask_on', 0):g})." if "prefix_change_mask_off" in
               models.get("no_mask", {}) else "."))
