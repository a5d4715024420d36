"""The README's results section is generated from the committed metrics, never typed."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_results_match_metrics():
    proc = subprocess.run([sys.executable, "scripts/update_readme.py", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_readme_names_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "bash scripts/reproduce.sh" in text and "bash scripts/test.sh" in text
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
