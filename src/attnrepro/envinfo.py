"""The machine and software a result was produced on, recorded beside every metric.

Deterministic on one machine and checkout (no timestamps): the same tree and machine give the
same record. The GPU described is the one torch uses (CUDA_VISIBLE_DEVICES and `cuda:N`
respected), found in NVML by its PCI address, not NVML's device 0.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional, Sequence

import numpy
import psutil
import torch
from torch.utils import collect_env

from attnrepro.config import ConfigError


def cpu_model() -> str:
    """The CPU's model name, read from torch's own environment collector (lscpu on Linux, sysctl on
    macOS, WMI on Windows: the "Model name" /proc/cpuinfo also gives). py-cpuinfo gives the same
    field but takes 2.2 s per process here (it runs itself in a subprocess), once per stage."""
    text = collect_env.get_cpu_info(collect_env.run)
    names = [v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())
             if k.strip() in ("Model name", "Name") and v.strip()]
    if names:
        return names[0]
    if platform.system() == "Darwin" and text.strip() and "\n" not in text.strip():
        return text.strip()  # sysctl's brand string alone
    return platform.processor() or platform.machine()


PciAddress = tuple[int, int, int]  # (domain, bus, device)


def parse_pci(bus_id: str) -> Optional[PciAddress]:
    """'00000000:3B:00.0' (NVML) or '0000:3b:00.0' -> (domain, bus, device); None if unreadable."""
    m = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?\s*", bus_id or "")
    if m is None:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)


def visible_physical_index(index: int, cuda_visible_devices: Optional[str]) -> Optional[int]:
    """The physical (NVML) index of torch's device `index` from CUDA_VISIBLE_DEVICES when it lists
    plain indices; None when it holds UUIDs or MIG names, or does not cover `index`. (A fallback:
    it assumes CUDA orders devices as NVML does, i.e. CUDA_DEVICE_ORDER=PCI_BUS_ID.)"""
    if cuda_visible_devices is None:
        return index
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    if index >= len(entries) or not entries[index].isdigit():
        return None
    return int(entries[index])


def match_nvml_device(torch_pci: Optional[PciAddress], nvml_pcis: Sequence[Optional[PciAddress]], index: int,
                      cuda_visible_devices: Optional[str]) -> Optional[int]:
    """The NVML index of the device torch calls `index`: the NVML device with the same PCI address
    (domain, bus, device), else the CUDA_VISIBLE_DEVICES mapping; None when neither decides."""
    if torch_pci is not None:
        hits = [i for i, p in enumerate(nvml_pcis) if p == torch_pci]
        if len(hits) == 1:
            return hits[0]
    j = visible_physical_index(index, cuda_visible_devices)
    return j if j is not None and 0 <= j < len(nvml_pcis) else None


def torch_device_index(device: str) -> int:
    """torch's index of `device`: N for 'cuda:N', the current device for 'cuda'."""
    if ":" in device:
        return int(device.split(":", 1)[1])
    return torch.cuda.current_device()


def torch_pci(index: int) -> Optional[PciAddress]:
    """PCI address of torch's CUDA device `index` (None where this torch build does not say)."""
    props = torch.cuda.get_device_properties(index)
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    return tuple(int(x) for x in parts) if all(x is not None for x in parts) else None


