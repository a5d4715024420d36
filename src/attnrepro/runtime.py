"""Device selection and a progress bar that behaves under `dvc repro` and in CI logs."""

from __future__ import annotations

import sys

import torch
from tqdm import tqdm

from .config import ConfigError


def resolve_device(name: str, key: str = "device") -> str:
    """'auto' picks CUDA when available; asking for CUDA without it is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{key}: got {name!r}, but this machine has no CUDA device (use 'cpu' or 'auto')")
    if name != "cpu" and not name.startswith("cuda"):
        raise ConfigError(f"{key}: got {name!r}, expected 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return name


def progress(total: int, desc: str) -> tqdm:
    """A bar on a terminal; on a log (CI, redirected output) a line every 30 s."""
    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, mininterval=0.5 if tty else 30, dynamic_ncols=tty,
                ascii=not tty, file=sys.stderr)
