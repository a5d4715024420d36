"""`attnrepro check` against dvc.lock: an output or a param edited after the run is named.

Also the helper the check tests share: `relock(root)` writes dvc.lock as `dvc repro` would
after a run (every dvc.yaml stage's outputs with DVC's md5, its params' values).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnrepro.files import dvc_stages

from attnrepro.judge.check import checkout_root
from attnrepro.provenance.lock import lock_findings, out_md5
from attnrepro.provenance.records import run_record_findings
from attnrepro.store.run_store import key_of, spec_record

REPO = Path(__file__).resolve().parents[1]


def lock_problems(root):
    """lock_findings' problems, without a reference."""
    return lock_findings(root)[0]


def _get(d, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def relock(root: Path) -> None:
    """dvc.lock for the workspace as it is: each stage's outputs (md5 as DVC 3 computes it) and params."""
    stages = dvc_stages(root)  # a foreach stage as its copies (choices@<arm>), as DVC locks them
    try:
        params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        params = {}
    lock: dict = {"schema": "2.0", "stages": {}}
    for name, st in stages.items():
        entry: dict = {"cmd": st.get("cmd", "")}
        keys = [str(p if isinstance(p, str) else next(iter(p))) for p in st.get("params") or []]
        if keys:
            entry["params"] = {"params.yaml": {k: _get(params, k) for k in keys}}
        outs = [str(o if isinstance(o, str) else next(iter(o))) for k in ("outs", "metrics", "plots")
                for o in st.get(k) or []]
        entry["outs"] = [{"path": o, "hash": "md5", "md5": out_md5(root / o)} for o in outs if (root / o).exists()]
        lock["stages"][name] = entry
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False), encoding="utf-8")


def test_md5s_are_dvcs(tmp_path):
    """Values `dvc add` (DVC 3.67) recorded for these very files: a file's md5 is its bytes' (no
    dos2unix), a directory's the md5 of its manifest with ".dir"."""
    (tmp_path / "d/sub").mkdir(parents=True)
    (tmp_path / "d/x.csv").write_bytes(b"a,b\n1,2\n")
    (tmp_path / "d/sub/y.json").write_bytes(b'{"k": 1}\n')
    (tmp_path / "f.txt").write_bytes(b"hello\r\nworld\n")
    assert out_md5(tmp_path / "d") == "d2772f0bacdb536a28c5274ccc3d2950.dir"
    assert out_md5(tmp_path / "f.txt") == "04153b3135e575c274352238bed301e7"


@pytest.fixture
def run(tmp_path) -> Path:
    root = tmp_path / "w"
    (root / "metrics/env").mkdir(parents=True)
    (root / "plots/train").mkdir(parents=True)
    (root / "params.yaml").write_text("train:\n  seed: 0\n  threads: 1\n  mask: [-1.0e4]\nreport: {x: 1}\n",
                                      encoding="utf-8")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "train": {"cmd": "x", "params": ["train"], "metrics": ["metrics/train.json"],
                  "outs": ["metrics/env/train.json", "plots/train"]},
        "report": {"cmd": "x", "params": ["report.x", "train.seed"], "outs": ["metrics/claims.json", "report"]}}}),
        encoding="utf-8")
    (root / "metrics/train.json").write_text('{"loss": 3.7}', encoding="utf-8")
    (root / "metrics/env/train.json").write_text('{"cpu": "Intel Xeon"}', encoding="utf-8")
    (root / "metrics/claims.json").write_text("{}", encoding="utf-8")
    (root / "plots/train/loss.csv").write_text("step,loss\n0,5.5\n", encoding="utf-8")
    (root / "report").mkdir()
    (root / "report/REPORT.md").write_text("| train.collapse | ✅ |\n", encoding="utf-8")
    relock(root)
    return root


def test_the_run_as_recorded_has_no_problem(run):
    assert lock_problems(run) == []


def test_a_metrics_file_edited_after_the_run(run):
    (run / "metrics/train.json").write_text('{"loss": 3.6}', encoding="utf-8")
    assert lock_problems(run) == ["metrics/train.json was edited after the run (its md5 differs from dvc.lock's)"]


def test_a_plots_folder_edited_or_grown_after_the_run(run):
    (run / "plots/train/extra.png").write_bytes(b"\x89PNG")
    assert lock_problems(run) == ["plots/train was edited after the run (its md5 differs from dvc.lock's)"]


