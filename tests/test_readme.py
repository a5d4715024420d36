"""The README's results section is generated from the committed metrics, never typed."""

import json
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


def test_a_rerun_that_moved_the_working_trees_metrics_leaves_the_readme_check_passing(tmp_path):
    """After `bash scripts/reproduce.sh` on another machine (its own float order) the README test failed and
    told the user to make the run the reference (issue 40): the check reads the committed revision. A
    metric committed without the README regenerated still fails it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(clone)], check=True)
    train = clone / "metrics" / "train.json"
    data = json.loads(train.read_text(encoding="utf-8"))
    data["d256_unscaled"]["loss_final"] += 0.25  # what another machine's rerun might leave in the working tree
    train.write_text(json.dumps(data, indent=2), encoding="utf-8")

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "scripts/update_readme.py", "--check"], cwd=clone, capture_output=True,
                              text=True)

    assert check().returncode == 0
    for args in (["add", "metrics/train.json"], ["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "m"]):
        subprocess.run(["git", *args], cwd=clone, check=True)
    proc = check()
    assert proc.returncode == 1 and "README.md at HEAD does not match its metrics" in proc.stderr
