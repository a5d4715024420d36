"""A stage's outputs, all or nothing: every output is staged beside its destination and the lot
is moved into place together (stage_outputs), so a failed or killed stage never leaves a
half-written file, nor a mix of old and new outputs, behind; atomic files and folders outside a
stage; the one-line messages for outputs that cannot be written."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Iterator, Optional


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


STAGING = Path(".attnrepro-staging")  # the transactions' records: slots and journals, one folder each


class OutputError(Exception):
    """An output cannot be put in place (one line: run_stage prints it and exits 2)."""


class StagingError(OutputError):
    """A journal left by a killed commit no longer matches the files it would replace."""


def fingerprint(path: Path) -> Optional[str]:
    """The content of a file or folder as one SHA-256 (None: nothing there)."""
    if not path.exists() and not path.is_symlink():
        return None
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode() + b"\0" + file_sha256(f).encode() + b"\0")
        return "dir:" + h.hexdigest()
    return "file:" + file_sha256(path)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _place(path) -> Path:
    """An output's absolute path, its folder resolved but not the path itself: an output that is a
    symlink (DVC's cache links, say) is replaced, never written through."""
    path = Path(path).absolute()
    return path.parent.resolve() / path.name


class Transaction:
    """Every output a stage writes is staged beside its destination first (same folder, so the
    same file system, wherever that folder lives); `commit` moves them all into place after
    writing a journal, so a stage that fails or is killed leaves the previous outputs untouched,
    and one killed while moving is rolled forward by `recover` when nothing changed since."""

    def __init__(self, root: Path = STAGING):
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.dir = Path(root) / self.id
        self.dir.mkdir(parents=True)
        self.moves: list[tuple[Path, Path]] = []  # (staged, final)
        self.kinds: dict[Path, str] = {}  # final -> "file" | "dir"
        self.committed = False  # every output moved in

    def holds(self, path: Path) -> bool:
        path = _place(path)
        return any(s == path or s in path.parents for s, _ in self.moves)

    def slot(self, final: Path, kind: str) -> Path:
        """A staged path beside `final` (its folder is created); recorded first, so that `recover`
        can remove it if this process dies before the commit."""
        final = _place(final)
        check_writable([(None, final)])
        final.parent.mkdir(parents=True, exist_ok=True)
        staged = final.parent / f".{final.name}.staged-{self.id}"
        with open(self.dir / "SLOTS", "a", encoding="utf-8") as f:
            f.write(str(staged) + "\n")
        self.moves = [(s, f) for s, f in self.moves if f != final]
        self.moves.append((staged, final))
        self.kinds[final] = kind
        return staged

    def check_places(self) -> None:
        """Refuse, before anything moves, an output whose place holds the other kind of thing:
        a folder where a file goes is never deleted (it may hold anything)."""
        for _, final in self.moves:
            kind = self.kinds[final]
            if kind == "file" and final.is_dir() and not final.is_symlink():
                raise OutputError(f"cannot write {_shown(final)}: a folder is in its place (attnrepro deletes no "
                                    f"folder it did not write; move it away and rerun)")
            if kind == "dir" and final.exists() and not final.is_dir():
                raise OutputError(f"cannot write {_shown(final)}: a file is in the place of this output folder "
                                    f"(move it away and rerun)")

    def commit(self) -> None:
        self.check_places()
        journal = [{"staged": str(s), "final": str(f), "kind": self.kinds[f], "before": fingerprint(f),
                    "after": fingerprint(s)} for s, f in self.moves]
        with named_errors(self.dir / "JOURNAL"), _signals_held():
            (self.dir / "JOURNAL.tmp").write_text(json.dumps(journal, indent=1), encoding="utf-8")
            os.replace(self.dir / "JOURNAL.tmp", self.dir / "JOURNAL")  # the commit point
            _roll_forward(self.dir)
            self.committed = True

    def abort(self) -> None:
        _drop(self.dir)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the outputs move in (renames: milliseconds): a stage stopped
    then is stopped after its commit, not half-way through it (only SIGKILL can split it).

    The signals are caught, not blocked: a process-directed signal that the main thread blocks is
    delivered to another thread (torch's and BLAS's native threads), and Python then runs its handler
    in the main thread at once. So a caught signal is replayed through the handler it displaced
    when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if caught:
            handler = old[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0])


def _old(staged: Path) -> Path:
    """Where a folder output's previous version waits while the new one moves in."""
    return staged.with_name(staged.name.replace(".staged-", ".old-", 1))


def _roll_forward(txdir: Path, keep_changed: bool = False) -> int:
    """Move in what the journal's stage staged; with keep_changed, a file that changed since the
    stage was killed keeps its new content (its staged copy is dropped). Returns how many were kept."""
    kept = 0
    for e in json.loads((txdir / "JOURNAL").read_text(encoding="utf-8")):
        staged, final = Path(e["staged"]), Path(e["final"])
        old = _old(staged)
        if staged.exists():
            if keep_changed and fingerprint(old if old.exists() and not final.exists() else final) != e["before"]:
                if old.exists() and not final.exists():
                    os.rename(old, final)
                remove_path(staged)
                kept += 1
                continue
            if e["kind"] == "dir" and final.is_dir() and not final.is_symlink():
                os.rename(final, old)  # beside it: removed below
            os.replace(staged, final)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(txdir, ignore_errors=True)
    return kept


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _journal_problem(txdir: Path) -> Optional[str]:
    """None when every file the journal would replace is as the journal left it (the ones not
    yet moved still hold what was there before, the moved ones what was moved in)."""
    for e in json.loads((txdir / "JOURNAL").read_text(encoding="utf-8")):
        staged, final = Path(e["staged"]), Path(e["final"])
        old = _old(staged)
        if staged.exists():
            here = fingerprint(old if old.exists() and not final.exists() else final)
            if here != e["before"]:
                return f"{_shown(final)} changed after the stage was killed"
        elif fingerprint(final) != e["after"]:
            return f"{_shown(final)} is no longer what the stage moved in"
    return None