def gpu_info(device: str = "cuda") -> dict:
    """Name, driver, memory and PCI address of the GPU torch uses for `device`, via NVML; empty
    when there is no NVIDIA GPU, no NVML, or the device cannot be matched."""
    try:
        import pynvml  # the optional gpu extra (nvidia-ml-py), imported where it is used: tests replace it

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        index = torch_device_index(device) if torch.cuda.is_available() else 0
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        pcis = [parse_pci(_str(pynvml.nvmlDeviceGetPciInfo(h).busId)) for h in handles]
        mine = torch_pci(index) if torch.cuda.is_available() else None
        j = match_nvml_device(mine, pcis, index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if j is None:
            return {}
        h = handles[j]
        info = {
            "gpu_name": _str(pynvml.nvmlDeviceGetName(h)),
            "gpu_driver": _str(pynvml.nvmlSystemGetDriverVersion()),
            "gpu_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            "gpu_pci_bus_id": "{:04x}:{:02x}:{:02x}.0".format(*pcis[j]) if pcis[j] else None,
            "gpu_nvml_index": j,
        }
        try:
            info["gpu_max_sm_clock_mhz"] = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
        except Exception:
            pass
        return info
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()


# outputs of the pipeline: regenerating them does not make the checkout "dirty"
PIPELINE_OUTPUTS = ("dvc.lock", "metrics", "plots", "report")


def git_state(path: Optional[Path] = None) -> dict:
    """The git revision of the checkout holding this package's code (the code that ran) and whether
    its tracked files differ from that revision (the pipeline's outputs aside); nulls outside git."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    git = ["git", "-C", str(where)]
    try:
        rev = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
        if rev.returncode != 0:
            return {"git_revision": None, "git_dirty": None}
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ":/",
                                 *(f":(top,exclude){p}" for p in PIPELINE_OUTPUTS)],
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {"git_revision": None, "git_dirty": None}
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"git_revision": rev.stdout.strip(), "git_dirty": dirty}


def _version(dist: str) -> Optional[str]:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def environment(device: str = "cpu") -> dict:
    """A deterministic description of this machine (no timestamps)."""
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,  # the torch build's CUDA; null for a CPU build
        "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "numpy": numpy.__version__,
        # the other numeric libraries a stage's numbers pass through (scipy: the claims' row matching;
        # pandas and matplotlib: tables and figures; dask and distributed: the run engine)
        "scipy": _version("scipy"),
        "pandas": _version("pandas"),
        "matplotlib": _version("matplotlib"),
        "dask": _version("dask"),
        "distributed": _version("distributed"),
        "dvc": _version("dvc"),
        "platform": platform.platform(terse=True),
        "cpu": cpu_model(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "ram_bytes": psutil.virtual_memory().total,
        "torch_threads": torch.get_num_threads(),
        # the CPU kernels torch dispatches to (DEFAULT, AVX2, AVX512, ...): with the thread count,
        # what decides the float order of a CPU result
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": device,
        "cuda_available": torch.cuda.is_available(),
        **git_state(),
    }
    if device.startswith("cuda"):  # the GPU's name from torch, NVML's where it is installed (gpu_info)
        if torch.cuda.is_available():
            env["gpu_name"] = torch.cuda.get_device_name(torch_device_index(device))
        env.update(gpu_info(device))
    return env


RUN_MACHINE_KEYS = ("cpu", "torch", "python", "device", "torch_threads")


def stage_environment(device: str, runs: Sequence) -> dict:
    """This machine's record, for a stage whose runs (its sweep.RunRecords) may come from the run
    store or a cluster: `runs_on` says "this machine" when every run's own record agrees with it on
    the machine and software (a store or a cluster can hold runs trained elsewhere, in another float
    order); `numerics` names the numerics version each task's runs were keyed under, and `run_keys`
    fingerprints the runs (`attnrepro check` tells results of other numerics from the code at HEAD's)."""
    run_envs = [r.read("env.json") for r in runs]
    env = environment(device)
    env["numerics"] = dict(sorted({(r.spec.task, r.read("spec.json")["numerics"]) for r in runs}))
    env["run_keys"] = hashlib.sha256("\n".join(sorted(r.key for r in runs)).encode()).hexdigest()
    # the compute its runs cost when they were trained (each run's own wall time, wherever it ran), each
    # distinct run once: a sweep may use one run at two of its points
    distinct = list({r.key: r for r in runs}.values())
    env["runs"] = len(distinct)
    env["run_wall_seconds"] = round(sum(r.read("timing.json")["wall_seconds"] for r in distinct), 1)
    others = sorted({f"{e.get('cpu')}, torch {e.get('torch')}, {e.get('torch_threads')} thread(s)"
                     for e in run_envs if any(k in e and e[k] != env.get(k) for k in RUN_MACHINE_KEYS)})
    env["runs_on"] = "; ".join(others) if others else "this machine"
    return env


def setup_determinism(threads: int, device: str = "cpu", timing: bool = False) -> None:
    """Pin the thread count and turn on deterministic algorithms.

    The thread count is part of the result on CPU: reductions split across a
    different number of threads round differently.

    On CUDA a nondeterministic op raises (warn_only=False): the stages whose reruns must be
    identical fail loudly, never pass with a warning. The CPU keeps warn_only=True, the settings
    its committed results were made with. Timing stages (`timing`: latency, kv_cache) keep the
    warning and do not fill each new allocation with NaN (fill_uninitialized_memory), which would
    be work inside every timed call (SDPA's outputs, the naive path's n x n clones).
    """
    torch.set_num_threads(threads)
    cuda = device.startswith("cuda")
    torch.use_deterministic_algorithms(True, warn_only=timing or not cuda)
    torch.utils.deterministic.fill_uninitialized_memory = not timing
    if cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False


def resolve_device(name: str, key: str = "device") -> str:
    """'auto' picks CUDA when available; asking for CUDA without it is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{key}: got {name!r}, but this machine has no CUDA device (use 'cpu' or 'auto')")
    if name != "cpu" and not name.startswith("cuda"):
        raise ConfigError(f"{key}: got {name!r}, expected 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return name
