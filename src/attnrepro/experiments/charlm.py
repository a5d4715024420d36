"""The `charlm` stage: the companion char LM (../seeds/003), one run from the run engine, measured.

The document's model is a ModelConfig of the project's TinyGPT: vocab 73, block 32,
d 64, 4 heads of 16, 4 Pre-LN blocks, q/k/v without bias, output projection with
bias, FFN 4x with ReLU, dropout 0.1 (attention weights and both residual branches,
as in the document), untied head with bias, PyTorch's default initialization:
210,761 parameters.

Text: the eight sentences joined by newlines with a leading and trailing newline
(162 characters, as the document reports), repeated `repeat` times; the last
`val_fraction` of the token stream is validation. Vocabulary: sorted distinct
characters (73). The document does not state the repeat count, the split, the
optimizer or how its losses were estimated; our choices are recorded in params.
What one run of it does (its data, evaluation and measurements) is the task
attnrepro.run.task_charlm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from attnrepro.config import UserError, require, require_positive
from attnrepro.envinfo import stage_environment
from attnrepro.measure.probes import sequence_maps
from attnrepro.model.transformer import ModelConfig, TinyGPT, generate, load_checkpoint
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.run.loop import OptimConfig
from attnrepro.run.spec import RunSpec
from attnrepro.run.task_charlm import CharLMData, CharVocab, join_text, parse_sentences, split_stream


@dataclass
class CharLMConfig:
    """params `charlm` (no defaults: params.yaml is the only source of values; the document's
    choices and ours are commented there)."""

    text_file: str
    repeat: int  # unstated in the source ("repeated many times")
    val_fraction: float  # unstated; the last share of the repeated stream
    seed: int  # model init and dropout
    batch_seed: int  # training batch order
    eval_seed: int  # the fixed train/val evaluation batches
    threads: int
    block_size: int
    batch_size: int
    d_model: int
    n_head: int
    n_layer: int
    mlp_ratio: int
    dropout: float
    lr: float
    weight_decay: float
    steps: int
    eval_every: int
    eval_batches: int  # per split, fixed batches
    prompt: str
    gen_tokens: int
    sample_temperature: float
    sample_seed: int
    attn_text: str
    attn_layers: tuple[int, ...]  # blocks whose attention maps are drawn

    def validate(self, prefix: str = "charlm") -> None:
        require_positive(self, ("repeat", "threads", "block_size", "batch_size", "d_model", "n_head", "n_layer",
                                "mlp_ratio", "steps", "eval_every", "eval_batches", "gen_tokens"), prefix)
        require(0 < self.val_fraction < 1, f"{prefix}.val_fraction", self.val_fraction, "in (0, 1)")
        require(0 <= self.dropout < 1, f"{prefix}.dropout", self.dropout, "in [0, 1)")
        require(math.isfinite(self.lr) and self.lr > 0, f"{prefix}.lr", self.lr, "a finite positive number")
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0, f"{prefix}.weight_decay",
                self.weight_decay, "a finite number >= 0")
        require(math.isfinite(self.sample_temperature) and self.sample_temperature > 0, f"{prefix}.sample_temperature",
                self.sample_temperature, "a finite positive number (greedy decoding is always written too)")
        require(self.d_model % self.n_head == 0, f"{prefix}.d_model", self.d_model,
                f"a multiple of n_head ({self.n_head})")
        require(0 < len(self.prompt) <= self.block_size, f"{prefix}.prompt", self.prompt,
                f"1 to block_size ({self.block_size}) characters")
        require(0 < len(self.attn_text) <= self.block_size, f"{prefix}.attn_text", self.attn_text,
                f"1 to block_size ({self.block_size}) characters")
        for i, layer in enumerate(self.attn_layers):
            require(0 <= layer < self.n_layer, f"{prefix}.attn_layers[{i}]", layer,
                    f"a layer index in [0, {self.n_layer})")

    def model_config(self, vocab_size: Optional[int]) -> ModelConfig:
        """The document's model (see the module docstring): separate q/k/v without bias, an output
        projection with bias, ReLU FFN, dropout, an untied head with bias, PyTorch's default init."""
        return ModelConfig(
            vocab_size=vocab_size, block_size=self.block_size, d_model=self.d_model, n_head=self.n_head, d_qk=None,
            n_layer=self.n_layer, scaled=True, bug="correct", causal=True, impl="manual", fused_qkv=False,
            qkv_bias=False, proj_bias=True, mlp_ratio=self.mlp_ratio, activation="relu", dropout=self.dropout,
            tie_weights=False, head_bias=True, init_std=0.02, init="torch", qk_norm="none", qk_gain_init=None)


