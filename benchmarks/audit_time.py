"""Benchmark: the wall time of `attnrepro audit` on the gallery (examples/attention/), on one core.

Each example is audited in a fresh process, as a user runs it (`attnrepro audit <example>`, torch's
import included), pinned to one core (taskset, where the machine has it) with one OpenMP thread.
Prints per example the wall time and the audit's own time (the page's "audited: ..., X s": loading
the function and the checks), then the median and range of both; with --cost the same with the
cost comparison against SDPA. Figures, not asserts (the machines here are shared and noisy): the
exit status is 1 only when an audit ends with another exit status than its gallery entry's.

    python benchmarks/audit_time.py [--examples chunked,mask_zero] [--cost] [--core 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "attention"


def gallery() -> list[str]:
    names = sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem not in ("__init__", "third_party"))
    return [f"examples.attention.{n}:{'chunked_attention' if n == 'chunked' else 'attention'}" for n in names]


def audit(target: str, cost: bool, core: int) -> tuple[float, float, int, str]:
    """(wall s, the audit's own s, exit status, first line) of one audit in a fresh process."""
    with tempfile.TemporaryDirectory() as d:
        rec_path = Path(d) / "audit.json"
        cmd = [sys.executable, "-m", "attnrepro.commands.main", "audit", target, "--json", str(rec_path)]
        if cost:
            cmd.append("--cost")
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", str(core)] + cmd
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t
        own = json.loads(rec_path.read_text())["seconds"] if rec_path.is_file() else float("nan")
    return wall, own, proc.returncode, (proc.stdout or proc.stderr).splitlines()[0] if (proc.stdout or proc.stderr) else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default="", help="comma-separated example modules (default: the whole gallery)")
    ap.add_argument("--cost", action="store_true", help="audit with the cost comparison (--cost) as well")
    ap.add_argument("--core", type=int, default=0, help="the core taskset pins each audit to (default 0)")
    args = ap.parse_args()
    targets = gallery()
    if args.examples:
        wanted = set(args.examples.split(","))
        targets = [t for t in targets if t.split(".")[-1].split(":")[0] in wanted]
        if not targets:
            print(f"error: --examples {args.examples!r}: none of them is in {EXAMPLES}", file=sys.stderr)
            return 2
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"{len(targets)} audits, each in a fresh process on core {args.core}, one thread; load average {load:.2f}"
          f"{' (taskset not found: not pinned)' if not shutil.which('taskset') else ''}")
    bad = 0
    for cost in (False, True) if args.cost else (False,):
        walls, owns = [], []
        print(f"\n{'with --cost' if cost else 'default (no --cost)'}:")
        print(f"  {'example':<28}{'wall s':>8}{'audit s':>9}  exit  first line")
        for target in targets:
            wall, own, rc, first = audit(target, cost, args.core)
            expected = 0 if first.startswith("PASS") else 1
            bad += rc not in (0, 1) or rc != expected
            walls.append(wall)
            owns.append(own)
            name = target.split(".")[-1].split(":")[0]
            print(f"  {name:<28}{wall:>8.2f}{own:>9.2f}  {rc:>4}  {first[:70]}")
        print(f"  wall: median {statistics.median(walls):.2f} s (range {min(walls):.2f}-{max(walls):.2f}); "
              f"the audit's own: median {statistics.median(owns):.2f} s (range {min(owns):.2f}-{max(owns):.2f})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
