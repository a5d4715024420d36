"""Atomic output writing: a failed stage never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence


def round_sig(x: float, digits: int = 6) -> float:
    """Round to significant digits so metrics files are short and readable."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def _clean(obj):
    if isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None if math.isnan(obj) else (1e308 if obj > 0 else -1e308)
        return round_sig(obj)
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it into place only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; it replaces `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def dumps_json(obj) -> str:
    """Deterministic JSON: sorted keys, rounded floats, non-ASCII kept readable."""
    return json.dumps(_clean(obj), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path, obj) -> None:
    write_text(path, dumps_json(obj))


def read_json(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_csv(path, rows: Sequence[Mapping], columns: Iterable[str] | None = None) -> None:
    """Write dict rows as CSV; missing values become empty cells."""
    columns = list(columns) if columns is not None else _columns(rows)
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            for row in rows:
                w.writerow({k: _cell(row.get(k)) for k in columns})


def _columns(rows: Sequence[Mapping]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        for k in row:
            if k not in cols:
                cols.append(k)
    return cols


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(round_sig(v)) if math.isfinite(v) else str(v)
    return v
