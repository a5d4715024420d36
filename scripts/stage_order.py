"""Print dvc.yaml's stages one per line, each after every stage whose outputs it reads (its deps
under another stage's outs), in dvc.yaml's order where that leaves a choice. scripts/reproduce.sh
forces them one at a time in this order, so a new stage needs no list of its own.

    python scripts/stage_order.py [--skip STAGE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnrepro.config import UserError
from attnrepro.files import dvc_stages
from attnrepro.run.stage import stage_order

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip", nargs="*", default=[], metavar="STAGE",
                    help="stages to leave out (a foreach stage's name leaves out all its copies, name@key)")
    args = ap.parse_args()
    stages = dvc_stages(REPO)
    unknown = sorted(set(args.skip) - {n.split("@")[0] for n in stages} - set(stages))
    if unknown:
        print(f"error: --skip names no stage of dvc.yaml: {', '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        order = stage_order(stages)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name in order:
        if name not in args.skip and name.split("@")[0] not in args.skip:
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
