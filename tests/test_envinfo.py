"""The environment record: versions (torch, CUDA, cuDNN, numpy, scipy, pandas, matplotlib, dask,
distributed, dvc), the git revision of the code
that ran and whether it was dirty, and the GPU torch actually uses (matched in NVML by PCI
address, not NVML's device 0). Deterministic on one machine; the GPU paths skip on CPU."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from attnrepro import envinfo

ROOT = Path(__file__).resolve().parents[1]


NUMERIC_LIBRARIES = ("numpy", "scipy", "pandas", "matplotlib", "dask", "distributed")


def test_record_has_the_versions_and_is_deterministic():
    env = envinfo.environment("cpu")
    for key in ("python", "torch", "cuda_version", "cudnn_version", "numpy", "dvc", "git_revision", "git_dirty"):
        assert key in env, key
    import numpy

    assert env["numpy"] == numpy.__version__ and env["cuda_version"] == torch.version.cuda
    from importlib.metadata import version

    for dist in NUMERIC_LIBRARIES:  # every library a number passes through, by its installed version
        assert env[dist] == version(dist), dist
    if torch.version.cuda is None:  # a CPU build: no CUDA, no cuDNN
        assert env["cuda_version"] is None and env["cudnn_version"] is None
    assert isinstance(env["dvc"], str) and env["dvc"][0].isdigit()
    assert envinfo.environment("cpu") == env  # no timestamps


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false", *args],
                   cwd=cwd, check=True, capture_output=True)


def test_git_state(tmp_path):
    assert envinfo.git_state(tmp_path) == {"git_revision": None, "git_dirty": None}  # not a checkout
    (tmp_path / "src").mkdir()
    (tmp_path / "metrics").mkdir()
    (tmp_path / "src" / "code.py").write_text("x = 1\n")
    (tmp_path / "metrics" / "m.json").write_text("{}\n")
    _git("init", "-q", cwd=tmp_path)
    _git("add", "-A", cwd=tmp_path)
    _git("commit", "-q", "-m", "c", cwd=tmp_path)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert envinfo.git_state(tmp_path / "src") == {"git_revision": head, "git_dirty": False}
    (tmp_path / "metrics" / "m.json").write_text('{"a": 1}\n')  # an output of the pipeline: still clean
    (tmp_path / "new_untracked.txt").write_text("x")
    assert envinfo.git_state(tmp_path / "src")["git_dirty"] is False
    (tmp_path / "src" / "code.py").write_text("x = 2\n")
    assert envinfo.git_state(tmp_path / "src") == {"git_revision": head, "git_dirty": True}


@pytest.mark.parametrize("text,expected", [
    ("00000000:3B:00.0", (0, 0x3B, 0)),
    ("0000:3b:00.0", (0, 0x3B, 0)),
    ("00000001:C1:1F.0", (1, 0xC1, 0x1F)),
    ("3b:00", (0, 0x3B, 0)),
    ("garbage", None),
])
def test_parse_pci(text, expected):
    assert envinfo.parse_pci(text) == expected


# NVML lists devices by PCI address; CUDA's default order may differ (fastest first)
NVML = [(0, 0x18, 0), (0, 0x3B, 0), (0, 0x86, 0), (0, 0xAF, 0)]


@pytest.mark.parametrize("torch_pci,index,visible,expected", [
    ((0, 0x86, 0), 0, None, 2),        # matched by PCI address, whatever the indices say
    ((0, 0x86, 0), 0, "2,3", 2),       # CUDA_VISIBLE_DEVICES=2,3: torch's cuda:0 is NVML's 2
    ((0, 0xAF, 0), 1, "2,3", 3),       # cuda:1
    (None, 1, "2,3", 3),               # a torch without PCI fields: the visible-devices mapping
    (None, 0, None, 0),                # nothing to go by: the same index
    (None, 0, "GPU-8f2a5c1e", None),   # UUIDs in CUDA_VISIBLE_DEVICES and no PCI: undecided, not GPU 0
    ((0, 0x99, 0), 0, "GPU-8f2a5c1e", None),
])
def test_match_nvml_device(torch_pci, index, visible, expected):
    assert envinfo.match_nvml_device(torch_pci, NVML, index, visible) == expected


def test_gpu_info_without_nvidia_is_empty_or_matches():
    info = envinfo.gpu_info("cpu" if not torch.cuda.is_available() else "cuda")
    assert info == {} or {"gpu_name", "gpu_pci_bus_id", "gpu_nvml_index"} <= set(info)


def test_gpu_info_without_nvml_is_empty(monkeypatch):
    """nvidia-ml-py is an optional extra (pyproject.toml's `gpu`): without pynvml the record has no GPU
    fields, and nothing raises."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert envinfo.gpu_info("cuda") == {} and envinfo.gpu_info("cuda:1") == {}
    assert not any(k.startswith("gpu_") for k in envinfo.environment("cuda"))


class FakeNVML(types.ModuleType):
    """pynvml's calls that gpu_info makes, over two devices (NVML order: by PCI address)."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        super().__init__("pynvml")
        self.calls = []
        self.devices = [dict(name=b"Fake A", bus="00000000:18:00.0", mem=16 * 2**30, clock=1410),
                        dict(name="Fake B", bus="00000000:3B:00.0", mem=80 * 2**30, clock=1980)]

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=h["bus"].encode())

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlSystemGetDriverVersion(self):
        return b"999.1"

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=h["mem"])

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        assert clock == self.NVML_CLOCK_SM
        return h["clock"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fake NVML stands in for a GPU torch cannot see")
def test_gpu_info_through_nvml(monkeypatch):
    """With pynvml installed (the gpu extra) the GPU path reads the device CUDA_VISIBLE_DEVICES names:
    name, driver, memory, PCI address, SM clock (bytes or str from NVML alike), and shuts NVML down."""
    nvml = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert envinfo.gpu_info("cuda") == {"gpu_name": "Fake B", "gpu_driver": "999.1", "gpu_memory_bytes": 80 * 2**30,
                                        "gpu_pci_bus_id": "0000:3b:00.0", "gpu_nvml_index": 1,
                                        "gpu_max_sm_clock_mhz": 1980}
    assert nvml.calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2a5c1e")  # undecided: no record rather than the wrong GPU
    assert envinfo.gpu_info("cuda") == {} and nvml.calls[-1] == "shutdown"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert envinfo.gpu_info("cuda")["gpu_name"] == "Fake A"
    assert envinfo.environment("cuda")["gpu_name"] == "Fake A"


def test_real_nvml_has_what_gpu_info_calls():
    """Where nvidia-ml-py is installed, its pynvml has every call FakeNVML stands in for."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed (the optional gpu extra)")
    for name in [n for n in vars(FakeNVML) if n.startswith("nvml") or n.startswith("NVML")]:
        assert hasattr(pynvml, name), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_record_is_torchs_device():
    for i in range(torch.cuda.device_count()):
        info = envinfo.gpu_info(f"cuda:{i}")
        assert info["gpu_name"]
        pci = envinfo.torch_pci(i)
        if pci is not None:
            assert envinfo.parse_pci(info["gpu_pci_bus_id"]) == pci
    env = envinfo.environment("cuda:0")
    assert env["cuda_version"] == torch.version.cuda and env["cudnn_version"] is not None


