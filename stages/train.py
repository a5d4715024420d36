"""DVC stage `train@<variant>`: one variant of the controlled sqrt(d_k) comparison.

Every variant uses the same seed, the same initialization draw (per model shape)
and the same batches in the same order; the only differences are the model
shape and the `scaled` switch. Writes data/train/<variant>/ (checkpoint,
summary.json, sample.txt, timing.json) and plots/train/<variant>.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnrepro.config import ConfigError, from_dict, load_section, require, require_positive, run_stage
from attnrepro.corpus import Tokenizer
from attnrepro.envinfo import environment, setup_determinism
from attnrepro.io import atomic_dir, dumps_json, write_csv
from attnrepro.model import ModelConfig, TinyGPT, generate
from attnrepro.runtime import progress, resolve_device
from attnrepro.training import BatchSampler, OptimConfig, evaluate, fixed_batches, load_tokens, qk_scale, train

CORPUS = Path("data/corpus")


@dataclass
class Variant:
    model: str
    scaled: bool


@dataclass
class TrainConfig(OptimConfig):
    seed: int = 20261014
    threads: int = 2
    device: str = "cpu"
    diag_every: int = 10
    diag_steps: list[int] = field(default_factory=list)  # recorded in addition to every diag_every
    val_every: int = 100
    val_batches: int = 8
    val_seed: int = 1234
    loss_window: int = 20  # loss_final = mean training loss of the last loss_window steps
    sample_prompt: str = "秦川雄帝宅，"
    sample_tokens: int = 100
    sample_temperature: float = 0.8
    sample_seed: int = 0
    models: dict[str, dict] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)

    def validate(self, prefix: str = "train") -> None:
        super().validate(prefix)
        require_positive(self, ("threads", "diag_every", "val_every", "val_batches", "loss_window", "sample_tokens"),
                         prefix)
        for name, v in self.variants.items():
            require(v.model in self.models, f"{prefix}.variants.{name}.model", v.model,
                    "one of " + ", ".join(sorted(self.models)))
            self.model_config(name, vocab_size=2)  # validates the model preset early

    def model_config(self, variant: str, vocab_size: int) -> ModelConfig:
        v = self.variants[variant]
        spec = {**self.models[v.model], "vocab_size": vocab_size, "scaled": v.scaled}
        return from_dict(ModelConfig, spec, prefix=f"train.models.{v.model}")

    def diag_schedule(self) -> set[int]:
        return set(range(0, self.steps, self.diag_every)) | {s for s in self.diag_steps if s < self.steps}


def summarize(cfg: TrainConfig, history: list[dict], final: dict, scale_init: dict, scale_final: dict,
              n_params: int) -> dict:
    losses = [r["loss"] for r in history]
    out = {
        "params": n_params,
        "loss_start": losses[0],
        "loss_final": sum(losses[-cfg.loss_window:]) / len(losses[-cfg.loss_window:]),
        "loss_last_step": losses[-1],
        "grad_norm_final": history[-1]["grad_norm"],
        "val_loss_final": final["loss"],
    }
    # layer-0 values under the contract's names, every layer with an _l<i> suffix
    for key in ("entropy", "logit_std", "jacobian_fro"):
        out[f"{key}_final"] = final[f"{key}_l0"]
        for k, v in final.items():
            if k.startswith(key + "_l"):
                out[f"{key}_final_{k.rsplit('_', 1)[1]}"] = v
    for step in sorted(cfg.diag_steps):
        if step < len(history):
            for key in ("entropy", "logit_std", "jacobian_fro"):
                out[f"{key}_step{step}"] = history[step][f"{key}_l0"]
    for k, v in scale_init.items():
        out[f"init_{k}"] = v
    for k, v in scale_final.items():
        out[f"trained_{k}"] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", required=True, help="a key of train.variants in params.yaml")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = load_section(TrainConfig, "train", args.params)
    if args.variant not in cfg.variants:
        raise ConfigError(f"--variant: got {args.variant!r}, expected one of {', '.join(cfg.variants)}")
    device = resolve_device(cfg.device, "train.device")
    setup_determinism(cfg.threads, device)

    itos = json.loads((CORPUS / "vocab.json").read_text(encoding="utf-8"))
    tok = Tokenizer(itos)
    train_ids = load_tokens(CORPUS / "train.npy").to(device)
    val_ids = load_tokens(CORPUS / "val.npy").to(device)
    mcfg = cfg.model_config(args.variant, len(itos))

    torch.manual_seed(cfg.seed)
    model = TinyGPT(mcfg).to(device)
    sampler = BatchSampler(train_ids, mcfg.block_size, cfg.batch_size, seed=cfg.seed)
    val = fixed_batches(val_ids, mcfg.block_size, cfg.batch_size, cfg.val_batches, seed=cfg.val_seed)
    scale_init = qk_scale(model, val[0][0])

    bar = progress(cfg.steps, f"train {args.variant}")

    def tick(step: int, loss: float) -> None:
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    run = train(model, sampler, cfg, diag_steps=cfg.diag_schedule(), val_batches=val,
                val_every=cfg.val_every, progress=tick)
    bar.close()
    final = evaluate(model, val)
    summary = summarize(cfg, run.history, final, scale_init, qk_scale(model, val[0][0]), model.num_params())

    prompt = torch.from_numpy(tok.encode(cfg.sample_prompt).astype("int64"))[None].to(device)
    gen = torch.Generator(device=device).manual_seed(cfg.sample_seed)
    model.eval()
    sample = tok.decode(generate(model, prompt, cfg.sample_tokens, temperature=cfg.sample_temperature,
                                 generator=gen)[0].tolist())

    with atomic_dir(Path("data/train") / args.variant) as tmp:
        torch.save({"model_config": dataclasses.asdict(mcfg), "state_dict": model.state_dict()},
                   tmp / "model.pt")
        (tmp / "summary.json").write_text(dumps_json(summary), encoding="utf-8")
        (tmp / "sample.txt").write_text(sample + "\n", encoding="utf-8")
        (tmp / "env.json").write_text(dumps_json(environment(device)), encoding="utf-8")
        (tmp / "timing.json").write_text(dumps_json({
            "seconds": run.seconds, "ms_per_step": 1000 * run.seconds / cfg.steps}), encoding="utf-8")
    write_csv(Path("plots/train") / f"{args.variant}.csv", run.history)
    print(f"{args.variant}: loss {summary['loss_start']:.3f} -> {summary['loss_final']:.3f}, "
          f"val {summary['val_loss_final']:.3f}, entropy {summary['entropy_final']:.4f}, "
          f"{run.seconds:.0f} s")


if __name__ == "__main__":
    run_stage(main)