def test_a_report_edited_after_the_run(run):
    """A REPORT.md whose ✅ became "❌ FAILED" passed the check (issue 39): every git-tracked output counts."""
    (run / "report/REPORT.md").write_text("| train.collapse | ❌ FAILED |\n", encoding="utf-8")
    assert lock_problems(run) == ["report was edited after the run (its md5 differs from dvc.lock's)"]


def test_an_env_record_deleted_or_an_unrecorded_metrics_file(run):
    (run / "metrics/env/train.json").unlink()
    (run / "metrics/extra.json").write_text('{"a": 1}', encoding="utf-8")
    assert lock_problems(run) == ["metrics/env/train.json is missing (dvc.lock records it as an output of train)",
                                  "metrics/extra.json is an output of no stage in dvc.lock: not made by the run"]


def test_a_param_edited_after_the_run_is_named_once(run):
    text = (run / "params.yaml").read_text(encoding="utf-8").replace("seed: 0", "seed: 1")
    (run / "params.yaml").write_text(text, encoding="utf-8")
    assert lock_problems(run) == ["params.yaml train.seed was edited after the run (report, train ran with 0, it now "
                                  "reads 1)"]


def test_yaml_1_2_numbers_in_the_lock_match_params(run):
    """DVC (YAML 1.2) writes -1.0e4 as -10000.0; PyYAML (1.1) reads the params' -1.0e4 as a string."""
    lock = yaml.safe_load((run / "dvc.lock").read_text(encoding="utf-8"))
    assert lock["stages"]["train"]["params"]["params.yaml"]["train"]["mask"] == ["-1.0e4"]
    lock["stages"]["train"]["params"]["params.yaml"]["train"]["mask"] = [-10000.0]
    (run / "dvc.lock").write_text(yaml.safe_dump(lock), encoding="utf-8")
    assert lock_problems(run) == []


def test_stale_lock_entries_and_a_missing_lock(run):
    """A stage dvc.yaml no longer has (an old foreach's train@x) is not the run's record."""
    lock = yaml.safe_load((run / "dvc.lock").read_text(encoding="utf-8"))
    lock["stages"]["train@old"] = {"cmd": "x", "outs": [{"path": "metrics/train.json", "md5": "0" * 32}]}
    (run / "dvc.lock").write_text(yaml.safe_dump(lock), encoding="utf-8")
    assert lock_problems(run) == []
    (run / "dvc.lock").write_text("stages: [unclosed\n", encoding="utf-8")
    assert lock_problems(run) == ["dvc.lock is not valid YAML: the outputs cannot be matched with the run that made them"]
    (run / "dvc.lock").unlink()
    assert lock_problems(run) == ["dvc.lock is missing: the outputs cannot be matched with the run that made them"]
    assert json.loads((run / "metrics/train.json").read_text(encoding="utf-8")) == {"loss": 3.7}


