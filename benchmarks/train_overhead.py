"""Benchmark: cost of the training diagnostics, and of a no-op `dvc repro`.

Times the small model's training step in the one training loop (`run.loop.train_loop`)
with attention diagnostics every `--diag-every` steps against the same loop with none.
The two are run in alternating chunks so background load hits both alike. Prints
figures; asserts nothing (machines here are shared and noisy).

    python benchmarks/train_overhead.py [--steps 200] [--chunks 4] [--dvc]

--dvc also times a no-op `dvc repro` in the current folder (best of 3), and shows what DVC printed. It refuses to
start (one line, exit 2) unless `dvc status` is clean: on a stale workspace `dvc repro` is no
no-op, it would run the stale stages (a sweep: hours).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnrepro.config import from_dict

from attnrepro.files import read_params
from attnrepro.model.transformer import ModelConfig, TinyGPT
from attnrepro.run.loop import BatchSampler, OptimConfig, train_loop

ROOT = Path(__file__).resolve().parents[1]


def stale_stages() -> list[str]:
    """The stages `dvc status` lists (their deps, params or outputs changed); exits 2 when it cannot tell."""
    try:
        proc = subprocess.run(["dvc", "status", "--json"], capture_output=True, text=True)
    except FileNotFoundError:
        print("error: --dvc: `dvc` is not on PATH (source .venv/bin/activate)", file=sys.stderr)
        sys.exit(2)
    text = proc.stdout.strip()
    try:
        if proc.returncode != 0:
            raise ValueError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode)
        return [name.split(":")[-1] for name in json.loads(text[text.index("{"):] if "{" in text else "{}")]
    except (ValueError, IndexError) as e:
        print(f"error: --dvc: `dvc status` failed ({e})", file=sys.stderr)
        sys.exit(2)


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
        stale = stale_stages()
        if stale:
            print(f"error: --dvc: `dvc status` lists {len(stale)} stale stage{'s' * (len(stale) != 1)} "
                  f"({', '.join(stale)}), so `dvc repro` is no no-op here and would run them; see `dvc status`, "
                  "rerun or restore them first (attnrepro restore), or leave out --dvc", file=sys.stderr)
            sys.exit(2)
    torch.set_num_threads(args.threads)

    cfg = OptimConfig(steps=args.steps, batch_size=32, optimizer="adamw", lr=3e-3, betas=[0.9, 0.95],
                      weight_decay=0.1, decay="2d", schedule="cosine", warmup=100, min_lr_ratio=0.1, grad_clip=1.0)
    tokens = torch.randint(2, 1200, (200_000,), generator=torch.Generator().manual_seed(0))
    small = from_dict(ModelConfig, {**read_params(ROOT / "params.yaml")["train"]["models"]["small"], "vocab_size": 1200}, prefix="small")
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
        for i in range(3):
            t0 = time.perf_counter()
            proc = subprocess.run(["dvc", "repro"], capture_output=True, text=True)
            runs.append(time.perf_counter() - t0)
            out = (proc.stdout + proc.stderr).strip().splitlines()
            print(f"dvc repro #{i + 1} ({runs[-1]:.2f} s, exit {proc.returncode}):")
            for line in out[:15] + ([f"... {len(out) - 15} more lines"] if len(out) > 15 else []):
                print(f"    {line}")
            if proc.returncode != 0 or any(line.startswith("Running stage") for line in out):
                print("error: --dvc: that `dvc repro` was no no-op (above); timings discarded", file=sys.stderr)
                sys.exit(2)
        print(f"no-op dvc repro:    {min(runs):7.2f} s best of 3 ({', '.join(f'{r:.2f}' for r in runs)}; goal <= 3 s)")


if __name__ == "__main__":
    main()
