"""benchmark + latency stage: statistics, FLOP convention, OOM as a data point, CPU fallback."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnrepro.measure import timing as bm
from attnrepro.experiments import latency as lat

ROOT = Path(__file__).resolve().parents[1]
# one thread: on a shared, oversubscribed CPU two OpenMP threads can be 50x slower


def run_stage_script(name):
    """The stage script as `python stages/<name>.py` runs it (argv from sys.argv)."""
    runpy.run_path(str(ROOT / "stages" / f"{name}.py"), run_name="__main__")


def test_fit_exponent_recovers_power_law():
    ns = [128, 256, 512, 1024]
    assert bm.fit_exponent(ns, [3e-6 * n ** 2 for n in ns]) == pytest.approx(2.0)
    assert bm.fit_exponent(ns, [0.5 * n ** 1.5 for n in ns]) == pytest.approx(1.5)


def test_summarize_percentiles_and_cv():
    s = bm.summarize([float(x) for x in range(1, 11)])
    assert s["median_ms"] == 5.5 and s["p20_ms"] == pytest.approx(2.8) and s["p80_ms"] == pytest.approx(8.2)
    assert s["cv"] == pytest.approx(3.02765 / 5.5, rel=1e-4) and s["reps"] == 10


@pytest.mark.parametrize("cold", [True, False])
def test_measure_calls_and_keys(cold):
    calls = []
    out = bm.measure(lambda: calls.append(1), "cpu", warmup=2, reps=3, cold=cold)
    assert len(calls) == int(cold) + 2 + 3 and out["reps"] == 3
    assert ("cold_ms" in out) == cold


def test_causal_flops_convention():
    assert lat.causal_flops(512, 64, 8) == 4 * 512 ** 2 * 64 * 8 / 2


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 989.4), ("NVIDIA H200 NVL", 835.5),
                                       ("NVIDIA H100 80GB HBM3", 989.4),
                                       ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                       ("NVIDIA RTX A6000", 154.8), ("NVIDIA H100 NVL", None),
                                       ("NVIDIA GeForce GTX 1080", None), ("", None)])
def test_peak_table(name, peak):
    assert lat.peak_tflops(name) == peak


def test_peak_table_matches_the_most_specific_name():
    """"H200" is inside "H200 NVL": the longer name wins whatever the table's order."""
    for name, _ in lat.PEAK_TFLOPS_FP16:
        assert lat.peak_tflops(f"NVIDIA {name}") == dict(lat.PEAK_TFLOPS_FP16)[name]


