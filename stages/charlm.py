"""DVC stage `charlm`: the tiny character-level LM companion experiment (spec §8).

Trains TinyGPT (the document's configuration, 210,761 parameters) on the eight
sentences of ../seeds/003 §4, records train/val loss every eval_every steps,
writes greedy and sampled continuations of the prompt and the attention maps of
the chosen blocks on attn_text.

Writes metrics/charlm.json, metrics/env/charlm.json, plots/charlm/ (losses.csv,
steps.csv, loss_curve.png, samples.txt, attention_block<N>.png) and
data/charlm/model.pt.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from attnrepro.charlm import (CharLMConfig, CharVocab, continuations, exact_lines, join_text, read_sentences,
                              run_spec, split_stream, verbatim_fraction)
from attnrepro.config import load_section, read_params, run_stage
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.figures import attention_grid, cjk_font, loss_curves
from attnrepro.io import atomic_dir, write_csv, write_json, write_text
from attnrepro.model import load_checkpoint
from attnrepro.measure.probes import sequence_maps
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep

PLOTS = Path("plots/charlm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    cfg = load_section(CharLMConfig, "charlm", args.params)
    setup_determinism(cfg.threads, "cpu")

    sentences = read_sentences(cfg.text_file)
    text = join_text(sentences)
    vocab = CharVocab(text)
    train_ids, val_ids = split_stream(text, cfg.repeat, cfg.val_fraction, vocab)
    vocab.encode(cfg.prompt)  # fail early on a character outside the vocabulary
    attn_ids = vocab.encode(cfg.attn_text)

    spec, inputs = run_spec(cfg, Path(cfg.text_file).read_bytes())
    (rec,) = run_sweep("charlm", [spec], inputs, engine_config(read_params(args.params), args.scheduler, args.workers))
    require_ok([rec], "charlm")
    model = load_checkpoint(rec.path / "model.pt", "charlm run")
    evals, steps = rec.read("evals.json"), [{"step": r["step"], "loss": r["loss"]} for r in rec.read("history.json")]
    samples = continuations(model, vocab, cfg)
    maps = sequence_maps(model, attn_ids)
    future = torch.ones(len(attn_ids), len(attn_ids), dtype=torch.bool).triu(1)

    first, last = evals[0], evals[-1]
    metrics = {
        "params": model.num_params(),
        "vocab_size": len(vocab),
        "text_chars": len(text),
        "sentences": len(sentences),
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "initial_loss": steps[0]["loss"],  # first training batch, before any update
        "train_loss_step0": first["train_loss"],
        "val_loss_step0": first["val_loss"],
        "train_loss_final": last["train_loss"],
        "val_loss_final": last["val_loss"],
        "final_step": last["step"],
        "greedy_verbatim_frac": verbatim_fraction(samples["greedy"], text * cfg.repeat),
        "sampled_verbatim_frac": verbatim_fraction(samples["sampled"], text * cfg.repeat),
        "greedy_exact_lines_frac": exact_lines(samples["greedy"], sentences),
        "sampled_exact_lines_frac": exact_lines(samples["sampled"], sentences),
        "attn_future_weight_max": maps[:, :, future].max().item(),
    }
    for r in evals:
        metrics[f"train_loss_step{r['step']}"] = r["train_loss"]
        metrics[f"val_loss_step{r['step']}"] = r["val_loss"]

    with atomic_dir(Path("data/charlm")) as tmp:
        shutil.copyfile(rec.path / "model.pt", tmp / "model.pt")
    pdir = PLOTS  # files registered one by one in dvc.yaml (samples.txt is not a plot)
    write_csv(pdir / "losses.csv", evals, ["step", "train_loss", "val_loss"])
    write_csv(pdir / "steps.csv", steps, ["step", "loss"])
    loss_curves(pdir / "loss_curve.png", {"charlm": evals}, "char LM: fixed-batch loss")
    write_text(pdir / "samples.txt",
               f"# prompt {cfg.prompt!r}, {cfg.gen_tokens} new tokens\n"
               f"## greedy\n{samples['greedy']}\n"
               f"## sampled (temperature {cfg.sample_temperature}, seed {cfg.sample_seed})\n"
               f"{samples['sampled']}\n")
    font = cjk_font()
    labels = list(cfg.attn_text)
    for layer in cfg.attn_layers:
        attention_grid(pdir / f"attention_block{layer + 1}.png", maps[layer:layer + 1].numpy(), labels,
                       f"char LM block {layer + 1} on {cfg.attn_text if font else 'attn_text'}",
                       [f"block {layer + 1}"], font=font)
    write_json("metrics/charlm.json", metrics)
    write_json("metrics/env/charlm.json", stage_environment("cpu", [rec.read("env.json")]))
    print(f"charlm: {metrics['params']} params, vocab {metrics['vocab_size']}, loss "
          f"{metrics['initial_loss']:.4f}; train/val {first['train_loss']:.4f}/{first['val_loss']:.4f} -> "
          f"{last['train_loss']:.4f}/{last['val_loss']:.4f}; greedy verbatim "
          f"{metrics['greedy_verbatim_frac']:.2f}{'' if font else ' (no CJK font: indices on plots)'}")


if __name__ == "__main__":
    run_stage(main)
