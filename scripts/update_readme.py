"""Regenerate the README's generated parts from the committed metrics, params.yaml, dvc.yaml and
claims.yaml: the headline (measured numbers with their seed intervals, next to the chapter's), the
results section and the counts in the prose (runs per stage, `dvc exp show` columns). The logic
lives in attnrepro.report.readme, which `attnrepro keep` calls too.

    python scripts/update_readme.py          # rewrite the generated parts
    python scripts/update_readme.py --check  # exit 1 if the README is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnrepro.report.readme import ReadmeError, update

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check that the README is up to date")
    args = ap.parse_args()
    try:
        current = update(ROOT, check=args.check)
    except ReadmeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check and not current:
        print("README.md is out of date: run python scripts/update_readme.py (or attnrepro keep)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
