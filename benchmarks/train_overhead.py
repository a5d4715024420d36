"""Benchmark: cost of the training diagnostics, and of a no-op `dvc repro`.

Times the small model's training step in the one training loop (`training.train_loop`)
with attention diagnostics every `--diag-every` steps against the same loop with none.
The two are run in alternating chunks so background load hits both alike. Prints
figures; asserts nothing (machines here are shared and noisy).

    python benchmarks/train_overhead.py [--steps 200] [--chunks 4] [--dvc]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch

from attnrepro.config import from_dict, read_params
from attnrepro.model import ModelConfig, TinyGPT
from attnrepro.training import BatchSampler, OptimConfig, train_loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="steps per chunk")
    ap.add_argument("--chunks", type=int, default=4, help="alternating chunks per variant")
    ap.add_argument("--diag-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dvc", action="store_true", help="also time a no-op `dvc repro` (3 runs)")
    args = ap.parse_args()
    if args.dvc:
        # a no-op only when nothing is stale: otherwise `dvc repro` would run stages (or hours of sweeps)
        status = subprocess.run(["dvc", "status", "--quiet"], capture_output=True, text=True)
        if status.returncode != 0:
            raise SystemExit("error: `dvc status` says some stages are stale, so `dvc repro` is no no-op here "
                             "(see `dvc status`; rerun them first, or leave out --dvc)")
    torch.set_num_threads(args.threads)

    cfg = OptimConfig(steps=args.steps, batch_size=32, optimizer="adamw", lr=3e-3, betas=[0.9, 0.95],
                      weight_decay=0.1, decay="2d", schedule="cosine", warmup=100, min_lr_ratio=0.1, grad_clip=1.0)
    tokens = torch.randint(2, 1200, (200_000,), generator=torch.Generator().manual_seed(0))
    small = from_dict(ModelConfig, {**read_params(Path(__file__).resolve().parents[1] / "params.yaml")["train"]["models"]["small"], "vocab_size": 1200}, prefix="small")
    times = {"bare": [], "diagnostics": []}
    for chunk in range(args.chunks):
        for name in ("bare", "diagnostics"):
            torch.manual_seed(0)
            model = TinyGPT(small)
            sampler = BatchSampler(tokens, 64, 32, seed=chunk)
            diag = set(range(0, cfg.steps, args.diag_every)) if name == "diagnostics" else set()
            seconds = train_loop(model, sampler, cfg, diag_steps=diag).seconds
            times[name].append(1000 * seconds / cfg.steps)
    bare, diag = statistics.median(times["bare"]), statistics.median(times["diagnostics"])
    print(f"small model, batch 32 x 64, {args.threads} threads, {args.chunks} x {args.steps} steps each")
    print(f"no diagnostics:     {bare:7.2f} ms/step  (chunks: {', '.join(f'{t:.1f}' for t in times['bare'])})")
    print(f"with diagnostics:   {diag:7.2f} ms/step  (chunks: {', '.join(f'{t:.1f}' for t in times['diagnostics'])})")
    print(f"ratio:              {diag / bare:7.3f}  (goal <= 1.10)")

    if args.dvc:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(["dvc", "repro"], check=True, capture_output=True)
            runs.append(time.perf_counter() - t0)
        print(f"no-op dvc repro:    {min(runs):7.2f} s best of 3 ({', '.join(f'{r:.2f}' for r in runs)}; goal <= 3 s)")


if __name__ == "__main__":
    main()
