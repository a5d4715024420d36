"""End to end: `dvc repro train` on a tiny configuration in a copy of the repo.

Marked slow for selection only; it runs in the default `pytest` invocation.
Covers the §9 metrics contract of the spine (corpus, train), `dvc metrics diff`,
a no-op second repro, and byte-identical metrics after a forced rerun.
"""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnrepro.model.transformer import TinyGPT

from conftest import copy_repo, make_fake_corpus, tiny_train_section, tinygpt

pytestmark = pytest.mark.slow

VARIANTS = ("d32_unscaled", "d32_scaled", "d256_unscaled", "d256_scaled")
CORPUS_KEYS = {"poems", "chars", "distinct_chars", "vocab_size", "coverage", "train_tokens", "val_tokens"}
TRAIN_KEYS = {"params", "loss_start", "loss_final", "loss_last_step", "val_loss_final", "entropy_final",
              "logit_std_final", "jacobian_fro_final", "entropy_final_l0", "entropy_final_l1",
              "logit_std_final_l1", "jacobian_fro_final_l1"}
BIN = Path(sys.executable).parent


def sh(args, cwd, check=True):
    env = dict(os.environ, DVC_NO_ANALYTICS="1", PYTHONHASHSEED="0",
               PATH=str(BIN) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=str(Path(cwd) / "src"))
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def dvc(*args, cwd, check=True):
    return sh([str(BIN / "dvc"), *args], cwd, check)


def git(*args, cwd):
    return sh(["git", "-c", "user.name=attnrepro-tests", "-c", "user.email=tests@attnrepro.invalid",
               "-c", "commit.gpgsign=false", *args], cwd)


def snapshot(repo: Path) -> dict[str, bytes]:
    files = [repo / "metrics/corpus.json", repo / "metrics/train.json",
             *sorted((repo / "plots/train").glob("*.csv"))]
    return {str(f.relative_to(repo)): f.read_bytes() for f in files}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    repo = copy_repo(root / "repo")
    files = make_fake_corpus(root / "corpus")
    params = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    params["corpus"].update(source="local", local_dir=str(root / "corpus"), files=files, vocab_size=40)
    params["train"] = tiny_train_section(params["train"])
    assert set(params["train"]["variants"]) == set(VARIANTS)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False),
                                      encoding="utf-8")
    git("init", "-q", cwd=repo)
    dvc("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "tiny pipeline", cwd=repo)
    first = dvc("repro", "train", cwd=repo)
    return type("Pipeline", (), {"repo": repo, "params": params, "first": first})


def test_corpus_contract(pipeline):
    m = json.loads((pipeline.repo / "metrics/corpus.json").read_text(encoding="utf-8"))
    assert CORPUS_KEYS <= set(m)
    assert m["vocab_size"] == 40 and m["poems"] == 48
    rules = m.pop("by_newline")  # the text under each newline rule (corpus.NEWLINE_RULES)
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in m.values())
    assert set(rules) == {"unk", "token", "drop", "poems"} and rules["unk"]["tokens"] == m["tokens"]
    assert rules["drop"]["tokens"] == m["chars"] < rules["poems"]["tokens"] < rules["token"]["tokens"] == m["tokens"]


def test_train_contract(pipeline):
    m = json.loads((pipeline.repo / "metrics/train.json").read_text(encoding="utf-8"))
    assert set(VARIANTS) <= set(m)
    train = pipeline.params["train"]
    for name in VARIANTS:
        v = m[name]
        assert TRAIN_KEYS <= set(v), name
        assert all(isinstance(x, (int, float)) and math.isfinite(x) for x in v.values()), name
        shape = train["models"][train["variants"][name]["model"]]
        assert v["params"] == TinyGPT(tinygpt(vocab_size=40, **shape)).num_params()
        assert v["loss_start"] == pytest.approx(math.log(40), abs=0.5)  # near-uniform at init
        assert 0 <= v["entropy_final"] <= 1
        for step in train["diag_steps"]:
            assert f"entropy_step{step}" in v
    comp = m["comparison"]
    assert {"gap_d8_loss_final", "gap_d16_loss_final", "gap_d8_val_loss_final"} <= set(comp)
    assert comp["gap_d8_loss_final"] == pytest.approx(
        m["d32_unscaled"]["loss_final"] - m["d32_scaled"]["loss_final"], abs=1e-5)
    for name in VARIANTS:
        rows = (pipeline.repo / f"plots/train/{name}.csv").read_text(encoding="utf-8").splitlines()
        assert rows[0].startswith("step,") and len(rows) == 1 + train["steps"]
    assert "## d256_scaled" in (pipeline.repo / "plots/train/samples.md").read_text(encoding="utf-8")


def test_metrics_diff_runs(pipeline):
    # metrics/*.json are plain outputs (the one declared metric is metrics/headline.json): name them
    proc = dvc("metrics", "diff", "--json", "--targets", "metrics/train.json", "metrics/corpus.json", cwd=pipeline.repo)
    diff = json.loads(proc.stdout or "{}")
    assert "metrics/train.json" in diff and "metrics/corpus.json" in diff


def test_second_repro_is_noop_and_forced_rerun_is_identical(pipeline):
    repo = pipeline.repo
    before = snapshot(repo)
    again = dvc("repro", "train", cwd=repo)
    assert "Running stage" not in again.stdout, again.stdout
    assert "up to date" in again.stdout, again.stdout
    assert snapshot(repo) == before

    for p in ("data/corpus", "data/train", "plots/train", "runs"):  # runs/: the run store, so it retrains
        shutil.rmtree(repo / p)
    for p in ("metrics/corpus.json", "metrics/train.json"):
        (repo / p).unlink()
    forced = dvc("repro", "-f", "--no-run-cache", "train", cwd=repo)
    assert forced.stdout.count("Running stage") == 2, forced.stdout
    assert f"{len(VARIANTS)} to train" in forced.stdout
    after = snapshot(repo)
    assert after.keys() == before.keys()
    for k in before:
        assert after[k] == before[k], f"{k} differs between two runs of the same params"


def test_one_variant_changed_retrains_only_that_run(pipeline):
    """Per-variant granularity: DVC reruns the stage, the run store trains only the changed run."""
    repo = pipeline.repo
    params = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    params["train"]["variants"]["d32_scaled"]["qk_norm"] = "layernorm"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")
    out = dvc("repro", "train", cwd=repo).stdout
    assert f"{len(VARIANTS)} runs, {len(VARIANTS) - 1} in the store" in out and "1 to train" in out, out
