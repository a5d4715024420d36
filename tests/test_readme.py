"""The README's results section is generated from the committed metrics, never typed."""

import json
import re
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
    assert proc.returncode == 1 and "README.md or docs/ at HEAD does not match its metrics" in proc.stderr


def test_the_top_names_the_two_commands_and_their_measured_time():
    """Within its first 20 lines (issue 66: they were at line 27, after two dense paragraphs)."""
    top = "\n".join((REPO / "README.md").read_text(encoding="utf-8").splitlines()[:20])
    assert "bash scripts/reproduce.sh" in top and "bash scripts/test.sh" in top
    assert "<!-- timing:begin" in top and "**How long**, measured on two CPU cores: `reproduce.sh`" in top


def test_no_run_time_is_typed_outside_the_generated_parts():
    """A typed time goes stale (the README said 17 min 8 s long after the machine changed): times are
    generated, from docs/timings.yaml (the measured wall times) or the env records (the sweeps' minutes)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    typed = re.sub(r"<!--count:\w+-->.*?<!--/count-->", "N",
                   re.sub(r"<!-- (\w+):begin.*?<!-- \1:end -->", "", text, flags=re.S))
    assert not re.findall(r"[^\n]{0,30}\b\d[\d,.]*\s?(?:min|minutes|s|seconds|h|hours)\b", typed)


def test_durations_read_as_measured():
    from attnrepro.report.readme import duration

    assert (duration(1677), duration(1028), duration(1200), duration(1200, about=True)) == \
        ("27 min 57 s", "17 min 8 s", "20 min", "about 20 min")


def test_reproduce_sh_help_counts_no_runs_the_readme_does_not():
    """`reproduce.sh --help` said the sweeps were "about 100 training runs" (the README's count: 682)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    sweeps = re.search(r"<!--count:runs_sweeps-->([\d,]+)<!--/count-->", readme)[1]
    help_text = subprocess.run(["bash", "scripts/reproduce.sh", "--help"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout
    assert "--sweeps" in help_text
    for n in re.findall(r"([\d,]+) training runs", help_text):
        assert n == sweeps, f"reproduce.sh --help: {n} training runs; README.md: {sweeps}"
