"""DVC stage `failures`: inject the four silent bugs of §1.11.7 and record their symptoms.

The small config is trained for `failures.steps` steps per variant (correct and each
attention.BUGS entry) with the same seed, the same initialization and the same batches;
the only difference is ModelConfig(bug=...). Symptoms are measured on fixed validation
batches after training. `entropy` is the normalized entropy of the row-renormalized weights (p / row sum) over
the keys the row can actually weight (all keys for mask_zero, whose mask leaks; the
causal count otherwise), so it is in [0, 1] for every variant (attnrepro.probes);
`entropy_raw` keeps the naive value. The health checks of attnrepro.health run on the attention
function with each variant's switches; which of them fire is the check-by-variant matrix.

The symptom table comes from `failures.seed`. To show how much a 300-step symptom
moves with the seed, every variant is trained again with each of `failures.spread_seeds`
(each seed drives both the initialization and the batch order; the validation batches
stay fixed): <variant>.spread.<symptom>_min/_max span all seeds, the reference included.

Writes metrics/failures.json (<variant>.loss_final, .entropy, .max_row_sum, ...,
<variant>.check_<name> = 1 when the check fires, <variant>.spread.*),
plots/failures/<variant>.csv (per step), plots/failures/seeds.csv (one row per
variant and seed), plots/failures/checks.csv and plots/failures/training.png.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnrepro.attention import BUGS
from attnrepro.config import from_dict, load_section, require, require_positive, run_stage
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.health import INTENDED, Probe, check_matrix
from attnrepro.io import write_csv, write_json
from attnrepro.model import ModelConfig, TinyGPT
from attnrepro.probe_plots import failures_figure
from attnrepro.probes import weight_symptoms
from attnrepro.runtime import progress, resolve_device
from attnrepro.training import BatchSampler, OptimConfig, fixed_batches, load_tokens, train

CORPUS = Path("data/corpus")


@dataclass
class FailuresConfig(OptimConfig):
    seed: int = 20261014
    threads: int = 2
    device: str = "cpu"
    val_batches: int = 8
    val_seed: int = 1234
    loss_window: int = 20
    model: dict = field(default_factory=dict)  # ModelConfig fields (vocab_size comes from the corpus)
    variants: list[str] = field(default_factory=lambda: list(BUGS))
    spread_seeds: list[int] = field(default_factory=list)  # extra seeds for the seed spread; may be empty

    def validate(self, prefix: str = "failures") -> None:
        super().validate(prefix)
        require_positive(self, ("threads", "val_batches", "loss_window"), prefix)
        require(len(self.variants) > 0 and len(set(self.variants)) == len(self.variants), f"{prefix}.variants",
                self.variants, "a non-empty list without repeats")
        for v in self.variants:
            require(v in BUGS, f"{prefix}.variants", v, "entries from " + ", ".join(BUGS))
        seeds = [self.seed, *self.spread_seeds]
        require(len(set(seeds)) == len(seeds), f"{prefix}.spread_seeds", self.spread_seeds,
                "seeds without repeats, other than failures.seed")
        for key in ("bug", "vocab_size"):
            require(key not in self.model, f"{prefix}.model.{key}", self.model.get(key),
                    "not set here (bug comes from variants, vocab_size from the corpus)")
        self.model_config("correct", vocab_size=2)  # validates the preset early

    def model_config(self, bug: str, vocab_size: int) -> ModelConfig:
        return from_dict(ModelConfig, {**self.model, "vocab_size": vocab_size, "bug": bug},
                         prefix="failures.model")


# the symptoms whose seed-to-seed range is recorded
SPREAD = ("loss_final", "grad_norm_final", "entropy", "diag_weight")


def run_variant(cfg: FailuresConfig, bug: str, seed: int, vocab: int, train_ids, val,
                device: str) -> tuple[dict, list]:
    mcfg = cfg.model_config(bug, vocab)
    torch.manual_seed(seed)
    model = TinyGPT(mcfg).to(device)
    sampler = BatchSampler(train_ids, mcfg.block_size, cfg.batch_size, seed=seed)
    label = f"failures {bug}" if seed == cfg.seed else f"failures {bug} (seed {seed})"
    bar = progress(cfg.steps, label)

    def tick(step: int, loss: float) -> None:
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    run = train(model, sampler, cfg, diag_steps=set(), progress=tick)
    bar.close()
    losses = [r["loss"] for r in run.history]
    window = losses[-cfg.loss_window:]
    out = {
        "loss_start": losses[0],
        "loss_final": sum(window) / len(window),
        "loss_last_step": losses[-1],
        "grad_norm_final": run.history[-1]["grad_norm"],
        **weight_symptoms(model, val),
    }
    return out, run.history


def spread(rows: list[dict]) -> dict:
    """{<symptom>_min, <symptom>_max, seeds} over one variant's per-seed rows."""
    out: dict = {"seeds": len(rows)}
    for k in SPREAD:
        vals = [r[k] for r in rows]
        out[f"{k}_min"], out[f"{k}_max"] = min(vals), max(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = load_section(FailuresConfig, "failures", args.params)
    device = resolve_device(cfg.device, "failures.device")
    setup_determinism(cfg.threads, device)

    vocab = len(json.loads((CORPUS / "vocab.json").read_text(encoding="utf-8")))
    train_ids = load_tokens(CORPUS / "train.npy").to(device)
    val_ids = load_tokens(CORPUS / "val.npy").to(device)
    block = cfg.model_config("correct", vocab).block_size
    val = fixed_batches(val_ids, block, cfg.batch_size, cfg.val_batches, seed=cfg.val_seed)

    d_head = cfg.model_config("correct", vocab).d_head
    matrix = check_matrix(cfg.variants, Probe(d_head=d_head))

    metrics, histories, check_rows = {}, {}, []
    for bug in cfg.variants:
        m, hist = run_variant(cfg, bug, cfg.seed, vocab, train_ids, val, device)
        histories[bug] = hist
        for name, res in matrix[bug].items():
            m[name] = int(not res.passed)  # 1 = the check fires
            m[f"{name}_value"] = res.measured
            check_rows.append({"variant": bug, "check": name, "fires": int(not res.passed),
                               "measured": res.measured, "threshold": res.threshold, "message": res.message})
        fired = [n for n, r in matrix[bug].items() if not r.passed]
        m["checks_fired"] = len(fired)
        m["caught_by_intended"] = int(INTENDED.get(bug) in fired) if bug != "correct" else int(not fired)
        metrics[bug] = m
        write_csv(Path("plots/failures") / f"{bug}.csv", hist)
        print(f"{bug:20s} loss {m['loss_start']:.3f} -> {m['loss_final']:.3f}  grad {m['grad_norm_final']:.3f}  "
              f"entropy {m['entropy']:.4f}  diag {m['diag_weight']:.3f}  max row sum {m['max_row_sum']:.4f}  "
              f"checks fired: {', '.join(fired) or 'none'}")

    seed_rows = [{"variant": bug, "seed": cfg.seed, **{k: metrics[bug][k] for k in SPREAD}} for bug in cfg.variants]
    for seed in cfg.spread_seeds:
        for bug in cfg.variants:
            m, _ = run_variant(cfg, bug, seed, vocab, train_ids, val, device)
            seed_rows.append({"variant": bug, "seed": seed, **{k: m[k] for k in SPREAD}})
    for bug in cfg.variants:
        metrics[bug]["spread"] = spread([r for r in seed_rows if r["variant"] == bug])
        sp = metrics[bug]["spread"]
        print(f"{bug:20s} over {sp['seeds']} seeds: loss {sp['loss_final_min']:.3f}-{sp['loss_final_max']:.3f}  "
              f"entropy {sp['entropy_min']:.4f}-{sp['entropy_max']:.4f}  "
              f"diag {sp['diag_weight_min']:.3f}-{sp['diag_weight_max']:.3f}")

    write_json("metrics/failures.json", metrics)
    write_csv("plots/failures/seeds.csv", seed_rows)
    write_json("metrics/env/failures.json", environment(device))
    write_csv("plots/failures/checks.csv", check_rows)
    failures_figure(histories, Path("plots/failures/training.png"))


if __name__ == "__main__":
    run_stage(main)