def test_gpu_name_falls_back_to_torch_without_nvml(monkeypatch):
    monkeypatch.setattr(lat, "gpu_info", lambda device="cuda": {})
    monkeypatch.setattr(lat.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 NVL")
    assert lat.gpu_name("cuda") == "NVIDIA H200 NVL" and lat.peak_tflops(lat.gpu_name("cuda")) == 835.5
    monkeypatch.setattr(lat, "gpu_info", lambda device="cuda": {"gpu_name": "NVIDIA H200"})
    assert lat.gpu_name("cuda") == "NVIDIA H200"


def test_run_point_cpu_has_no_gpu_keys():
    row = lat.run_point("sdpa", 64, heads=2, d_head=16, dtype=torch.float32, device="cpu", warmup=1, reps=3)
    assert row["oom"] == 0 and row["median_ms"] > 0 and row["reps"] == 3 and row["tflops"] > 0
    assert "peak_bytes" not in row and "frac_peak" not in row
    naive = lat.run_point("naive", 64, heads=2, d_head=16, dtype=torch.float32, device="cpu", warmup=0, reps=2)
    assert naive["nxn_bytes"] == 64 * 64 * 2 * 4


def test_oom_is_a_data_point(monkeypatch):
    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setattr(lat, "attention", boom)
    row = lat.run_point("naive", 128, heads=2, d_head=16, dtype=torch.float32, device="cpu", warmup=1, reps=3)
    assert row["oom"] == 1 and "median_ms" not in row
    ok = lat.run_point("sdpa", 128, heads=2, d_head=16, dtype=torch.float32, device="cpu", warmup=0, reps=2)
    assert ok["oom"] == 0  # the fused path is unaffected


def test_other_errors_are_not_swallowed(monkeypatch):
    monkeypatch.setattr(lat, "attention", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad shape")))
    with pytest.raises(RuntimeError, match="bad shape"):
        lat.run_point("naive", 32, heads=1, d_head=8, dtype=torch.float32, device="cpu", warmup=0, reps=1)


def test_latency_stage_cpu_fallback_with_mocked_oom(tmp_path, monkeypatch):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    sec = dict(params["latency"], device="cpu", heads=2, d_head=16, cpu_n=[32, 64, 128], naive_cpu_n=[32, 64, 128],
               cpu_reps=3, cpu_warmup=1)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"latency": sec}), encoding="utf-8")
    real = lat.attention

    def attention_oom_at_128(q, k, v, **kw):
        if q.shape[-2] >= 128:
            raise torch.OutOfMemoryError("mocked")
        return real(q, k, v, **kw)

    monkeypatch.setattr(lat, "attention", attention_oom_at_128)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["latency.py"])
    run_stage_script("latency")
    m = json.loads((tmp_path / "metrics/latency.json").read_text())
    assert m["setup"]["cuda"] == 0 and m["setup"]["reps"] == 3
    assert "gpu_memory_bytes" not in m["device"] and not any(k.startswith("peak_tflops") for k in m["device"])
    flat = {k for sec in m.values() for k in sec}
    assert not any("frac_peak" in k or "peak_bytes" in k for k in flat)
    assert m["naive_fp32"]["n128_oom"] == 1 and m["naive_fp32"]["oom_count"] == 1
    assert "n128_mean_ms" not in m["naive_fp32"] and "n64_mean_ms" in m["naive_fp32"]
    assert "exponent" in m["sdpa_fp32"] and m["sdpa_fp32"]["oom_count"] == 0
    csv = (tmp_path / "plots/latency/latency.csv").read_text().splitlines()
    assert csv[0].startswith("impl,dtype,n,oom") and len(csv) == 7
    # the plotted series: one per impl x dtype, measured points only (the OOM row is left out)
    series = (tmp_path / "plots/latency/mean_ms.csv").read_text().splitlines()
    assert series[0] == "series,n,mean_ms,p20_ms,p80_ms" and len(series) == 1 + 5
    assert sorted({r.split(",")[0] for r in series[1:]}) == ["naive fp32", "sdpa fp32"]
    assert (tmp_path / "plots/latency/latency.png").stat().st_size > 1000
    env = json.loads((tmp_path / "metrics/env/latency.json").read_text())
    assert env["device"] == "cpu" and "gpu_name" not in env


def test_latency_stage_rejects_cuda_without_cuda(tmp_path, monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"latency": {**params["latency"], "device": "cuda"}}),
                                          encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["latency.py"])
    with pytest.raises(SystemExit) as e:
        run_stage_script("latency")
    assert e.value.code == 2 and "latency.device" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_point_has_peak_memory_and_events():
    row = lat.run_point("naive", 1024, heads=8, d_head=64, dtype=torch.float16, device="cuda", warmup=2, reps=5)
    assert row["oom"] == 0 and row["peak_bytes"] >= row["nxn_bytes"]
    sdpa = lat.run_point("sdpa", 1024, heads=8, d_head=64, dtype=torch.float16, device="cuda", warmup=2, reps=5)
    assert sdpa["peak_bytes"] < row["peak_bytes"]  # the fused kernel never holds n x n
    assert sdpa["backend"] not in ("unknown", "ERROR") and sdpa["calls_per_rep"] >= 1 and "backend" not in row