def test_a_thread_count_only_stages_not_rerun_ran_with_otherwise_is_a_note(run):
    reference = yaml.safe_load((run / "dvc.lock").read_text(encoding="utf-8"))
    params = (run / "params.yaml").read_text(encoding="utf-8")
    (run / "params.yaml").write_text(params.replace("threads: 1", "threads: 2"), encoding="utf-8")
    # nothing rerun: both stages' lock entries are the reference's, their outputs intact
    problems, notes = lock_findings(run, reference_lock=reference)
    assert problems == [] and notes == ["params.yaml train.threads was edited after the run (train ran with 1, "
                                        "it now reads 2), and it was not rerun: the outputs are the reference's "
                                        "own (`dvc status` lists them stale)"]
    # any other param is the protocol's: edited and run by no stage, the outputs no longer follow params.yaml
    text = params.replace("seed: 0", "seed: 1")
    (run / "params.yaml").write_text(text, encoding="utf-8")
    problems, notes = lock_findings(run, reference_lock=reference)
    assert notes == [] and problems == ["params.yaml train.seed was edited after the run (report, train ran with 0, "
                                        "it now reads 1)"]
    # ... run by one stage at its new value (train, relocked), the stage not rerun is a note: stale, named
    lock = yaml.safe_load((run / "dvc.lock").read_text(encoding="utf-8"))
    lock["stages"]["train"]["params"]["params.yaml"]["train"]["seed"] = 1
    (run / "metrics/train.json").write_text('{"loss": 3.75}', encoding="utf-8")
    for out in lock["stages"]["train"]["outs"]:
        out["md5"] = out_md5(run / out["path"])
    (run / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False), encoding="utf-8")
    problems, notes = lock_findings(run, reference_lock=reference)
    assert problems == [] and notes == ["params.yaml train.seed was edited after the run (report ran with 0, it now "
                                        "reads 1), and it was not rerun: the outputs are the reference's own (`dvc "
                                        "status` lists them stale); train ran with 1"]
    (run / "dvc.lock").write_text(yaml.safe_dump(reference, sort_keys=False), encoding="utf-8")
    (run / "metrics/train.json").write_text('{"loss": 3.7}', encoding="utf-8")
    # train rerun (its entry differs from the reference's) under the old values: even the thread count is a problem
    (run / "params.yaml").write_text(params.replace("threads: 1", "threads: 2").replace("seed: 0", "seed: 1"),
                                     encoding="utf-8")
    (run / "metrics/train.json").write_text('{"loss": 3.8}', encoding="utf-8")
    lock = yaml.safe_load((run / "dvc.lock").read_text(encoding="utf-8"))
    for out in lock["stages"]["train"]["outs"]:
        out["md5"] = out_md5(run / out["path"])
    (run / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False), encoding="utf-8")
    problems, notes = lock_findings(run, reference_lock=reference)
    assert notes == [] and problems == [
        "params.yaml train.seed was edited after the run (report, train ran with 0, it now reads 1)",
        "params.yaml train.threads was edited after the run (train ran with 1, it now reads 2)"]
    # an output edited after the run (the lock the reference's) is never "not rerun"
    (run / "dvc.lock").write_text(yaml.safe_dump(reference, sort_keys=False), encoding="utf-8")
    problems, notes = lock_findings(run, reference_lock=reference)
    assert notes == [] and problems == [
        "metrics/train.json was edited after the run (its md5 differs from dvc.lock's)",
        "params.yaml train.seed was edited after the run (report, train ran with 0, it now reads 1)",
        "params.yaml train.threads was edited after the run (train ran with 1, it now reads 2)"]


def _run_folder(root: Path, stage: str, name: str, summary: dict) -> str:
    document = {"spec": {"name": name}, "inputs": {}, "numerics": 1, "torch": "t"}
    key = key_of(document)
    folder = root / "data" / stage / name
    folder.mkdir(parents=True)
    (folder / "spec.json").write_bytes(spec_record(document, key, name))
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return key


def test_a_metric_forged_together_with_its_lock_is_caught_by_the_runs_own_record(tmp_path):
    """metrics/train.json edited and its md5 rewritten in dvc.lock passed the check (issue 39); the
    run folder the stage kept (data/train/<variant>/) still says what the run recorded."""
    key = _run_folder(tmp_path, "train", "d256_unscaled", {"loss_final": 5.14, "entropy_final": 0.0006})
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/train.json").write_text(json.dumps({"d256_unscaled": {"loss_final": 5.14}}))
    assert run_record_findings(tmp_path, {}) == []
    (tmp_path / "metrics/train.json").write_text(json.dumps({"d256_unscaled": {"loss_final": 5.29}}))
    assert run_record_findings(tmp_path, {}) == [
        f"metrics/train.json d256_unscaled.loss_final = 5.29, but the run that made it (data/train/d256_unscaled, "
        f"run {key[:12]}) recorded 5.14"]
    spec = json.loads((tmp_path / "data/train/d256_unscaled/spec.json").read_text())
    spec["spec"]["name"] = "another"
    (tmp_path / "data/train/d256_unscaled/spec.json").write_text(json.dumps(spec))
    assert run_record_findings(tmp_path, {}) == [
        "data/train/d256_unscaled/spec.json does not hash to its key: the run's record was edited"]


def test_check_finds_its_checkout_from_a_subfolder_and_names_a_bad_root(tmp_path, monkeypatch, capsys):
    from attnrepro.commands.main import main

    assert checkout_root(REPO / "docs") == REPO
    assert main(["check", "--root", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"error: --root: {tmp_path / 'nope'} is not a folder\n"
    monkeypatch.chdir(tmp_path)
    assert main(["check"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path.resolve()}: no params.yaml here or at the top of its "
                                              "git checkout")
