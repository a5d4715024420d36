"""Nothing forged passes (issue 65): the probes on a copy of the committed reference, judged statistically (as
for most users: another CPU), each forgery with dvc.lock rewritten to match, as a forger would leave it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from attnrepro.store.run_store import recorded_key
from test_reference import check, reference  # noqa: F401 (fixture)


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _git(root: Path, *args) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_a_forged_gap_fails_naming_it(reference, capsys):
    _edit(reference / "metrics/train.json", lambda d: d["comparison"].__setitem__("gap_d32_loss_final", 0.17))
    rc, out = check(reference, capsys)
    assert rc == 1 and "metrics/train.json train.comparison.gap_d32_loss_final = 0.17, but recomputed from its " \
                       "inputs it is" in out, out


def test_a_forged_heads_value_fails_naming_what_it_moved(reference, capsys):
    _edit(reference / "metrics/heads.json", lambda d: d["l0h1"].__setitem__("entropy", d["l0h1"]["entropy"] + 0.3))
    rc, out = check(reference, capsys)
    assert rc == 1 and "metrics/heads.json heads.layer0.entropy = " in out, out


def _run_folders(root: Path) -> None:
    """data/train/<variant>/ as the train stage keeps them (spec.json hashing to its key, summary.json), and the run
    store's entries of the same runs."""
    metrics = json.loads((root / "metrics/train.json").read_text(encoding="utf-8"))
    for variant, summary in metrics.items():
        if variant == "comparison":
            continue
        record = {"spec": {"variant": variant}, "inputs": {}, "numerics": 1, "torch": "x"}
        record["key"] = key = recorded_key(record)
        for folder in (root / "data/train" / variant, root / "runs" / key[:2] / key):
            folder.mkdir(parents=True)
            (folder / "spec.json").write_text(json.dumps(record), encoding="utf-8")
            (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    (root / ".gitignore").write_text("data/\nruns/\n", encoding="utf-8")


def test_a_loss_forged_with_its_run_folder_fails_on_the_run_stores_entry(reference, capsys):
    _run_folders(reference)
    rc, out = check(reference, capsys)
    assert rc == 0, out  # the run folders and the store agree with the metrics
    _git(reference, "add", "-A")
    _git(reference, "commit", "-qm", "run folders locked")
    for path in (reference / "metrics/train.json", reference / "data/train/d32_scaled/summary.json"):
        _edit(path, lambda d: (d.get("d32_scaled", d)).__setitem__("loss_final", 3.9))
    rc, out = check(reference, capsys)
    assert rc == 1, out
    assert "data/train/d32_scaled/summary.json loss_final = 3.9, but the run store's entry of its run" in out


def test_a_deleted_or_altered_run_folder_is_named(reference, capsys):
    _run_folders(reference)
    check(reference, capsys)  # dvc.lock records data/train
    _git(reference, "add", "-A")
    _git(reference, "commit", "-qm", "run folders locked")
    lock = (reference / "dvc.lock").read_text(encoding="utf-8")
    shutil.rmtree(reference / "data/train/d32_scaled")
    from attnrepro.commands.main import main
    assert main(["check", "--root", str(reference), "--mode", "statistical"]) == 1
    out = capsys.readouterr().out
    assert "data/train/d32_scaled is missing: the run behind metrics/train.json d32_scaled is gone" in out, out
    (reference / "data/train/d32_scaled").mkdir()
    shutil.copy(reference / "data/train/d32_unscaled/spec.json", reference / "data/train/d32_scaled/spec.json")
    assert main(["check", "--root", str(reference), "--mode", "statistical"]) == 1
    assert "data/train differs from dvc.lock (its md5)" in capsys.readouterr().out
    shutil.rmtree(reference / "data/train")  # an untouched checkout: the folder is absent, nothing ran
    assert (reference / "dvc.lock").read_text(encoding="utf-8") == lock
    assert main(["check", "--root", str(reference), "--mode", "statistical"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    _edit(reference / "metrics/train.json", lambda d: d["d32_scaled"].__setitem__("loss_final", 3.99))
    rc, out = check(reference, capsys)  # a run since the reference (dvc.lock rewritten) with its folder gone
    assert rc == 1 and "data/train is missing, but dvc.lock records train as run since the reference" in out, out


def test_a_reference_with_an_unreadable_primary_endpoint_fails(reference, capsys):
    from attnrepro.commands.main import main

    claims = reference / "claims.yaml"
    text = claims.read_bytes()
    metric = b"train.comparison.gap_d256_loss_final"  # the first primary endpoint
    assert metric in text
    claims.write_bytes(text.replace(metric, b"train.comparison.gap_d2\xff56_loss_final", 1))
    _git(reference, "commit", "-qam", "a damaged reference")
    assert main(["check", "--root", str(reference), "--mode", "statistical"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("check: FAIL") and "- the reference HEAD:claims.yaml cannot be read: not UTF-8 text at " \
                                              "line" in out and "train.comparison.gap_d2" in out, out
    claims.write_bytes(text.replace(metric, b"train.comparison.gap_d256_loss_finale", 1))  # a key the metrics lack
    _git(reference, "commit", "-qam", "a reference naming a missing metric")
    rc, out = check(reference, capsys)
    assert rc == 1 and "- primary endpoint train.comparison.gap_d256_loss_finale: named by HEAD's claims.yaml, but " \
                       "HEAD's metrics have no such value" in out, out


def test_forged_summaries_over_seeds_claims_and_headline_fail_naming_them(reference, capsys):
    """seeds.json, claims_summary.json's counts and headline.json are made again from their inputs by their
    producers' functions (each forged with dvc.lock rewritten to match)."""
    for file, change, named in (
            ("seeds", lambda d: d["gap_ratio_of_means_loss_final"].__setitem__("value", 9.9),
             "metrics/seeds.json seeds.gap_ratio_of_means_loss_final.value = 9.9, but recomputed"),
            ("claims_summary", lambda d: d["conclusion"].__setitem__("failed", 0),
             "metrics/claims_summary.json claims_summary.conclusion.failed = 0, but recomputed"),
            ("headline", lambda d: d["claims"]["conclusion"].__setitem__("passed", 33),
             "metrics/headline.json headline.claims.conclusion.passed = 33, but recomputed"),
            ("dist/train", lambda d: d["runs"]["1"]["comparison"].__setitem__("gap_d32_loss_final", 0.5),
             "metrics/dist/train.json dist/train.runs.1.comparison.gap_d32_loss_final = 0.5, but recomputed")):
        path = reference / f"metrics/{file}.json"
        before = path.read_bytes()
        _edit(path, change)
        rc, out = check(reference, capsys)
        assert rc == 1 and named in out, (file, out)
        path.write_bytes(before)
