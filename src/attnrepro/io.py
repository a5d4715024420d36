"""Writing outputs: deterministic JSON and CSV, atomic files and folders, and a stage's
outputs moved in all together (stage_outputs), so a failed or killed stage never leaves a
half-written file, nor a mix of old and new outputs, behind."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import tempfile
import uuid
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


# ---------------------------------------------------------------- a stage's outputs, all or nothing

STAGING = Path(".attnrepro-staging")  # beside the outputs (same file system: renames are atomic)


class Transaction:
    """Every output a stage writes goes to a private staging folder first; `commit` moves them
    all into place, after writing a journal, so a stage that fails or is killed leaves the
    previous outputs untouched, and one killed while moving is rolled forward by `recover`."""

    def __init__(self, root: Path = STAGING):
        self.dir = Path(root) / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.dir.mkdir(parents=True)
        self.moves: list[tuple[Path, Path]] = []  # (staged, final)

    def holds(self, path: Path) -> bool:
        return self.dir.resolve() in Path(path).resolve().parents

    def slot(self) -> Path:
        return self.dir / f"out{len(self.moves)}-{uuid.uuid4().hex[:6]}"

    def add(self, staged: Path, final: Path) -> None:
        self.moves = [(s, f) for s, f in self.moves if Path(f).resolve() != Path(final).resolve()]
        self.moves.append((staged, Path(final).resolve()))

    def commit(self) -> None:
        journal = [[s.name, str(f)] for s, f in self.moves]
        (self.dir / "JOURNAL.tmp").write_text(json.dumps(journal), encoding="utf-8")
        os.replace(self.dir / "JOURNAL.tmp", self.dir / "JOURNAL")  # the commit point
        _roll_forward(self.dir)

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _roll_forward(staging: Path) -> None:
    for name, final in json.loads((staging / "JOURNAL").read_text(encoding="utf-8")):
        staged, final = staging / name, Path(final)
        if not staged.exists():
            continue  # moved before an interruption
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.is_dir() and not final.is_symlink():
            os.rename(final, staging / f"old-{name}")  # removed with the staging folder
        os.replace(staged, final)
    shutil.rmtree(staging, ignore_errors=True)


def recover(root: Path = STAGING) -> None:
    """Finish the commits of stages killed while moving outputs in; drop what dead stages staged."""
    if not Path(root).is_dir():
        return
    for staging in Path(root).iterdir():
        pid = staging.name.split("-", 1)[0]
        if (staging / "JOURNAL").is_file():
            _roll_forward(staging)
        elif not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


_ACTIVE: list[Transaction] = []


@contextlib.contextmanager
def stage_outputs(root: Path = STAGING) -> Iterator[Transaction]:
    """Within this block, atomic_path/atomic_dir (and every writer below) stage their outputs;
    they replace the old ones together when the block ends without an exception."""
    recover(root)
    tx = Transaction(root)
    _ACTIVE.append(tx)
    try:
        yield tx
    except BaseException:
        tx.abort()
        raise
    else:
        tx.commit()
    finally:
        _ACTIVE.remove(tx)
        with contextlib.suppress(OSError):
            Path(root).rmdir()  # only when empty


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path for `path`; it becomes `path` only on success (with the stage's
    other outputs, inside stage_outputs). The file gets the umask's mode."""
    path = Path(path)
    tx = _ACTIVE[-1] if _ACTIVE else None
    if tx is not None and not tx.holds(path):
        staged = tx.slot()
        yield staged
        tx.add(staged, path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; it replaces `path` only if the block succeeds (inside
    stage_outputs: with the stage's other outputs). The folder gets the umask's mode."""
    path = Path(path)
    tx = _ACTIVE[-1] if _ACTIVE else None
    if tx is not None and not tx.holds(path):
        staged = tx.slot()
        staged.mkdir()
        yield staged
        tx.add(staged, path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def dumps_json(obj, sort_keys: bool = True) -> str:
    """Deterministic JSON: sorted keys (unless told to keep their order), rounded floats, non-ASCII readable."""
    return json.dumps(_clean(obj), indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n"


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
