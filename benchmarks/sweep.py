"""Benchmark: the same sweep serially, on a local Dask cluster, and on an external Dask cluster.

Eight small runs (the chapter's small model, `--steps` steps each, one seed per run) are
trained three times, each into a fresh run store:

  serial    in this process, one after the other (engine.workers 1)
  local     a LocalCluster of `--workers` processes, one torch thread each (the default engine)
  cluster   `dask scheduler` and `--workers` `dask worker` processes started here on localhost,
            reached by address, as a cluster on other machines would be

Prints each wall time and the speed-ups, and checks that the three result sets are
byte-identical (every file of every run but its timing record). Figures, not asserts:
the exit status is 1 only when the results differ.

    python benchmarks/sweep.py [--runs 8] [--steps 200] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from attnrepro.experiments.protocol import TrainConfig, corpus_inputs
from attnrepro.config import UserError, from_dict
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.store.run_store import MANIFEST
from attnrepro.run.engine import require_ok, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def specs(runs: int, steps: int):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    cfg = from_dict(TrainConfig, {**params["train"], "steps": steps, "warmup": min(10, steps)}, prefix="train")
    return [cfg.spec("d32_scaled", seed, "cpu") for seed in range(1, runs + 1)]


def results(records) -> list[dict[str, object]]:
    """Every file of every run but its timing record, and the store's manifest without the timing
    record's entry (the manifest hashes every file, timing.json too, so it differs whenever that does)."""
    out = []
    for r in records:
        files: dict[str, object] = {p.name: p.read_bytes() for p in sorted(r.path.iterdir())
                                    if p.name not in ("timing.json", MANIFEST)}
        files[MANIFEST] = {k: v for k, v in json.loads((r.path / MANIFEST).read_text(encoding="utf-8")).items()
                           if k != "timing.json"}
        out.append(files)
    return out


def start_cluster(workers: int, folder: Path) -> tuple[str, list[subprocess.Popen], float]:
    t0 = time.perf_counter()
    sched_file = folder / "scheduler.json"
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1")
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    procs = [subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)], **quiet)]
    deadline = time.monotonic() + 60
    while not sched_file.exists():
        if procs[0].poll() is not None or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise UserError("benchmark: `dask scheduler` did not start (run it by hand to see why)")
        time.sleep(0.1)
    address = json.loads(sched_file.read_text())["address"]
    procs += [subprocess.Popen([str(bin_dir / "dask"), "worker", address, "--nthreads", "1", "--no-dashboard"],
                               **quiet) for _ in range(workers)]
    from distributed import Client

    with Client(address, timeout="60s") as c:
        c.wait_for_workers(workers, timeout=120)
    return address, procs, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    sweep, inputs = specs(args.runs, args.steps), corpus_inputs(ROOT / "data/corpus")
    walls, outs = {}, {}
    with tempfile.TemporaryDirectory(prefix="attnrepro-bench-") as tmp:
        tmp = Path(tmp)
        for name, engine in (("serial", EngineConfig(1, "", str(tmp / "serial"))),
                             ("local", EngineConfig(args.workers, "", str(tmp / "local")))):
            t0 = time.perf_counter()
            recs = run_sweep(f"bench-{name}", sweep, inputs, engine)
            walls[name] = time.perf_counter() - t0
            require_ok(recs, name)
            outs[name] = results(recs)
        address, procs, startup = start_cluster(args.workers, tmp)
        try:
            t0 = time.perf_counter()
            recs = run_sweep("bench-cluster", sweep, inputs, EngineConfig(0, address, str(tmp / "cluster")))
            walls["cluster"] = time.perf_counter() - t0
            require_ok(recs, "cluster")
            outs["cluster"] = results(recs)
        finally:
            for p in procs[::-1]:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
    identical = outs["serial"] == outs["local"] == outs["cluster"]
    cpu = os.cpu_count()
    print(f"\n{args.runs} runs of the small model x {args.steps} steps, {args.workers} workers, {cpu} CPU cores")
    print(f"serial:                 {walls['serial']:7.1f} s")
    print(f"local cluster:          {walls['local']:7.1f} s   speed-up {walls['serial'] / walls['local']:.2f}x "
          "(goal >= 1.8x on 2 cores; includes starting the workers)")
    print(f"external cluster:       {walls['cluster']:7.1f} s   speed-up {walls['serial'] / walls['cluster']:.2f}x "
          f"(its scheduler and workers took {startup:.1f} s to start, not counted)")
    print(f"results byte-identical: {'yes' if identical else 'NO'} "
          f"({sum(len(r) for r in outs['serial'])} files per mode, timing records aside)")
    return 0 if identical else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:  # no corpus yet, a failed run, a cluster that did not start: one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
