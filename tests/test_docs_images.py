"""Every image committed under docs/ is made by a script of the repository (scripts/, benchmarks/), which
names it: a picture nobody can make again goes stale unseen (docs/plots_page.png did, issue 66)."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp")


def test_every_image_in_docs_is_made_by_a_script():
    tracked = subprocess.run(["git", "ls-files", "docs"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    images = [f for f in tracked if f.lower().endswith(IMAGES) and (REPO / f).exists()]
    scripts = {p: p.read_text(encoding="utf-8") for d in ("scripts", "benchmarks") for p in (REPO / d).rglob("*")
               if p.suffix in (".py", ".sh")}
    orphans = [f for f in images if not any(f in text for text in scripts.values())]
    assert not orphans, f"images under docs/ that no script in scripts/ or benchmarks/ makes (names): {orphans}"