def read_sentences(path) -> list[str]:
    """Non-empty, non-comment lines of the sentence file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"charlm.text_file: {path} not found")
    try:
        return parse_sentences(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"charlm.text_file: {path} is not UTF-8 text (byte {e.start})") from None


def run_spec(cfg: CharLMConfig, text: bytes) -> tuple[RunSpec, dict[str, bytes]]:
    """The run and its input: AdamW on all parameters at a constant lr, no clipping, no schedule
    (the document uses neither); train/val loss on fixed batches every eval_every steps and at the end."""
    optim = OptimConfig(steps=cfg.steps, batch_size=cfg.batch_size, optimizer="adamw", lr=cfg.lr,
                        betas=[0.9, 0.999], weight_decay=cfg.weight_decay, decay="all", schedule="constant",
                        warmup=0, min_lr_ratio=1.0, grad_clip=None)
    spec = RunSpec(task="charlm", model=cfg.model_config(vocab_size=None), optim=optim, seed=cfg.seed,
                   batch_seed=cfg.batch_seed,
                   data=CharLMData(repeat=cfg.repeat, val_fraction=cfg.val_fraction, eval_batches=cfg.eval_batches,
                                   eval_seed=cfg.eval_seed),
                   diag_every=0, diag_steps=(), eval_every=cfg.eval_every, eval_final=True, measure=None,
                   threads=cfg.threads, device="cpu", label="charlm")
    return spec, {"text": text}


def continuations(model: TinyGPT, vocab: CharVocab, cfg: CharLMConfig) -> dict[str, str]:
    """Greedy and seeded sampled continuations of the prompt (prompt included)."""
    model.eval()
    prompt = vocab.encode(cfg.prompt)[None]
    greedy = generate(model, prompt, cfg.gen_tokens, temperature=0)
    gen = torch.Generator().manual_seed(cfg.sample_seed)
    sampled = generate(model, prompt, cfg.gen_tokens, temperature=cfg.sample_temperature, generator=gen)
    return {"greedy": vocab.decode(greedy[0]), "sampled": vocab.decode(sampled[0])}


def verbatim_fraction(generated: str, text: str) -> float:
    """Longest prefix of `generated` occurring verbatim in `text`, as a fraction of its length."""
    lo, hi = 0, len(generated)
    while lo < hi:  # substring-ness of prefixes is monotone: binary search
        mid = (lo + hi + 1) // 2
        if generated[:mid] in text:
            lo = mid
        else:
            hi = mid - 1
    return lo / len(generated)


def exact_lines(generated: str, sentences: list[str]) -> float:
    """Fraction of the complete generated lines (all but the unfinished last) that are training sentences."""
    lines = generated.split("\n")[:-1]
    lines = [ln for ln in lines if ln]
    if not lines:
        return 0.0
    known = set(sentences)
    return sum(ln in known for ln in lines) / len(lines)


# ---------------------------------------------------------------- the stage's experiment

@dataclass
class CharText:
    """The experiment's text and token streams, read and checked before any run is trained."""

    sentences: list[str]
    text: str
    vocab: CharVocab
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    attn_ids: torch.Tensor


def char_text(cfg: CharLMConfig) -> CharText:
    """The sentence file as the run sees it; a prompt or attn_text character outside the vocabulary
    is an error here, before training."""
    sentences = read_sentences(cfg.text_file)
    text = join_text(sentences)
    vocab = CharVocab(text)
    train_ids, val_ids = split_stream(text, cfg.repeat, cfg.val_fraction, vocab)
    vocab.encode(cfg.prompt)  # fail early on a character outside the vocabulary
    return CharText(sentences, text, vocab, train_ids, val_ids, vocab.encode(cfg.attn_text))


