"""Regenerate the README's generated parts from the metrics, params.yaml, dvc.yaml and claims.yaml:
the headline (measured numbers with their seed intervals, next to the chapter's), the results
section and the counts in the prose (runs per stage, `dvc exp show` columns); and docs/'s generated
blocks (docs/CRITICAL.md: the critical curve's onset and fitted model). The logic lives in
attnrepro.report.readme, which `attnrepro keep` calls too.

    python scripts/update_readme.py               # rewrite the generated parts from the working tree
    python scripts/update_readme.py --check       # exit 1 if the committed README (HEAD) does not match
                                                  # the committed metrics (HEAD)
    python scripts/update_readme.py --check --rev REV    # the same for another revision

--check reads a revision, never the working tree: a faithful rerun on another machine changes the
working tree's metrics (its own float order), and that is no reason for the reference's README to
change. A run becomes the reference with `attnrepro keep`, which rewrites the README with it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from attnrepro.report.readme import ReadmeError, update

ROOT = Path(__file__).resolve().parents[1]


def committed_tree(rev: str, dest: Path) -> None:
    """The files of `rev` under `dest` (git archive: what a clone of that revision holds)."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise ReadmeError(f"--rev: {rev!r} is not a revision of {ROOT} ({archive.stderr.decode().strip()})")
    tar = dest / "tree.tar"
    tar.write_bytes(archive.stdout)
    with tarfile.open(tar) as t:
        t.extractall(dest / "tree", filter="data")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check that a revision's README matches its metrics")
    ap.add_argument("--rev", default="HEAD", help="the revision --check reads (default HEAD)")
    args = ap.parse_args()
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as d:
                committed_tree(args.rev, Path(d))
                current = update(Path(d) / "tree", check=True)
        else:
            current = update(ROOT)
    except ReadmeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check and not current:
        print(f"README.md or docs/ at {args.rev} does not match its metrics: run python scripts/update_readme.py "
              "(or attnrepro keep) and commit both", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
