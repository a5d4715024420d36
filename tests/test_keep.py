"""`attnrepro keep` stages exactly the pipeline's git-tracked outputs, dvc.lock and README.md (after
regenerating it) and never commits; `attnrepro restore` puts the committed reference back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnrepro.commands import main as cli
from attnrepro.commands.keep_restore import git_outputs
from attnrepro.run.stage import SWEEPS

REPO = Path(__file__).resolve().parents[1]

DVC_YAML = """\
stages:
  make:
    cmd: python make.py
    deps:
      - make.py
    params:
      - make
    outs:
      - data/big.bin
      - plots/make:
          cache: false
    metrics:
      - metrics/make.json:
          cache: false
"""
MAKE = """\
import json, os, yaml
n = yaml.safe_load(open("params.yaml"))["make"]["n"]
os.makedirs("metrics", exist_ok=True); os.makedirs("plots/make", exist_ok=True); os.makedirs("data", exist_ok=True)
json.dump({"n": n}, open("metrics/make.json", "w"))
open("plots/make/curve.csv", "w").write(f"x,y\\n0,{n}\\n")
open("data/big.bin", "wb").write(bytes([n % 256]) * 1000)
"""


def _sh(cwd, *cmd, check=True):
    return subprocess.run(cmd, cwd=cwd, check=check, capture_output=True, text=True)


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "p"
    root.mkdir()
    _sh(root, "git", "init", "-q")
    _sh(root, "git", "config", "user.email", "t@example.com")
    _sh(root, "git", "config", "user.name", "t")
    _sh(root, sys.executable, "-m", "dvc", "init", "-q")
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "make.py").write_text(MAKE)
    (root / "params.yaml").write_text("make:\n  n: 1\n")
    (root / "README.md").write_text("# p\n")
    (root / "code.py").write_text("x = 1\n")
    _sh(root, sys.executable, "-m", "dvc", "repro", "-q")
    _sh(root, "git", "add", "-A")
    _sh(root, "git", "commit", "-qm", "reference")
    # README generation is attnrepro.report.readme's (tested by tests/test_readme.py); here it stamps a line
    import attnrepro.report.readme

    def fake_update(r, check=False):
        readme = Path(r) / "README.md"
        n = (Path(r) / "metrics" / "make.json").read_text()
        new = f"# p\n{n}\n"
        same = readme.read_text() == new
        if not check:
            readme.write_text(new)
        return same

    monkeypatch.setattr(attnrepro.report.readme, "update", fake_update)
    monkeypatch.chdir(root)
    return root


def _new_run(root: Path, n: int) -> None:
    (root / "params.yaml").write_text(f"make:\n  n: {n}\n")
    _sh(root, sys.executable, "-m", "dvc", "repro", "-q")


def test_outputs_are_read_from_dvc_yaml(project):
    assert git_outputs(project) == ["plots/make", "metrics/make.json"]


def test_keep_stages_exactly_the_outputs_lock_and_readme(project, capsys):
    _new_run(project, 2)
    (project / "code.py").write_text("x = 2\n")  # the code change that produced the run: not keep's to stage
    (project / "notes.txt").write_text("mine\n")
    assert cli.main(["keep"]) == 0
    out = capsys.readouterr().out
    staged = _sh(project, "git", "diff", "--cached", "--name-only").stdout.split()
    assert sorted(staged) == ["README.md", "dvc.lock", "metrics/make.json", "plots/make/curve.csv"]
    assert "keep: staged 4 files" in out and "git commit -m" in out
    assert "code.py" in out  # named as changed elsewhere, not staged
    assert _sh(project, "git", "log", "--oneline").stdout.count("\n") == 1  # nothing committed
    assert "{\"n\": 2}" in (project / "README.md").read_text()


def test_keep_refuses_a_stale_pipeline(project, capsys):
    (project / "params.yaml").write_text("make:\n  n: 3\n")  # changed, not rerun
    assert cli.main(["keep"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 stage stale (make)" in err and "--allow-stale" in err
    assert _sh(project, "git", "diff", "--cached", "--name-only").stdout == ""


def test_keep_refuses_outputs_that_differ_from_the_lock(project, capsys):
    (project / "metrics" / "make.json").write_text('{"n": 99}')
    assert cli.main(["keep", "--allow-stale"]) == 2
    assert "differ from dvc.lock" in capsys.readouterr().err
    assert _sh(project, "git", "diff", "--cached", "--name-only").stdout == ""


def test_keep_refuses_while_a_killed_stage_left_its_staging_journal(project, capsys):
    from attnrepro.staging import STAGING

    _new_run(project, 2)
    (project / STAGING / "slot-1").mkdir(parents=True)
    (project / STAGING / "slot-1" / "journal.json").write_text("{}")
    assert cli.main(["keep"]) == 2
    err = capsys.readouterr().err
    assert "journal of a stage killed" in err and "attnrepro staging --finish | --discard" in err
    assert _sh(project, "git", "diff", "--cached", "--name-only").stdout == ""


def test_restore_puts_the_reference_back(project, capsys):
    ref = (project / "metrics" / "make.json").read_text()
    _new_run(project, 5)
    (project / "plots" / "make" / "extra.csv").write_text("new output\n")
    (project / "plots" / "make" / "kept.csv").write_text("staged by attnrepro keep\n")
    _sh(project, "git", "add", "plots/make/kept.csv")
    assert cli.main(["restore", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "plots/make/extra.csv (not in the reference: removed)" in out
    assert "plots/make/kept.csv (not in the reference: removed)" in out and not (project / "plots/make/kept.csv").exists()
    assert _sh(project, "git", "diff", "--cached", "--name-only").stdout == ""
    assert (project / "metrics" / "make.json").read_text() == ref
    assert (project / "data" / "big.bin").read_bytes() == bytes([1]) * 1000  # dvc checkout, from the cache
    lines = out.splitlines()
    listed = [line for line in lines if line.startswith(" ")]  # what it lists before it acts: git's files
    assert lines[0] == f"restore: {len(listed)} files of the pipeline's outputs go back to HEAD's (your changes to them are discarded):"
    assert "restore: data/big.bin: the reference's version, from the DVC cache (dvc checkout)" in lines
    assert f"restore: {len(listed) - 2} checked out from HEAD, 2 removed" in lines  # counts that match the list
    assert "restore: 1 DVC-tracked output checked out from the DVC cache" in lines
    assert lines[-1].startswith("next: attnrepro check")
    assert not (project / "plots" / "make" / "extra.csv").exists()
    assert "changed outs" not in _sh(project, sys.executable, "-m", "dvc", "status", "--json").stdout
    assert (project / "params.yaml").read_text() == "make:\n  n: 5\n"  # params are code: left alone
    assert "params.yaml differs from HEAD and is left as it is" in out  # ... and said so


def test_restore_is_silent_about_params_it_did_not_change(project, capsys):
    _new_run(project, 5)
    _sh(project, "git", "checkout", "HEAD", "--", "params.yaml")
    assert cli.main(["restore", "--yes"]) == 0
    assert "params.yaml" not in capsys.readouterr().out


def test_restore_moves_aside_the_data_the_dvc_cache_cannot_give_back(project, capsys):
    """`restore --yes` after a run on a fresh clone (the reference's checkpoints never pulled) kept the run's
    data/ as it was, whose run records contradict the restored metrics (issue 66): it now moves them aside
    into one named folder, listed first, and deletes nothing."""
    import shutil
    from datetime import datetime, timezone

    from attnrepro.commands.keep_restore import ASIDE, restore

    _new_run(project, 5)
    shutil.rmtree(project / ".dvc" / "cache")  # the reference's data/big.bin is in no cache now
    lines = []
    assert restore(project, yes=True, say=lines.append, now=datetime(2026, 12, 7, 21, tzinfo=timezone.utc)) == 0
    folder = f"{ASIDE}/20261207T210000Z"
    i = lines.index(f"restore: 1 of the run's data/ outputs differ from the reference's, which the DVC cache lacks: "
                    f"moved aside into {folder}/ (delete it when you no longer need them):")
    assert lines[i + 1] == " data/big.bin" and not any("kept" in line for line in lines)
    assert f"restore: 3 checked out from HEAD, 1 moved aside into {folder}/" in lines  # dvc.lock, metrics, plot
    assert not (project / "data" / "big.bin").exists()
    assert (project / folder / "data" / "big.bin").read_bytes() == bytes([5]) * 1000  # the run's, not deleted
    assert json.loads((project / "metrics" / "make.json").read_text()) == {"n": 1}  # git's part is done
    assert _sh(project, "git", "status", "--porcelain").stdout.split() == ["M", "params.yaml"]  # the folder ignored


def test_restore_after_a_run_on_another_float_order_ends_where_check_passes(tmp_path, monkeypatch, capsys):
    """The run made on another CPU (metrics, env records and its run folder under data/ other than HEAD's;
    the reference's data/ in no DVC cache, as on a fresh clone): `restore --yes`, then `check` exits 0."""
    from attnrepro.store.run_store import recorded_key
    from test_check import AMD, INTEL, SEEDS, dump, git, write_repo
    from test_check_lock import relock

    monkeypatch.setattr("attnrepro.judge.check.live_environment", lambda device: dict(INTEL))
    root = tmp_path / "r"
    write_repo(root)
    _sh(root, sys.executable, "-m", "dvc", "init", "-q")
    (root / "data").mkdir()
    (root / "data/.gitignore").write_text("/train\n")
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    for st in dvc["stages"].values():  # git holds metrics/ and plots/, as in the project's dvc.yaml
        for k in ("outs", "metrics"):
            st[k] = [{path: {"cache": False}} for path in st.get(k, [])]
    dvc["stages"]["train"]["outs"].append("data/train")  # DVC the run folders
    (root / "dvc.yaml").write_text(yaml.safe_dump(dvc))

    def run_folder(values: dict) -> None:
        folder = root / "data/train/scaled"
        folder.mkdir(parents=True, exist_ok=True)
        spec = {"task": "corpus_lm", "seed": 0}
        dump(folder / "spec.json", {**spec, "key": recorded_key(spec)})
        dump(folder / "summary.json", values)

    run_folder(SEEDS[0]["scaled"])
    relock(root)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the reference, its run folder in no DVC cache")
    assert cli.main(["check", "--root", str(root)]) == 0
    other = {**SEEDS[0]["scaled"], "loss_final": 3.75}  # another float order
    run_folder(other)
    dump(root / "metrics/train.json", {**SEEDS[0], "scaled": other})
    for f in ("train", "init", "latency", "sweep"):
        dump(root / f"metrics/env/{f}.json", AMD)
    relock(root)
    monkeypatch.chdir(root)
    assert cli.main(["restore", "--yes"]) == 0
    assert "moved aside into" in capsys.readouterr().out
    assert cli.main(["check"]) == 0, capsys.readouterr().out


def test_restore_asks_first(project, capsys, monkeypatch):
    _new_run(project, 6)
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # no terminal: it cannot ask
    assert cli.main(["restore"]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert '"n": 6' in (project / "metrics" / "make.json").read_text()


def test_restore_when_nothing_changed(project, capsys):
    assert cli.main(["restore"]) == 0
    assert "are the committed reference already" in capsys.readouterr().out


def test_readme_counts_are_generated():
    from attnrepro.report.readme import COUNT, ReadmeError, Sources, counts, render_counts

    values = counts(Sources(REPO))
    assert values["runs_sweeps"] == sum(values[f"runs_{s}"] for s in SWEEPS)
    assert render_counts("a <!--count:runs_train-->999<!--/count--> b", values) == \
        f"a <!--count:runs_train-->{values['runs_train']:,}<!--/count--> b"
    with pytest.raises(ReadmeError, match="nobody generates: 'nope'"):
        render_counts("<!--count:nope-->1<!--/count-->", values)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert {m.group(1) for m in COUNT.finditer(text)} >= {"exp_show_columns", "runs_sweeps", "runs_sensitivity"}


def test_sweep_minutes_come_from_the_env_records(tmp_path):
    from attnrepro.report.readme import COUNT, ReadmeError, run_minutes

    (tmp_path / "metrics" / "env").mkdir(parents=True)
    (tmp_path / "metrics" / "env" / "seeds.json").write_text('{"runs": 2, "run_wall_seconds": 5430.0}')
    assert run_minutes(tmp_path, ["seeds"]) == {"run_minutes_seeds": 90}
    (tmp_path / "metrics" / "env" / "seeds.json").write_text('{"runs": 0}')
    with pytest.raises(ReadmeError, match="no run_wall_seconds"):
        run_minutes(tmp_path, ["seeds"])
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert {m.group(1) for m in COUNT.finditer(text)} >= {f"run_minutes_{s}" for s in
                                                           SWEEPS}


def test_keep_after_a_one_knob_change_names_the_cheap_rerun_and_never_a_sweep():
    """`dvc exp run heads -S heads.seq_seed=1` then keep said "rerun them (dvc repro <stage>)" for seeds
    and report, and `dvc repro report` schedules the 40-run seeds sweep (issue 40)."""
    from attnrepro.commands.keep_restore import rerun_advice

    advice = rerun_advice(REPO, {"seeds": [], "report": [], "headline": []})
    assert advice.startswith("rerun them: dvc repro --single-item report headline (or keep")
    assert "seeds is a sweep (hours from an empty store): keep the committed outputs with --allow-stale" in advice


def test_the_sweeps_keep_knows_are_the_ones_reproduce_sh_skips():
    import re

    from attnrepro.run.stage import SWEEPS

    text = (REPO / "scripts" / "reproduce.sh").read_text(encoding="utf-8")
    assert tuple(re.search(r'^SWEEPS="([^"]*)"', text, re.M).group(1).split()) == SWEEPS