@dataclass
class CharLMResult:
    metrics: dict  # metrics/charlm.json
    evals: list[dict]  # step, train_loss, val_loss (plots/charlm/losses.csv)
    steps: list[dict]  # step, loss: every training batch (plots/charlm/steps.csv)
    samples: str  # plots/charlm/samples.txt
    maps: torch.Tensor  # (n_layer, n_head, T, T) attention of the trained model on attn_text
    checkpoint: Path  # the run's model.pt in the run store
    env: dict  # metrics/env/charlm.json

    def lines(self, cjk_font: bool) -> list[str]:
        m, first, last = self.metrics, self.evals[0], self.evals[-1]
        return [f"charlm: {m['params']} params, vocab {m['vocab_size']}, loss "
                f"{m['initial_loss']:.4f}; train/val {first['train_loss']:.4f}/{first['val_loss']:.4f} -> "
                f"{last['train_loss']:.4f}/{last['val_loss']:.4f}; greedy verbatim "
                f"{m['greedy_verbatim_frac']:.2f}{'' if cjk_font else ' (no CJK font: indices on plots)'}"]


def results(cfg: CharLMConfig, data: CharText, run) -> CharLMResult:
    """The trained run (a finished attnrepro.run.engine.RunRecord) measured: losses, continuations of the
    prompt and how verbatim they are, attention maps on attn_text."""
    model = load_checkpoint(run.path / "model.pt", "charlm run")
    evals, steps = run.read("evals.json"), [{"step": r["step"], "loss": r["loss"]} for r in run.read("history.json")]
    samples = continuations(model, data.vocab, cfg)
    maps = sequence_maps(model, data.attn_ids)
    future = torch.ones(len(data.attn_ids), len(data.attn_ids), dtype=torch.bool).triu(1)
    first, last = evals[0], evals[-1]
    text = data.text
    metrics = {
        "params": model.num_params(),
        "vocab_size": len(data.vocab),
        "text_chars": len(text),
        "sentences": len(data.sentences),
        "train_tokens": len(data.train_ids),
        "val_tokens": len(data.val_ids),
        "initial_loss": steps[0]["loss"],  # first training batch, before any update
        "train_loss_step0": first["train_loss"],
        "val_loss_step0": first["val_loss"],
        "train_loss_final": last["train_loss"],
        "val_loss_final": last["val_loss"],
        "final_step": last["step"],
        "greedy_verbatim_frac": verbatim_fraction(samples["greedy"], text * cfg.repeat),
        "sampled_verbatim_frac": verbatim_fraction(samples["sampled"], text * cfg.repeat),
        "greedy_exact_lines_frac": exact_lines(samples["greedy"], data.sentences),
        "sampled_exact_lines_frac": exact_lines(samples["sampled"], data.sentences),
        "attn_future_weight_max": maps[:, :, future].max().item(),
    }
    for r in evals:
        metrics[f"train_loss_step{r['step']}"] = r["train_loss"]
        metrics[f"val_loss_step{r['step']}"] = r["val_loss"]
    samples_txt = (f"# prompt {cfg.prompt!r}, {cfg.gen_tokens} new tokens\n"
                   f"## greedy\n{samples['greedy']}\n"
                   f"## sampled (temperature {cfg.sample_temperature}, seed {cfg.sample_seed})\n"
                   f"{samples['sampled']}\n")
    return CharLMResult(metrics, evals, steps, samples_txt, maps, run.path / "model.pt",
                        stage_environment("cpu", [run]))


def run(cfg: CharLMConfig, engine: EngineConfig) -> CharLMResult:
    """The text checked, the run from the store (trained first when missing), then its results."""
    data = char_text(cfg)
    spec, inputs = run_spec(cfg, Path(cfg.text_file).read_bytes())
    (rec,) = run_sweep("charlm", [spec], inputs, engine)
    require_ok([rec], "charlm")
    return results(cfg, data, rec)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    if not metrics or "train_loss_final" not in metrics:
        return ""
    return (f"{metrics.get('params', 0):,} parameters; the loss falls from {metrics.get('initial_loss', float('nan')):.4f} to "
            f"{metrics['train_loss_final']:.4f} (validation {metrics.get('val_loss_final', float('nan')):.4f}) in "
            f"{metrics.get('final_step')} steps; greedy continuations reproduce "
            f"{100 * metrics.get('greedy_verbatim_frac', 0):.0f}% of the training text verbatim: it memorises its "
            f"{metrics.get('sentences')} sentences.")