def test_a_run_a_stage_uses_twice_counts_once_in_its_cost():
    from types import SimpleNamespace

    from attnrepro.envinfo import stage_environment

    def rec(key, secs):
        files = {"env.json": {}, "spec.json": {"numerics": 1}, "timing.json": {"wall_seconds": secs}}
        return SimpleNamespace(key=key, spec=SimpleNamespace(task="corpus_lm"), read=lambda f: files[f])
    env = stage_environment("cpu", [rec("a", 10.0), rec("b", 5.0), rec("a", 10.0)])
    assert env["runs"] == 2 and env["run_wall_seconds"] == 15.0


# ---------------------------------------------------------------- determinism settings (issue 44)

@pytest.fixture
def torch_settings(monkeypatch):
    """setup_determinism changes process-wide torch settings: put them back afterwards."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    yield
    torch.set_num_threads(saved[0])
    torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
    torch.utils.deterministic.fill_uninitialized_memory = saved[3]


def test_a_nondeterministic_cuda_op_fails_loudly_where_reruns_must_be_identical(torch_settings):
    envinfo.setup_determinism(1, "cuda")
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory
    envinfo.setup_determinism(1, "cpu")  # the CPU keeps the settings its committed results were made with
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_timing_stages_fill_no_new_memory_with_nan(torch_settings, device):
    envinfo.setup_determinism(1, device, timing=True)
    assert not torch.utils.deterministic.fill_uninitialized_memory  # work inside every timed call otherwise
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()


def test_the_timing_stages_and_only_they_pin_for_timing():
    stages = {p.stem: p.read_text(encoding="utf-8") for p in (ROOT / "stages").glob("*.py")}
    timing = {name for name, text in stages.items() if re.search(r"st\.pin\([^)]*timing=True", text)}
    assert timing == {"latency", "kv_cache"}


def test_a_cuda_record_names_the_gpu_without_nvml(monkeypatch):
    """Without NVML (the optional gpu extra) a CUDA stage's record still names its GPU, from torch: the name
    its GPU reference is filed under (judge.revision.device_slug, scripts/gpu_check.sh)."""
    from attnrepro import envinfo

    monkeypatch.setattr(envinfo, "gpu_info", lambda device: {})
    monkeypatch.setattr(envinfo, "torch_device_index", lambda device: 0)
    monkeypatch.setattr(envinfo.torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(envinfo.torch.cuda, "is_available", lambda: True)
    assert envinfo.environment("cuda")["gpu_name"] == "NVIDIA H200"
    monkeypatch.setattr(envinfo, "gpu_info", lambda device: {"gpu_name": "NVIDIA H200 NVL"})
    assert envinfo.environment("cuda")["gpu_name"] == "NVIDIA H200 NVL"
    assert "gpu_name" not in envinfo.environment("cpu")


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux only")
def test_cpu_model_is_the_model_name_machine_records_always_held():
    """torch's collector gives the CPU's "model name", the field earlier records were made with, so a
    reference record still names this machine."""
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")]
    assert envinfo.cpu_model() == (names[0] if names else envinfo.platform.processor() or envinfo.platform.machine())
