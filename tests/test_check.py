"""`attnrepro check`: workspace metrics vs a git revision, with tolerances, plus claims.

Every test builds its own temporary git repository (fixture metrics, the project's
real check.yaml, a small claims file), so nothing depends on the reference run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from attnrepro.cli import main

REPO = Path(__file__).resolve().parents[1]

TRAIN = {
    "d32_scaled": {"params": 425000, "loss_final": 4.1, "loss_start": 7.1, "entropy_final": 0.8,
                   "logit_std_final": 1.5},
    "d32_unscaled": {"params": 425000, "loss_final": 4.3, "loss_start": 7.1, "entropy_final": 0.7,
                     "logit_std_final": 9.0},
    "comparison": {"gap_d32_loss_final": 0.2, "gap_ratio_loss_final": 5.0},
}
# the real key layout of stages/latency.py: sdpa_<dtype>.n<N>_median_ms; fp16/bf16 exist only on CUDA
LATENCY = {"sdpa_fp32": {"n512_median_ms": 3.0}, "sdpa_fp16": {"n512_median_ms": 0.08}}
CLAIMS = {"claims": [
    {"id": "gap_grows", "section": "§2 train", "kind": "direction", "text": "gap grows", "gate": True,
     "expr": "train.comparison.gap_ratio_loss_final >= 3"},
    {"id": "loss_value", "section": "§2 train", "kind": "value", "text": "final loss", "gate": False,
     "value": "train.d32_scaled.loss_final", "published": 3.0, "tolerance": {"abs": 0.15},
     "reason": "fixture"},
    {"id": "gpu_fast", "section": "§7 latency", "kind": "direction", "text": "fast on GPU", "gate": True,
     "requires": "cuda", "expr": "latency.sdpa_fp16.n512_median_ms < 1"},
]}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def write_metrics(root: Path, train=None, latency=None, cuda: int = 0) -> None:
    (root / "metrics" / "env").mkdir(parents=True, exist_ok=True)
    for name, data in (("train", train or TRAIN), ("latency", latency or LATENCY)):
        (root / "metrics" / f"{name}.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
        (root / "metrics" / "env" / f"{name}.json").write_text(
            json.dumps({"cuda_available": cuda, "device": "cuda" if cuda else "cpu"}), encoding="utf-8")


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "r"
    root.mkdir()
    git(root, "init", "-q")
    shutil.copy(REPO / "check.yaml", root / "check.yaml")
    (root / "claims.yaml").write_text(yaml.safe_dump(CLAIMS), encoding="utf-8")
    write_metrics(root, cuda=1)  # the reference was made on a GPU machine
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "reference")
    return root


def check(root: Path, capsys, *args: str) -> tuple[int, str]:
    rc = main(["check", "--root", str(root), *args])
    out = capsys.readouterr()
    return rc, out.out + out.err


def perturbed(path: tuple[str, str], delta: float) -> dict:
    t = json.loads(json.dumps(TRAIN))
    t[path[0]][path[1]] += delta
    return t


def test_passes_when_workspace_equals_reference(repo, capsys):
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert "check: OK" in out


def test_fails_beyond_tolerance_and_names_the_metric(repo, capsys):
    write_metrics(repo, train=perturbed(("d32_scaled", "loss_final"), +0.2), cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 1
    assert "DRIFT" in out and "train.d32_scaled.loss_final" in out.split("check: FAILED")[1]


def test_passes_within_tolerance(repo, capsys):
    write_metrics(repo, train=perturbed(("d32_scaled", "loss_final"), +0.01), cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert "d32_scaled.loss_final" in out  # the change is shown, with its verdict
    assert "| ok |" in out


def test_lower_loss_is_improvement_not_failure(repo, capsys):
    write_metrics(repo, train=perturbed(("d32_scaled", "loss_final"), -0.3), cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert "improved" in out


def test_parameter_count_is_exact(repo, capsys):
    write_metrics(repo, train=perturbed(("d32_scaled", "params"), +1), cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 1 and "train.d32_scaled.params" in out and "exact" in out


def test_failed_directional_claim_fails_even_when_committed(repo, capsys):
    bad = perturbed(("comparison", "gap_ratio_loss_final"), -3.0)  # 2.0 < 3
    write_metrics(repo, train=bad, cuda=1)
    git(repo, "commit", "-qam", "bad reference")
    rc, out = check(repo, capsys)
    assert rc == 1
    assert "claim gap_grows failed" in out


def test_informational_value_claim_does_not_gate(repo, capsys):
    rc, out = check(repo, capsys, "--all")  # loss 4.1 vs published 3.0 +- 0.15: off, not gated
    assert rc == 0
    assert "| loss_value |" in out and "| off |" in out


def test_missing_metric_fails(repo, capsys):
    t = json.loads(json.dumps(TRAIN))
    del t["d32_unscaled"]["entropy_final"]
    write_metrics(repo, train=t, cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 1 and "train.d32_unscaled.entropy_final" in out and "missing" in out


def test_missing_file_fails(repo, capsys):
    (repo / "metrics" / "train.json").unlink()
    rc, out = check(repo, capsys, "--no-claims")
    assert rc == 1 and "metrics/train.json is in HEAD" in out


def test_gpu_only_metrics_and_claims_are_skipped_on_cpu(repo, capsys):
    write_metrics(repo, latency={"sdpa_fp32": {"n512_median_ms": 3.0}}, cuda=0)  # a CPU run: no CUDA metrics
    rc, out = check(repo, capsys, "--all")
    assert rc == 0, out
    assert "| sdpa_fp16.n512_median_ms |" in out and "skipped" in out
    assert "| gpu_fast |" in out and "| skipped |" in out
    assert "check: OK" in out


def test_gpu_only_metric_missing_on_gpu_run_fails(repo, capsys):
    write_metrics(repo, latency={"sdpa_fp32": {"n512_median_ms": 3.0}}, cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 1 and "latency.sdpa_fp16.n512_median_ms" in out


def test_timings_are_reported_not_gated(repo, capsys):
    write_metrics(repo, latency={"sdpa_fp32": {"n512_median_ms": 30.0}, "sdpa_fp16": {"n512_median_ms": 0.8}}, cuda=1)
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert "changed" in out and "not gated" in out


def test_other_revision_and_bad_revision(repo, capsys):
    write_metrics(repo, train=perturbed(("d32_scaled", "loss_final"), +0.2), cuda=1)
    git(repo, "commit", "-qam", "second")
    assert check(repo, capsys)[0] == 0                    # vs HEAD: equal
    rc, out = check(repo, capsys, "--rev", "HEAD~1")       # vs the first commit: drift
    assert rc == 1 and "HEAD~1" in out
    rc, out = check(repo, capsys, "--rev", "no-such-rev")
    assert rc == 2 and out.startswith("error: --rev") and out.count("\n") == 1


def test_bad_config_is_one_line(repo, capsys):
    (repo / "check.yaml").write_text("rules:\n  - match: '*'\n    rel: fast\n", encoding="utf-8")
    rc, out = check(repo, capsys)
    assert rc == 2 and "rules[0].rel" in out and out.count("\n") == 1


def test_project_check_config_rules():
    from attnrepro.check import load_check_config
    cfg = load_check_config(REPO / "check.yaml")
    assert cfg.rule_for("train.d32_scaled.params").exact
    assert cfg.rule_for("corpus.distinct_chars").exact
    assert cfg.rule_for("train.d256_scaled.loss_final").better == "lower"
    assert not cfg.rule_for("latency.sdpa_fp32.n512_median_ms").gate
    assert not cfg.rule_for("latency.naive_fp32.exponent").gate
    assert not cfg.rule_for("kv_cache.latency.cached_ms_n16").gate
    assert not cfg.rule_for("kv_cache.latency.speedup_n1024").gate
    assert not cfg.rule_for("kv_cache.latency.gen_uncached_s").gate
    # GPU-only keys as stages/latency.py and stages/kv_cache.py write them on CUDA
    for key in ("latency.sdpa_fp16.n8192_median_ms", "latency.sdpa_bf16.n512_cold_ms",
                "latency.naive_fp16.n65536_oom", "latency.device.gpu_memory_bytes",
                "latency.device.peak_tflops_fp16", "kv_cache.cache.cuda_allocated_delta",
                "kv_cache.cache.cuda_delta_minus_formula"):
        assert cfg.is_gpu_only(key), key
    for key in ("latency.sdpa_fp32.n512_median_ms", "latency.setup.cuda", "kv_cache.latency.cuda",
                "kv_cache.cache.nbytes_measured"):
        assert not cfg.is_gpu_only(key), key
    # heads / failures: deterministic on one machine, small tolerances for another
    assert cfg.rule_for("heads.n_positions").exact
    assert cfg.rule_for("failures.mask_zero.check_future_zero").exact
    assert cfg.rule_for("failures.correct.caught_by_intended").exact
    assert not cfg.rule_for("failures.no_stable_softmax.check_boundary_value").exact
    r = cfg.rule_for("heads.l0h1.entropy")
    assert r.gate and not r.exact and 0 < r.tolerance(0.5) <= 0.05
    r = cfg.rule_for("failures.dk_not_sqrt.entropy")
    assert r.gate and not r.exact and 0 < r.tolerance(0.9) <= 0.05
    assert cfg.rule_for("train.comparison.gap_d32_loss_final").better is None
