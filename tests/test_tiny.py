"""`attnrepro tiny`: each profile's overrides name real params keys; a tiny stage runs in a
scratch folder and leaves the repository's outputs alone."""

import shlex
from pathlib import Path

import pytest

from attnrepro.commands import main as cli
from attnrepro.config import UserError
from attnrepro.commands.tiny import TINY, _set, dvc_command, tiny_params

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stage", sorted(TINY))
def test_every_override_names_a_params_key(stage):
    params = tiny_params(REPO, stage)
    assert params["engine"]["workers"] == 1
    for key, value in TINY[stage].items():
        node = params
        for part in key.split("."):
            node = node[part]
        assert node == value


def test_an_unknown_key_is_one_line():
    with pytest.raises(UserError, match="reversal.stepz: params.yaml has no such key"):
        _set({"reversal": {"steps": 1}}, "reversal.stepz", 2)


def test_print_is_a_dvc_exp_run_of_that_stage_only():
    cmd = shlex.split(dvc_command("failures"))
    assert cmd[:5] == ["dvc", "exp", "run", "--temp", "failures"]
    assert "failures.spread_seeds=[1]" in cmd


def test_a_tiny_stage_runs_in_a_scratch_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    ref = REPO / "metrics" / "init_sweep.json"
    before = ref.stat().st_mtime_ns if ref.exists() else None
    assert cli.main(["tiny", "init_sweep", "--dir", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "metrics" / "init_sweep.json").is_file()
    assert (ref.stat().st_mtime_ns if ref.exists() else None) == before
