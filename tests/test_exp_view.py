"""`attnrepro exp`: the headline per experiment in 80 columns (issue 40: the README's `dvc exp show
--keep` view showed claims columns and the claims.yaml hash, never the run's numbers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from attnrepro.commands.exp_view import HEADER, rows

REPO = Path(__file__).resolve().parents[1]
HEADLINE = json.loads((REPO / "metrics" / "headline.json").read_text(encoding="utf-8"))


def _entry(rev: str, name, headline) -> dict:
    return {"rev": rev, "name": name, "data": {"rev": rev, "metrics": {"metrics/headline.json": {"data": headline}}}}


def test_one_row_per_experiment_with_the_headline_numbers_in_80_columns():
    changed = json.loads(json.dumps(HEADLINE))
    changed["run"]["train"]["comparison"]["gap_d32_loss_final"] = 0.5
    show = [_entry("workspace", None, HEADLINE),
            {**_entry("a" * 40, "main", HEADLINE),
             "experiments": [{"revs": [_entry("b" * 40, "tiny-lr", changed)]}]}]
    lines = [HEADER, *rows(show)]
    assert len(lines) == 4 and all(len(ln) <= 80 for ln in lines)
    assert [ln.split()[0] for ln in lines[1:]] == ["workspace", "main", "tiny-lr"]
    run = HEADLINE["run"]["train"]
    assert f"{run['comparison']['gap_d256_loss_final']:.3f}" in lines[1]
    assert f"{run['d256_unscaled']['entropy_step222']:.2e}" in lines[1]
    c = HEADLINE["claims"]["conclusion"]
    assert lines[1].endswith(f"{c['passed']}/{c['n']}")  # n: the conclusions tested (the skipped excluded)
    u = run["d256_unscaled"]
    assert f"{u['jacobian_fro_step0'] / u['jacobian_fro_step1480']:.0f}x" in lines[1]
    assert " 0.500 " in lines[3] and "—" not in lines[3]


def test_a_headline_without_a_number_shows_a_dash():
    assert rows([_entry("workspace", None, {"claims": {}})])[0].split()[1:] == ["—"] * 6


def test_the_command_runs_on_this_repository():
    proc = subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "exp"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == HEADER and lines[1].split()[0] == "workspace" and all(len(ln) <= 80 for ln in lines)


def test_without_the_environment_activated_dvc_is_found_beside_python_or_named_in_one_line(tmp_path, monkeypatch,
                                                                                          capsys):
    """`attnrepro exp` without the venv activated ended in a traceback (FileNotFoundError: 'dvc', issue 66)."""
    import os
    import sys

    from attnrepro.commands import tool
    from attnrepro.commands.main import main

    real = os.path.join(os.path.dirname(sys.executable), "dvc")
    monkeypatch.setenv("PATH", str(tmp_path))  # not activated: dvc is not on PATH
    if os.path.exists(real):
        assert tool("dvc") == real  # the venv's, beside the interpreter
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # and no dvc beside this Python either
    assert main(["exp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: `dvc` is neither on PATH nor beside") and \
        "source .venv/bin/activate" in err


def test_the_usage_sample_is_the_committed_headline():
    """docs/USAGE.md's `attnrepro exp` sample showed a reference long gone (issue 66); after a new reference,
    paste `attnrepro exp`'s rows for it."""
    from attnrepro.commands.exp_view import row

    usage = (REPO / "docs" / "USAGE.md").read_text(encoding="utf-8")
    sample = usage.split(f"  {HEADER}\n", 1)[1].split("  ```", 1)[0].splitlines()
    assert sample == [f"  {row(name, HEADLINE)}" for name in ("workspace", "main")]
