"""Print dvc.yaml's stages one per line, each after every stage whose outputs it reads (its deps
under another stage's outs), in dvc.yaml's order where that leaves a choice. scripts/reproduce.sh
forces them one at a time in this order, so a new stage needs no list of its own.

    python scripts/stage_order.py [--skip STAGE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _path(entry) -> str:
    return (entry if isinstance(entry, str) else next(iter(entry))).rstrip("/")


def order(stages: dict) -> list[str]:
    """A topological order of `stages` (dvc.yaml's mapping): a stage comes after every stage that
    writes one of its deps (the dep is that output or lies under it)."""
    outs = {name: [_path(o) for o in st.get("outs", [])] for name, st in stages.items()}
    needs = {name: {other for other in stages if other != name
                    for dep in map(_path, st.get("deps", [])) for out in outs[other]
                    if dep == out or dep.startswith(out + "/")}
             for name, st in stages.items()}
    done: list[str] = []
    while len(done) < len(stages):
        ready = [name for name in stages if name not in done and needs[name] <= set(done)]
        if not ready:
            raise SystemExit(f"error: dvc.yaml's stages depend on each other in a cycle: {sorted(set(stages) - set(done))}")
        done.append(ready[0])
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip", nargs="*", default=[], metavar="STAGE", help="stages to leave out")
    args = ap.parse_args()
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    unknown = sorted(set(args.skip) - set(stages))
    if unknown:
        print(f"error: --skip names no stage of dvc.yaml: {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in order(stages):
        if name not in args.skip:
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
