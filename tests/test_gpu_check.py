"""scripts/gpu_check.sh, dry-run on the CPU (GPU_CHECK_DEVICE=cpu): what it leaves under $OUT must
come back from a GPU machine, which carries at most 8 files, at most 2 folders deep."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAX_FILES, MAX_DEPTH = 8, 2  # what a GPU machine's $OUT carries back


def tiny_params(path: Path) -> Path:
    """params.yaml with the latency and kv_cache sweeps cut to seconds."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["latency"].update(heads=2, d_head=16, cpu_n=[32, 64, 128], naive_cpu_n=[32, 64], cpu_reps=3, cpu_warmup=1)
    kv = params["kv_cache"]
    kv["model"].update(block_size=64, d_model=32)
    kv.update(contexts=[8, 16, 32], reps=2, warmup=1, identity_tokens=8, gen_tokens=8, seq_lens=[64])
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def test_gpu_check_dry_run_fits_what_comes_back(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable,
           "GPU_CHECK_PARAMS": str(tiny_params(tmp_path / "params.yaml")), "PYTHONPATH": ""}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file() or p.is_symlink()]
    assert len(files) <= MAX_FILES, files
    assert all(len(f.parts) - 1 <= MAX_DEPTH for f in files), files
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    summary = (out / "SUMMARY.txt").read_text(encoding="utf-8")
    assert summary in proc.stdout  # printed as well as written
    assert "status: 0" in summary and "device slug: cpu-dry-run" in summary
    assert "sdpa_fp32 n 128: median" in summary and "kv_cache on the CPU: speed-up at context 32" in summary
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = set(tar.getnames())
    for name in ("latency.json", "kv_cache.json", "env_latency.json", "env_kv_cache.json"):
        assert f"metrics/gpu/cpu-dry-run/{name}" in names, sorted(names)
    for name in ("preflight", "latency", "kv_cache", "pytest_gpu"):
        assert f"logs/{name}.log" in names, sorted(names)
    assert "plots/gpu/cpu-dry-run/latency/latency.png" in names


def test_gpu_check_runs_every_gpu_test_file():
    script = (ROOT / "scripts/gpu_check.sh").read_text(encoding="utf-8")
    mark = "@pytest.mark." + "gpu"  # (spelt so that this file does not carry it)
    marked = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if mark in p.read_text(encoding="utf-8"))
    assert "test_envinfo.py" in marked
    for name in marked:
        assert f"tests/{name}" in script, f"gpu_check.sh leaves out {name}"
