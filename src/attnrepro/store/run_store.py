"""The run store: every finished run, kept under a key derived from its config, data and code.

A sweep asks the store first and trains only the runs it lacks, so adding a seed
trains one new run, and a sweep killed half-way resumes with what is missing. The
store is a plain folder outside every DVC output (default `runs/`, git- and
dvc-ignored), so DVC's removal of a stage's outputs before a rerun never touches it.

Layout: <root>/<key[:2]>/<key>/ holds one result folder (see attnrepro.run.execute) and its
MANIFEST.json: the size and SHA-256 of every file, written last. A result is written
to <root>/.tmp/ first and renamed into place in one step, so a reader sees a whole run
or none; when two writers finish the same run, the first rename wins and the second
copy is dropped (both are the same run). Failed runs (an exception, a lost worker) are
not stored and are tried again next time; a diverged run is a result (status
"diverged") and is stored.

The store never serves bad data. `get` checks an entry against its manifest (sizes
always; the content hashes too with full=True, which sweeps use before a result is
copied out) and treats a missing or resized file, a hash mismatch, unreadable JSON or
an entry without a manifest as absent: the entry moves to <root>/.quarantine/ with a
REASON file, one line says which run and why, and the run is trained again.

The store stays inside itself: it never follows a symbolic link when it reads, verifies,
quarantines, collects or copies. A link anywhere under the store is reported (`store verify`)
and left alone, and `gc` removes only regular files and folders inside the store's real path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from attnrepro.config import UserError
from attnrepro.staging import file_sha256, nearest_existing, pid_alive, remove_path

MANIFEST = "MANIFEST.json"
STATUSES = ("ok", "diverged")


class Damaged(Exception):
    """A store entry that does not match its manifest (the message says how)."""


class Legacy(Damaged):
    """An entry no key of this code names: written before stores kept manifests (its files unverifiable), or
    keyed in the old format (OldFormat). Never served; `store verify` exits 1 for it."""


class OldFormat(Legacy):
    """An entry whose files match its manifest but whose spec.json is in the old key format (no numerics):
    `attnrepro store migrate` re-keys it from that spec."""


def links_under(root: Path) -> list[str]:
    """Every symbolic link under `root` (paths relative to it), found without following any."""
    out = []
    for top, folders, files in os.walk(root):  # a linked folder is listed, never entered
        out += [os.path.relpath(os.path.join(top, n), root) for n in folders + files
                if os.path.islink(os.path.join(top, n))]
    return sorted(out)


def key_of(document: dict) -> str:
    """A run's key: the SHA-256 of its key document (spec.json less its key and label) as canonical JSON."""
    doc = json.dumps(document, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(doc.encode()).hexdigest()


def spec_record(document: dict, key: str, label: str) -> bytes:
    """spec.json: the key document exactly as keyed (no rounding), its key and the run's label."""
    return json.dumps({**document, "key": key, "label": label}, indent=2, sort_keys=True,
                      ensure_ascii=False).encode("utf-8") + b"\n"


def recorded_key(record: dict) -> str:
    """The key that a spec.json's own content hashes to (what it says of itself is not trusted)."""
    return key_of({k: v for k, v in record.items() if k not in ("key", "label")})


def manifest_of(files: Mapping[str, bytes]) -> dict:
    return {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in sorted(files.items())}


def check_key(path: Path, key: str) -> None:
    """Raise Damaged unless the entry's spec.json is the run `key` names: its content hashes to `key`
    (an entry copied under another run's key is served as that run otherwise). One rule for every
    format: a spec.json of the old key format (no numerics) hashes to no key of this code (OldFormat)."""
    try:
        record = json.loads((path / "spec.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise Damaged("spec.json is missing or not valid JSON") from None
    if not isinstance(record, dict):
        raise Damaged("spec.json is not a record")
    if "numerics" not in record:
        raise OldFormat(f"filed under key {key[:12]}, but its spec.json is in the old key format (no numerics), "
                        "which no key of this code names (attnrepro store migrate re-keys it)")
    actual = recorded_key(record)
    if actual != key or record.get("key") != key:
        raise Damaged(f"filed under key {key[:12]}, but its spec.json is the run {actual[:12]} "
                      f"({record.get('label') or 'no label'})")


def verify_entry(path: Path, full: bool, key: Optional[str] = None) -> None:
    """Raise Damaged unless the entry at `path` (filed under `key`, by default its folder's name)
    matches its manifest: every listed file present with its size (and, when `full`, its SHA-256),
    no file unlisted, JSON files readable, a status the store keeps, and a spec.json that is the run
    its key names. An entry without a manifest (written before manifests) is Legacy when what can
    still be checked holds (its key, its JSON, its status), else Damaged. A symbolic link, the entry
    or a file in it, is Damaged (never followed)."""
    if path.is_symlink() or not path.is_dir():
        raise Damaged("a symbolic link" if path.is_symlink() else "not a folder")
    key = path.name if key is None else key
    linked = sorted(p.name for p in path.iterdir() if p.is_symlink())
    if linked:
        raise Damaged(f"{linked[0]} is a symbolic link")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        if (path / "status.json").is_file() and (path / "spec.json").is_file():
            with contextlib.suppress(OldFormat):  # Legacy all the same: its files cannot be verified
                check_key(path, key)
            _check_json_and_status(path, [p.name for p in path.iterdir()])
            raise Legacy(f"no {MANIFEST}: its files cannot be verified (written before store manifests; "
                         "attnrepro store gc --legacy removes it)") from None
        raise Damaged(f"no {MANIFEST} (an unfinished or foreign entry)") from None
    except (OSError, ValueError) as e:
        raise Damaged(f"{MANIFEST} unreadable ({type(e).__name__})") from None
    well_formed = isinstance(manifest, dict) and all(
        isinstance(name, str) and name == Path(name).name and not name.startswith(".") and isinstance(want, dict)
        and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)
        for name, want in manifest.items())
    if not well_formed:
        raise Damaged(f"{MANIFEST} is malformed")
    if "status.json" not in manifest:
        raise Damaged(f"{MANIFEST} lists no status.json")
    present = {p.name for p in path.iterdir()} - {MANIFEST}
    missing, unlisted = sorted(set(manifest) - present), sorted(present - set(manifest))
    if missing:
        raise Damaged(f"{missing[0]} is missing")
    if unlisted:
        raise Damaged(f"{unlisted[0]} is not in the manifest")
    for name, want in manifest.items():
        size = (path / name).stat().st_size
        if size != want["size"]:
            raise Damaged(f"{name} has {size} bytes, the manifest says {want['size']}")
    _check_json_and_status(path, list(manifest))
    for name, want in manifest.items():
        if full and file_sha256(path / name) != want["sha256"]:
            raise Damaged(f"{name} does not match its SHA-256")
    check_key(path, key)


def _check_json_and_status(path: Path, names: list[str]) -> None:
    for name in names:
        if name.endswith(".json"):
            try:
                json.loads((path / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise Damaged(f"{name} is not valid JSON") from None
    status = json.loads((path / "status.json").read_text(encoding="utf-8"))
    if not isinstance(status, dict) or status.get("status") not in STATUSES:
        raise Damaged(f"status.json says {status!r}, expected a status of {' or '.join(STATUSES)}")


@dataclass
class VerifyReport:
    intact: int
    damaged: list[tuple[str, str]]  # (key, reason)
    legacy: list[tuple[str, str]]  # (key, reason): entries no key of this code names (Legacy)
    seconds: float
    megabytes: float
    links: list[str] = field(default_factory=list)  # symbolic links under the store, left alone

    @property
    def ok(self) -> bool:
        return not (self.damaged or self.legacy or self.links)

    def line(self) -> str:
        n = self.intact + len(self.damaged) + len(self.legacy)
        legacy = f", {len(self.legacy)} legacy (not served)" if self.legacy else ""
        links = f", {len(self.links)} symbolic links (left alone)" if self.links else ""
        return (f"store verify: {n} entries, {self.intact} intact, {len(self.damaged)} damaged{legacy}{links} "
                f"({self.megabytes:.0f} MB hashed in {self.seconds:.1f} s)")


class RunStore:
    def __init__(self, root: str | os.PathLike, say: Callable[[str], None] = lambda s: print(s, file=sys.stderr)):
        self.root = Path(root)
        self.say = say  # where the one-line notices (a damaged entry quarantined) go

    @staticmethod
    def check_writable(root: str | os.PathLike) -> None:
        """Raise a one-line UserError unless `root` is (or can be made) a folder this process can write."""
        folder = nearest_existing(Path(root))
        if folder.exists() and not folder.is_dir():
            raise UserError(f"engine.store: {folder} is a file, not a folder for the run store")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"engine.store: {folder} is read-only: the run store cannot keep results there")

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    @property
    def quarantine_dir(self) -> Path:
        return self.root / ".quarantine"

    def link_on_way(self, p: Path) -> Optional[Path]:
        """The first symbolic link on the way from the store's root down to `p` (`p` included), or None."""
        q = self.root
        for part in p.relative_to(self.root).parts:
            q = q / part
            if q.is_symlink():
                return q
        return None

    def _refuse_links(self, *places: Path) -> None:
        link = next(filter(None, map(self.link_on_way, places)), None)
        if link is not None:
            raise UserError(f"run store: {link} is a symbolic link; the store does not write through links out of "
                            "itself (remove it; attnrepro store verify lists every link)")

    def get(self, key: str, full: bool = False, label: str = "") -> Optional[Path]:
        """The result folder of `key`, or None when the store does not hold it intact. A damaged
        entry is quarantined (one line names the run and the reason) and reads as absent."""
        p = self.path(key)
        if self.link_on_way(p) is not None:
            self.say(f"store: run {label or key[:12]}: {self.link_on_way(p)} is a symbolic link, left alone and not "
                     "followed; the run reads as absent")
            return None
        if not p.exists():
            return None
        try:
            verify_entry(p, full)
        except (Damaged, OSError) as first:
            try:  # another process may have replaced it meanwhile (put after its own quarantine)
                verify_entry(p, full)
                return p
            except (Damaged, OSError):
                pass
            reason = str(first) if isinstance(first, Damaged) else f"unreadable ({first.strerror or type(first).__name__})"
            moved = self.quarantine(key, reason)
            if moved is not None:
                self.say(f"store: run {label or key[:12]} is damaged ({reason}); moved to {moved}, "
                         "it will be trained again")
            return None
        return p

    def quarantine(self, key: str, reason: str) -> Optional[Path]:
        """Move the entry of `key` (a folder, or whatever lies at its place) aside, with a REASON file;
        None when it is gone already (another process of a shared store moved it first), or when a
        symbolic link lies on either way (left alone)."""
        if self.link_on_way(self.path(key)) or self.link_on_way(self.quarantine_dir):
            return None
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        dest = self.quarantine_dir / f"{key}--{time.strftime('%Y%m%dT%H%M%S')}--{uuid.uuid4().hex[:6]}"
        try:
            os.rename(self.path(key), dest)
        except FileNotFoundError:
            return None
        (dest.parent / f"{dest.name}.REASON").write_text(reason + "\n", encoding="utf-8")
        return dest

    def put(self, key: str, files: Mapping[str, bytes]) -> Path:
        """Store a result folder given as {file name: bytes}; returns its place in the store. An
        intact entry already there wins (the same run); a damaged one is quarantined and replaced."""
        for name in files:
            if "/" in name or name.startswith(".") or name == MANIFEST:
                raise ValueError(f"bad file name in a run result: {name!r}")
        final = self.path(key)
        if self.get(key) is not None:
            return final
        tmp_root = self.root / ".tmp"
        self._refuse_links(final, tmp_root)
        tmp_root.mkdir(parents=True, exist_ok=True)
        tmp = tmp_root / f"{key}--{socket.gethostname()}--{os.getpid()}--{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            (tmp / MANIFEST).write_text(json.dumps(manifest_of(files), indent=1, sort_keys=True), encoding="utf-8")
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

    def entries(self) -> list[Path]:
        """Every entry place of the layout (<root>/<2 chars>/<name>), intact or not; never one reached
        through a symbolic link, nor a link itself (links_under lists those)."""
        if not self.root.is_dir():
            return []
        shards = [s for s in self.root.iterdir() if len(s.name) == 2 and not s.name.startswith(".")
                  and s.is_dir() and not s.is_symlink()]
        return sorted(p for s in shards for p in s.iterdir() if not p.is_symlink())

    def keys(self) -> list[str]:
        """The keys of the intact entries (sizes checked; nothing is moved)."""
        out = []
        for p in self.entries():
            try:
                verify_entry(p, full=False)
                out.append(p.name)
            except (Damaged, OSError):
                pass
        return out

    def verify(self, progress: Callable[[int, int], None] = lambda i, n: None) -> VerifyReport:
        """Check every entry fully (hashes included); damaged entries and every symbolic link under the
        store are reported, nothing is moved."""
        t0 = time.perf_counter()
        entries = self.entries()
        intact, damaged, legacy = 0, [], []
        links = links_under(self.root) if self.root.is_dir() else []
        for i, p in enumerate(entries):
            try:
                if p.parent.name != p.name[:2]:
                    raise Damaged(f"misplaced (belongs under {p.name[:2]}/)")
                verify_entry(p, full=True)
                intact += 1
            except Legacy as e:
                legacy.append((p.name, str(e)))
            except (Damaged, OSError) as e:
                damaged.append((p.name, str(e) if isinstance(e, Damaged) else f"unreadable ({e})"))
            progress(i + 1, len(entries))
        size = sum(f.stat().st_size for p in entries if p.is_dir() for f in p.iterdir()
                   if f.is_file() and not f.is_symlink())
        return VerifyReport(intact, damaged, legacy, time.perf_counter() - t0, size / 1e6, links)

    def removable(self, p: Path) -> bool:
        """Can gc remove `p`: a regular file or folder, inside the store's real path, with no symbolic link on
        its way from the root nor (a folder) anywhere in it."""
        real = self.root.resolve()
        return (self.link_on_way(p) is None and p.resolve().is_relative_to(real) and p.resolve() != real
                and (p.is_file() or (p.is_dir() and not links_under(p))))

    def gc(self, legacy: bool = False) -> dict[str, int]:
        """Remove what is quarantined, half-written results of dead writers, and damaged or misplaced
        entries (and, with `legacy`, Legacy entries); intact entries stay, and nothing that `removable`
        cannot prove is a regular file or folder inside the store (a link is left alone)."""
        counts = {"damaged": 0, "legacy": 0, "quarantined": 0, "tmp": self.clean_tmp()}
        if self.quarantine_dir.is_dir() and self.link_on_way(self.quarantine_dir) is None:  # quarantined before
            for p in self.quarantine_dir.iterdir():
                if self.removable(p):
                    counts["quarantined"] += not p.name.endswith(".REASON")
                    remove_path(p)
        report = self.verify()
        doomed = {key: "damaged" for key, _ in report.damaged}
        doomed.update({key: "legacy" for key, _ in report.legacy if legacy})
        for p in self.entries():
            if p.name in doomed and self.removable(p):
                remove_path(p)
                counts[doomed[p.name]] += 1
        with contextlib.suppress(OSError):
            self.quarantine_dir.rmdir()  # only when empty
        return counts

    def clean_tmp(self) -> int:
        """Remove half-written results left by writers of this host that no longer run."""
        removed = 0
        tmp_root = self.root / ".tmp"
        if not tmp_root.is_dir() or self.link_on_way(tmp_root) is not None:
            return 0
        host = socket.gethostname()
        for p in tmp_root.iterdir():
            parts = p.name.split("--")
            if len(parts) != 4 or parts[1] != host or not parts[2].isdigit() or not self.removable(p):
                continue
            if not pid_alive(int(parts[2])):
                shutil.rmtree(p, ignore_errors=True)
                removed += 1
        return removed