def test_train_overhead_refuses_to_time_a_dvc_repro_that_is_no_no_op(tmp_path):
    """`train_overhead.py --dvc` once ran a plain `dvc repro` with its output hidden and called it a
    no-op, whatever was stale (a sweep: hours)."""
    import os
    import subprocess

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "dvc.yaml").write_text("stages:\n  s:\n    cmd: touch ran\n    outs: [out]\n")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "train_overhead.py"
    p = subprocess.run([sys.executable, str(script), "--dvc", "--steps", "1", "--chunks", "1"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "lists 1 stale stage (s)" in p.stderr and p.stdout == "", p.stderr
    assert not (tmp_path / "ran").exists()


def test_sweep_benchmark_compares_runs_without_their_timing(tmp_path):
    """benchmarks/sweep.py's byte-identity check: a timing record, and the manifest's entry for it,
    may differ between modes; any other byte may not (the manifest alone once made it say NO)."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("sweep_bench", ROOT / "benchmarks" / "sweep.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def run(name: str, timing: str, history: str) -> SimpleNamespace:
        d = tmp_path / name
        d.mkdir()
        files = {"history.json": history, "timing.json": timing}
        for f, text in files.items():
            (d / f).write_text(text)
        (d / "MANIFEST.json").write_text(json.dumps({f: {"size": len(t), "sha256": str(hash(t))}
                                                     for f, t in files.items()}))
        return SimpleNamespace(path=d)

    a, b, c = run("a", "1.0", "[1]"), run("b", "2.5", "[1]"), run("c", "1.0", "[2]")
    assert bench.results([a]) == bench.results([b])
    assert bench.results([a]) != bench.results([c])


# ---------------------------------------------------------------- the CUDA discipline, on a fake clock (issue 44)

class FakeCuda:
    """torch.cuda's events and synchronize over a fake GPU on which every call takes 0.01 ms."""

    def __init__(self):
        self.calls, self.syncs = 0, []

    def fn(self):
        self.calls += 1

    def event(self, enable_timing=False):
        gpu = self

        class Event:
            def record(self):
                self.at = gpu.calls

            def elapsed_time(self, end):
                return (end.at - self.at) * 0.01

        return Event()

    def synchronize(self):
        self.syncs.append(self.calls)


def test_cuda_timing_measures_back_to_back_calls_after_a_time_based_warm_up(monkeypatch):
    gpu = FakeCuda()
    monkeypatch.setattr(bm.torch.cuda, "Event", gpu.event)
    monkeypatch.setattr(bm.torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(bm, "CUDA_WARMUP_S", 0.05)
    out = bm.measure(gpu.fn, "cuda", warmup=2, reps=5)
    assert out["calls_per_rep"] == 200 and out["median_ms"] == pytest.approx(0.01) and out["reps"] == 5
    assert out["warmup_calls"] > 2 + 8  # ran for CUDA_WARMUP_S, not for `warmup` calls
    timed = gpu.calls - 5 * 200
    assert gpu.syncs[-1] == gpu.calls and [s for s in gpu.syncs if s > timed] == [gpu.calls]  # no sync between reps
    assert "cold_ms" in out


def cuda_rows(medians: dict[int, float], skew: float = 2.0) -> list[dict]:
    return [{"impl": "sdpa", "dtype": "fp16", "n": n, "oom": 0, "median_ms": t, "mean_ms": t * (skew if n < 2048 else 1),
             "p20_ms": t, "p80_ms": t, "cv": 0.1, "cold_ms": 5.0, "reps": 30, "calls_per_rep": 50,
             "backend": "FLASH_ATTENTION", "tflops": 1.0} for n, t in medians.items()]


def test_cuda_exponent_is_fitted_on_the_median_where_the_gpu_is_occupied(monkeypatch):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    cfg = lat.LatencyConfig(**params["latency"])
    monkeypatch.setattr(lat, "gpu_info", lambda device="cuda": {})
    monkeypatch.setattr(lat.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 NVL")
    medians = {512: 0.03, 1024: 0.031, 2048: 0.05, 4096: 0.18, 8192: 0.7}
    m = lat.metrics_from(cuda_rows(medians), cfg, "cuda", {"cpu_cores_logical": 16, "ram_bytes": 1})
    sec = m["sdpa_fp16"]
    busy = [n for n in medians if n >= 2048]
    assert sec["exponent"] == pytest.approx(bm.fit_exponent(busy, [medians[n] for n in busy]))
    assert sec["exponent_all"] == pytest.approx(bm.fit_exponent(list(medians), list(medians.values())))
    assert sec["backend"] == "FLASH_ATTENTION" and sec["n8192_calls_per_rep"] == 50
    assert m["device"]["peak_tflops_fp16"] == 835.5


def test_cpu_metrics_keep_their_committed_definitions():
    """On the CPU the exponent stays the mean fit over every n, and no CUDA-only key appears."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    cfg = lat.LatencyConfig(**params["latency"])
    rows = [{k: v for k, v in r.items() if k not in ("calls_per_rep", "backend")}
            for r in cuda_rows({128: 1.0, 256: 3.0, 512: 11.0})]
    sec = lat.metrics_from(rows, cfg, "cpu", {"cpu_cores_logical": 2, "ram_bytes": 1})["sdpa_fp16"]
    assert sec["exponent"] == pytest.approx(bm.fit_exponent([128, 256, 512], [2.0, 6.0, 22.0]))
    assert not any(k.endswith(("calls_per_rep", "backend")) or k == "exponent_all" for k in sec)
