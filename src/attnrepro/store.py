"""The run store: every finished run, kept under a key derived from its config, data and code.

A sweep asks the store first and trains only the runs it lacks, so adding a seed
trains one new run, and a sweep killed half-way resumes with what is missing. The
store is a plain folder outside every DVC output (default `runs/`, git- and
dvc-ignored), so DVC's removal of a stage's outputs before a rerun never touches it.

Layout: <root>/<key[:2]>/<key>/ holds one result folder (see attnrepro.runs). A
result is written to <root>/.tmp/ first and renamed into place in one step, so a
reader sees a whole run or none; when two writers finish the same run, the first
rename wins and the second copy is dropped (both are the same run). Failed runs
(an exception, a lost worker) are not stored and are tried again next time; a
diverged run is a result (status "diverged") and is stored.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Mapping, Optional

from .io import _alive  # is a process of this host alive? (io's staging uses it the same way)


class RunStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> Optional[Path]:
        """The result folder of `key`, or None when the store does not hold it."""
        p = self.path(key)
        return p if (p / "status.json").is_file() else None

    def put(self, key: str, files: Mapping[str, bytes]) -> Path:
        """Store a result folder given as {file name: bytes}; returns its place in the store."""
        final = self.path(key)
        if self.get(key) is not None:
            return final
        tmp_root = self.root / ".tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        tmp = tmp_root / f"{key}--{socket.gethostname()}--{os.getpid()}--{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            for name, data in files.items():
                if "/" in name or name.startswith("."):
                    raise ValueError(f"bad file name in a run result: {name!r}")
                (tmp / name).write_bytes(data)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if self.get(key) is None:  # not a lost race: a real error
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.glob("??/*") if (p / "status.json").is_file())

    def clean_tmp(self) -> int:
        """Remove half-written results left by writers of this host that no longer run."""
        removed = 0
        tmp_root = self.root / ".tmp"
        if not tmp_root.is_dir():
            return 0
        host = socket.gethostname()
        for p in tmp_root.iterdir():
            parts = p.name.split("--")
            if len(parts) != 4 or parts[1] != host or not parts[2].isdigit():
                continue
            if not _alive(int(parts[2])):
                shutil.rmtree(p, ignore_errors=True)
                removed += 1
        return removed
