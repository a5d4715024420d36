"""Benchmark: cost of the training diagnostics, and of a no-op `dvc repro`.

Times the small model's training step inside `training.train` (per-step logging,
attention diagnostics every `--diag-every` steps) against a bare loop with the same
model, optimizer and batches but no logging or diagnostics. The two are run in
alternating chunks so background load hits both alike. Prints figures; asserts
nothing (machines here are shared and noisy).

    python benchmarks/train_overhead.py [--steps 200] [--chunks 4] [--dvc]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from attnrepro.model import ModelConfig, TinyGPT
from attnrepro.training import BatchSampler, OptimConfig, lr_at, make_optimizer, train


def bare_loop(model, sampler, cfg: OptimConfig) -> float:
    opt = make_optimizer(model, cfg)
    model.train()
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        x, y = sampler.next()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="steps per chunk")
    ap.add_argument("--chunks", type=int, default=4, help="alternating chunks per variant")
    ap.add_argument("--diag-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dvc", action="store_true", help="also time a no-op `dvc repro` (3 runs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = OptimConfig(steps=args.steps)
    tokens = torch.randint(2, 1200, (200_000,), generator=torch.Generator().manual_seed(0))
    times = {"bare": [], "diagnostics": []}
    for chunk in range(args.chunks):
        for name in ("bare", "diagnostics"):
            torch.manual_seed(0)
            model = TinyGPT(ModelConfig())
            sampler = BatchSampler(tokens, 64, 32, seed=chunk)
            if name == "bare":
                seconds = bare_loop(model, sampler, cfg)
            else:
                diag = set(range(0, cfg.steps, args.diag_every))
                seconds = train(model, sampler, cfg, diag_steps=diag).seconds
            times[name].append(1000 * seconds / cfg.steps)
    bare, diag = statistics.median(times["bare"]), statistics.median(times["diagnostics"])
    print(f"small model, batch 32 x 64, {args.threads} threads, {args.chunks} x {args.steps} steps each")
    print(f"bare loop:          {bare:7.2f} ms/step  (chunks: {', '.join(f'{t:.1f}' for t in times['bare'])})")
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
