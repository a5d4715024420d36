"""CI workflows: valid YAML, the expected jobs and runner labels, commands that exist."""

from __future__ import annotations

import re
import shlex
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from attnrepro.commands.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
WF = REPO / ".github" / "workflows"
DVC_COMMANDS = {"repro", "metrics", "plots", "pull", "push", "status", "exp"}
SHELL = {"set", "true", "cat", "tee", "echo", "if", "then", "else", "fi", "command", "nvidia-smi", "mkdir", "cp"}
CREATED = {".venv/bin/python", ".venv/bin/dvc", ".venv/bin/attnrepro", ".venv/bin/pip"}


def load(name: str) -> dict:
    data = yaml.safe_load((WF / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on:` as true
    return data


def commands(wf: dict) -> list[list[str]]:
    out = []
    for job in wf["jobs"].values():
        for step in job["steps"]:
            for line in str(step.get("run", "")).splitlines():
                lex = shlex.shlex(line, posix=True, punctuation_chars=True)
                lex.whitespace_split = True
                words: list[str] = []
                redirect = False
                for tok in list(lex) + [";"]:
                    if tok in ("&&", "||", ";", "|"):
                        if words:
                            out.append(words)
                        words, redirect = [], False
                    elif tok in (">", ">>"):
                        redirect = True
                    elif not redirect:
                        words.append(tok)
    return out


def check_command(words: list[str]) -> None:
    prog = words[0]
    if prog in SHELL:
        return
    if prog in CREATED:
        prog = Path(prog).name
    if prog in ("bash", "sh", "source", "."):
        assert (REPO / words[1]).is_file(), f"{words}: {words[1]} does not exist"
    elif prog in ("python", "python3"):
        if words[1] == "-m":
            assert words[2] in ("venv", "pip", "pytest", "attnrepro"), words
        else:
            assert (REPO / words[1]).is_file(), f"{words}: {words[1]} does not exist"
    elif prog == "dvc":
        assert words[1] in DVC_COMMANDS, words
    elif prog == "attnrepro":
        subs = build_parser()._subparsers._group_actions[0].choices
        assert words[1] in subs or words[1] in COMMANDS, words
        build_parser().parse_args([w for w in words[1:] if w not in ("|",)])
    elif prog == "cml":
        assert words[1:3] == ["comment", "update"], words
    else:
        raise AssertionError(f"unexpected command in a workflow: {words}")


def test_ci_workflow():
    wf = load("ci.yml")
    assert "pull_request" in wf["on"]
    (job,) = wf["jobs"].values()
    assert "ubuntu" in job["runs-on"]
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert runs == ["bash .ci/run"]
    for words in commands(wf):
        check_command(words)


def test_reproduce_workflow_forces_every_stage_checks_and_comments():
    wf = load("reproduce.yml")
    job = wf["jobs"]["reproduce"]
    assert job["runs-on"] == ["self-hosted", "linux", "gpu", "ephemeral"]
    cmds = commands(wf)
    # the rerun goes through scripts/reproduce.sh, which forces every stage
    assert ["bash", "scripts/reproduce.sh"] in cmds
    assert "dvc repro --force" in (REPO / "scripts/reproduce.sh").read_text(encoding="utf-8")
    assert not [c for c in cmds if c[:2] == ["dvc", "repro"]], "a plain dvc repro would skip committed stages"
    assert [".venv/bin/attnrepro", "check"] in cmds
    uploads = [s for s in job["steps"] if "upload-artifact" in str(s.get("uses", ""))]
    assert uploads and uploads[0].get("if") == "always()"
    for words in cmds:
        check_command(words)


def uses(wf: dict) -> list[str]:
    return [s["uses"] for job in wf["jobs"].values() for s in job["steps"] if "uses" in s]


def test_reproduce_workflow_runs_the_code_read_only_and_comments_from_a_hosted_job():
    """The GPU job builds, runs and uploads with a read-only token; a separate hosted job, which never
    checks out or runs the pull request's code, posts the comment from the artifact."""
    wf = load("reproduce.yml")
    assert wf["permissions"] == {}
    gpu, post = wf["jobs"]["reproduce"], wf["jobs"]["comment"]
    assert gpu["permissions"] == {"contents": "read"}
    assert "ephemeral" in gpu["runs-on"]
    assert not any("github-script" in str(s.get("uses", "")) or "secrets." in str(s) or "GITHUB_TOKEN" in str(s)
                   for s in gpu["steps"])
    checkout = [s for s in gpu["steps"] if "actions/checkout" in str(s.get("uses", ""))]
    assert checkout and checkout[0]["with"]["persist-credentials"] is False
    assert any("upload-artifact" in str(s.get("uses", "")) and "comment.md" in s["with"]["path"] for s in gpu["steps"])
    assert post["needs"] == "reproduce" and post["runs-on"] == "ubuntu-latest"
    assert post["permissions"] == {"pull-requests": "write", "actions": "read"}
    assert not any("checkout" in str(s.get("uses", "")) or "run" in s for s in post["steps"])
    assert any("download-artifact" in str(s.get("uses", "")) for s in post["steps"])
    # the label comes off in a hosted job too, not on the GPU runner
    assert wf["jobs"]["unlabel"]["runs-on"] == "ubuntu-latest"
    assert set(wf["jobs"]) == {"unlabel", "reproduce", "comment"}


def test_reproduce_workflow_pins_actions_publishes_nothing_and_runs_one_at_a_time():
    wf = load("reproduce.yml")
    for ref in uses(wf):
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), f"{ref}: not pinned by a full commit SHA"
    jobs = str(wf["jobs"])  # what runs (the comments aside)
    assert "--publish" not in jobs and "setup-cml" not in jobs and "cml " not in jobs
    assert set(wf["on"]) == {"pull_request", "workflow_dispatch"} and wf["on"]["pull_request"]["types"] == ["labeled"]
    assert "github.event.pull_request.number" in wf["concurrency"]["group"]


def test_the_comment_shows_this_runs_check_and_figures(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import reproduce_comment
    finally:
        sys.path.remove(str(REPO / "scripts"))
    (tmp_path / "check.md").write_text("check: PASS\n| metric | this run |\n", encoding="utf-8")
    (tmp_path / "plots/latency").mkdir(parents=True)
    (tmp_path / "plots/latency/latency.png").write_bytes(b"this run")
    text = reproduce_comment.comment(tmp_path / "check.md", tmp_path)
    assert text.startswith("check: PASS") and "plots/latency/latency.png` (sha256 " in text
    assert "`plots/seeds/bands.png`: not made by this run" in text and "](./" not in text


def test_console_script_declared():
    py = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert py["project"]["scripts"]["attnrepro"] == "attnrepro.commands.main:main"
    assert (REPO / ".ci" / "run").is_file()
    assert (REPO / "docs" / "ci.md").is_file()


def stage_order(*skip: str) -> list[str]:
    out = subprocess.run([sys.executable, "scripts/stage_order.py", "--skip", *skip], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def test_reproduce_script_covers_every_stage_once_in_an_order_that_reads_fresh_outputs():
    """scripts/reproduce.sh forces every stage of dvc.yaml but the sweeps (all with --sweeps), each after
    the stages it reads, then report and headline: a new stage needs no list of its own."""
    import re

    text = (REPO / "scripts/reproduce.sh").read_text(encoding="utf-8")
    sweeps = re.search(r'^SWEEPS="([^"]*)"', text, re.M).group(1).split()
    stages = list(yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    default = stage_order(*sweeps, "report", "headline")
    assert sorted(default + sweeps + ["report", "headline"]) == sorted(stages)
    everything = stage_order()
    for first, then in (("corpus", "train"), ("train", "heads"), ("train", "init_sweep"), ("seeds", "report"),
                        ("report", "headline")):
        assert everything.index(first) < everything.index(then), (first, then)
    assert "dvc repro --force --single-item" in text and "stage_order.py --skip $SKIP report headline)" in text


def test_stage_order_refuses_an_unknown_stage():
    r = subprocess.run([sys.executable, "scripts/stage_order.py", "--skip", "nope"], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.strip() == "error: --skip names no stage of dvc.yaml: nope"


def test_ci_entry_point_changes_no_global_state():
    """.ci/run once ran `git config --global --add safe.directory` on every CI run."""
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    code = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert not any("--global" in ln or "--system" in ln for ln in code), code
    assert any(ln.startswith("bash scripts/test.sh") for ln in code)


def test_ci_entry_point_prints_its_wall_time_and_passes_on_the_test_commands_exit(tmp_path):
    """.ci/run ends with its own wall time (issue 66: measured, printed) and exits as scripts/test.sh did."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "scripts" / "test.sh").write_text("echo '1 passed'; exit 3\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chromium").write_text("#!/bin/sh\n", encoding="utf-8")  # installed: no apt-get here
    (bin_dir / "chromium").chmod(0o755)
    p = subprocess.run(["bash", ".ci/run"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    last = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 3 and last.startswith("ci: setup and tests took 0 min ") and last.endswith("(exit 3)"), p


def test_a_closed_pipe_is_no_traceback():
    """`attnrepro kv ... | head -1` once ended in a BrokenPipeError traceback: the reader here
    closes its end before the command writes anything."""
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "attnrepro"
    p = subprocess.Popen([str(exe), "kv", "--preset", "llama2-70b-gqa"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0 and err == "", err
