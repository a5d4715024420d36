"""The machine and software a result was produced on, recorded beside every metric."""

from __future__ import annotations

import platform

import torch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict:
    """Name, driver and memory of GPU 0 via NVML; empty when there is no NVIDIA GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        info = {
            "gpu_name": name.decode() if isinstance(name, bytes) else name,
            "gpu_driver": _str(pynvml.nvmlSystemGetDriverVersion()),
            "gpu_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
        }
        try:
            info["gpu_max_sm_clock_mhz"] = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
        except Exception:
            pass
        return info
    finally:
        pynvml.nvmlShutdown()


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def environment(device: str = "cpu") -> dict:
    """A deterministic description of this machine (no timestamps)."""
    import psutil

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(terse=True),
        "cpu": cpu_model(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "ram_bytes": psutil.virtual_memory().total,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "cuda_available": torch.cuda.is_available(),
    }
    if device.startswith("cuda"):
        env.update(gpu_info())
    return env


def setup_determinism(threads: int, device: str = "cpu") -> None:
    """Pin the thread count and turn on deterministic algorithms.

    The thread count is part of the result on CPU: reductions split across a
    different number of threads round differently.
    """
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.startswith("cuda"):
        import os

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
