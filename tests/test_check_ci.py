"""CI judges a pull request against its base (issue 18, item 8), and only on a maintainer's say-so.

- A pull request whose code, metrics, dvc.lock and claims are edited consistently passes
  against its own commit, and fails against the base (`attnrepro check --base main`, or
  `--rev` the merge base); the first lines list the claims and reference changes it makes.
- .github/workflows/reproduce.yml runs that check, on a labelled pull request from this
  repository's own branches (never a fork's, never on a later push) or a manual dispatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from attnrepro.commands.main import build_parser
from attnrepro.stats import distribution
from test_check import CONCLUSIONS, SEEDS, check, dump, edit, git, live, predicates, write_repo  # noqa: F401
from test_check_lock import relock
from test_check_tamper import first_lines

REPO = Path(__file__).resolve().parents[1]


def pull_request(tmp_path) -> tuple[Path, str]:
    """main: the reference; branch pr: one commit that moves the code, the metrics, the seeds and the claims together."""
    root = write_repo(tmp_path / "r")
    (root / "src").mkdir(exist_ok=True)
    (root / "src/attention.py").write_text("SCALE = 'sqrt(d_k)'\n", encoding="utf-8")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the code")
    base = git(root, "rev-parse", "HEAD").strip()
    git(root, "checkout", "-q", "-b", "pr")
    (root / "src/attention.py").write_text("SCALE = '1'\n", encoding="utf-8")  # the bug
    moved = {s: json.loads(json.dumps(v)) for s, v in SEEDS.items()}
    for v in moved.values():  # every seed of the unscaled model now ends as the scaled one: no gap
        v["unscaled"]["loss_final"] = v["scaled"]["loss_final"] + 0.1
    edit(root, "train", lambda d: d["unscaled"].__setitem__("loss_final", moved[0]["unscaled"]["loss_final"]))
    dump(root / "metrics/dist/train.json", distribution(moved))
    (root / "src/attnrepro/judge/conclusions.py").write_text(predicates(*[c for c in CONCLUSIONS if c[2] != "unscaled_worse"]),
                                                      encoding="utf-8")
    relock(root)
    git(root, "commit", "-qam", "attention without the scale; the reference and claims follow")
    return root, base


def test_a_consistent_pull_request_passes_against_itself_and_fails_against_its_base(tmp_path, live, capsys):
    root, base = pull_request(tmp_path)
    rc, out = check(root, capsys)
    assert rc == 0, out  # its own commit supplies the reference, the bands and the claims: no gate at all
    rc, out = check(root, capsys, "--base", "main")
    assert rc == 1
    b = base[:10]
    assert first_lines(out) == [
        f"check: FAIL — this run does not reproduce the reference ({b}, the merge base of HEAD and main): "
        "3 problem(s), listed below",
        f"  src/attnrepro/judge/conclusions.py differs from {b}'s; the verdict uses {b}'s:",
        "    removed   train.unscaled_worse",
        f"  seed distributions differ from {b}'s (bands and conclusions use {b}'s): metrics/dist/train.json",
        f"  HEAD's commits change the reference since {b}: metrics/dist/train.json, metrics/train.json, "
        "src/attnrepro/judge/conclusions.py"], out
    assert "conclusion train.unscaled_worse fails" in out
    assert "metric train.unscaled.loss_final = 3.8 drifted from 5.1 (exact)" in out
    assert "metrics/dist/train.json (the seed distribution) differs from" in out
    rc, same = check(root, capsys, "--rev", base)
    assert rc == 1 and same.replace(base, "BASE").count("conclusion train.unscaled_worse fails") == 1


def test_a_base_that_is_not_a_commit_is_one_line(tmp_path, live, capsys):
    root, _ = pull_request(tmp_path)
    rc, out = check(root, capsys, "--base", "nope")
    assert rc == 2 and out == f"error: --base: 'nope' is not a commit in {root.resolve()}\n"


def test_a_base_with_no_commit_in_common_is_one_line(tmp_path, live, capsys):
    root, _ = pull_request(tmp_path)
    git(root, "checkout", "-q", "--orphan", "unrelated")
    git(root, "commit", "-q", "--allow-empty", "-m", "no history in common")
    git(root, "checkout", "-q", "-")
    rc, out = check(root, capsys, "--base", "unrelated")
    assert rc == 2 and out == "error: --base: HEAD and unrelated have no commit in common\n"


def workflow() -> dict:
    data = yaml.safe_load((REPO / ".github/workflows/reproduce.yml").read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on:` as true
    return data


def test_the_gpu_workflow_runs_a_pull_request_only_on_a_maintainers_label_for_that_commit():
    wf = workflow()
    assert set(wf["on"]) == {"pull_request", "workflow_dispatch"}  # never pull_request_target
    assert wf["on"]["pull_request"] == {"types": ["labeled"]}  # a new push (synchronize) runs nothing
    job, unlabel = wf["jobs"]["reproduce"], wf["jobs"]["unlabel"]
    for j in (job, unlabel):
        cond = " ".join(j["if"].split())
        assert "github.event.label.name == 'reproduce'" in cond  # the label just added, not any label present
        assert "github.event.pull_request.head.repo.full_name == github.repository" in cond  # no fork
        assert "contains(" not in cond
    steps = job["steps"]
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout"))
    assert "github.event.pull_request.head.sha" in checkout["with"]["ref"]  # the labelled commit, pinned
    assert checkout["with"]["persist-credentials"] is False and checkout["with"]["fetch-depth"] == 0
    # the label comes off in a job of its own on a hosted runner (the GPU job holds no write token)
    assert any("removeLabel" in str(s.get("with", {}).get("script", "")) for s in unlabel["steps"])
    assert not any("removeLabel" in str(s) for s in steps)
    assert set(wf["on"]["workflow_dispatch"]["inputs"]) == {"sha", "base"}


def test_the_gpu_workflow_gates_on_the_base_branchs_reference():
    wf = workflow()
    job = wf["jobs"]["reproduce"]
    assert job["env"]["BASE"] == "${{ github.base_ref || inputs.base }}"
    gate = next(s for s in job["steps"] if "--base" in str(s.get("run", "")))
    lines = [ln.strip() for ln in gate["run"].splitlines()]
    assert lines == ["set -o pipefail", '.venv/bin/attnrepro check --base "origin/$BASE" | tee check.md']
    assert gate["if"] == "always()"
    args = build_parser().parse_args(["check", "--base", "origin/main"])
    assert args.base == "origin/main" and args.rev == "HEAD"
    comment = next(s for s in job["steps"] if "comment.md" in str(s.get("run", "")))
    assert comment["run"].strip() == ".venv/bin/python scripts/reproduce_comment.py check.md > comment.md"
    # the comment carries the verdict against the base, posted by the hosted job from the artifact
    assert "artifact/comment.md" in str(wf["jobs"]["comment"]["steps"])
