"""The pull-request comment of a reproduction (.github/workflows/reproduce.yml): this run's verdict
against the base (check.md, with its headline table of this run's numbers), then this run's figures,
each named with the SHA-256 of the file this run wrote (the files are in the workflow's artifact:
nothing is published to a public host).

    python scripts/reproduce_comment.py check.md > comment.md
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

FIGURES = ("plots/seeds/bands.png", "report/figures/train_loss.png", "report/figures/train_diagnostics.png",
           "plots/latency/latency.png")


def comment(check: Path, root: Path = Path(".")) -> str:
    lines = [check.read_text(encoding="utf-8") if check.is_file() else f"({check} was not written: see the log)", "",
             "### This run's figures (artifact `reproduction-report`)", ""]
    for name in FIGURES:
        path = root / name
        if path.is_file():
            lines.append(f"- `{name}` (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:12]})")
        else:
            lines.append(f"- `{name}`: not made by this run")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(comment(Path(sys.argv[1])))
