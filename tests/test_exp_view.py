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
    assert lines[1].endswith(f"{c['passed']}/{c['n'] - c['skipped']}")
    assert " 0.500 " in lines[3] and "—" not in lines[3]


def test_a_headline_without_a_number_shows_a_dash():
    assert rows([_entry("workspace", None, {"claims": {}})])[0].split()[1:] == ["—"] * 6


def test_the_command_runs_on_this_repository():
    proc = subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "exp"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == HEADER and lines[1].split()[0] == "workspace" and all(len(ln) <= 80 for ln in lines)