def _drop(txdir: Path) -> None:
    """Forget a transaction: remove what it staged (putting back a folder it had moved aside)."""
    slots = txdir / "SLOTS"
    for line in slots.read_text(encoding="utf-8").splitlines() if slots.exists() else []:
        staged = Path(line)
        old, final = _old(staged), staged.with_name(staged.name[1:].rsplit(".staged-", 1)[0])
        if old.exists() and not final.exists():
            os.rename(old, final)
        remove_path(staged)
        remove_path(old)
    shutil.rmtree(txdir, ignore_errors=True)


def recover(root: Path = STAGING, say=lambda s: print(s, file=sys.stderr)) -> None:
    """Finish the commits of stages killed while moving outputs in, when the files they would
    replace are unchanged since; drop what dead stages staged. A journal whose files changed
    (e.g. restored with git checkout) stops here with one line naming it and the way out."""
    if not Path(root).is_dir():
        return
    for txdir in sorted(Path(root).iterdir()):
        if _owner_alive(txdir):
            continue  # another stage's, still running (its own commit finishes it)
        if (txdir / "JOURNAL").is_file():
            problem = _journal_problem(txdir)
            if problem:
                raise StagingError(f"{_shown(txdir / 'JOURNAL')}: a stage was killed while moving its outputs in, "
                                   f"and {problem}; run `attnrepro staging --finish` to complete its move anyway, "
                                   f"or `attnrepro staging --discard` to drop it (then rerun that stage)")
            _roll_forward(txdir)
            say(f"finished moving in the outputs of a stage killed while committing them ({_shown(txdir)})")
        else:
            _drop(txdir)


def _owner_alive(txdir: Path) -> bool:
    pid = txdir.name.split("-", 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid))


def resolve(finish: bool, root: Path = STAGING) -> tuple[int, int]:
    """`attnrepro staging`: finish or drop every journal left by a killed commit. Finishing moves in
    what had not moved yet, except files changed since (they keep their content). Returns (journals,
    files kept)."""
    n = kept = 0
    for txdir in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        if (txdir / "JOURNAL").is_file() and not _owner_alive(txdir):
            if finish:
                kept += _roll_forward(txdir, keep_changed=True)
            else:
                _drop(txdir)
            n += 1
    with contextlib.suppress(OSError):
        Path(root).rmdir()  # only when empty
    return n, kept


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def pid_alive(pid: int) -> bool:
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
        try:
            tx.commit()
        except BaseException:
            if not (tx.dir / "JOURNAL").exists():  # refused before the commit point: nothing moved
                tx.abort()
            raise
    finally:
        _ACTIVE.remove(tx)
        with contextlib.suppress(OSError):
            Path(root).rmdir()  # only when empty


@contextlib.contextmanager
def named_errors(path: Path) -> Iterator[None]:
    """An OSError without a file name (a full disk while writing, say) gets `path` as its name."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path for `path`; it becomes `path` only on success (with the stage's
    other outputs, inside stage_outputs). The file gets the umask's mode."""
    path = Path(path)
    tx = _ACTIVE[-1] if _ACTIVE else None
    if tx is not None and not tx.holds(path):
        staged = tx.slot(path, "file")
        with named_errors(path):
            yield staged
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        with named_errors(path):
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
        staged = tx.slot(path, "dir")
        staged.mkdir()
        with named_errors(path):
            yield staged
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        with named_errors(path):
            yield tmp
        os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (where a new output would be created)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(moves) -> None:
    """Raise a one-line OutputError unless every final path of `moves` ((staged, final) pairs)
    can be put in place: its nearest existing folder is a folder we may write into (and an
    existing output folder, which is moved aside, is writable itself)."""
    for _, final in moves:
        final = Path(final)
        folder = nearest_existing(final.parent)
        if not folder.is_dir():
            raise OutputError(f"cannot write {_shown(final)}: {_shown(folder)} is a file, not a folder")
        blocked = [d for d in (folder, final if final.is_dir() and not final.is_symlink() else None)
                   if d is not None and not os.access(d, os.W_OK | os.X_OK)]
        if blocked:
            raise OutputError(f"cannot write {_shown(final)}: {os.strerror(errno.EACCES)} "
                              f"({_shown(blocked[0])} is read-only)")


def os_error_line(e: OSError, moves=()) -> str | None:
    """One line for an OSError that names a file: "cannot write <path>: <reason>" when the path is
    an output, lies under one, or is the staging area, else "cannot read <path>: <reason>"; None
    when the error names no file (then it is a bug, and its traceback is the report)."""
    name = e.filename2 if e.filename2 is not None else e.filename
    if name is None:
        return None
    path = Path(os.fsdecode(name)).resolve()
    staged = {Path(s).resolve(): Path(f).resolve() for s, f in moves}
    path = next((f / path.relative_to(s) for s, f in staged.items() if s == path or s in path.parents), path)
    stage_area = Path(STAGING).resolve()
    writing = (e.filename2 is not None or path == stage_area or stage_area in path.parents
               or any(path == f or f in path.parents or path in f.parents for f in staged.values()))
    reason = e.strerror or type(e).__name__
    return f"cannot {'write' if writing else 'read'} {_shown(path)}: {reason}"


