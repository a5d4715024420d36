"""Share the run store between machines: `attnrepro store push` / `attnrepro store pull`.

A store remote is a run store of the same layout (<root>/<key[:2]>/<key>/ with its MANIFEST.json)
in any folder this machine can write: a local disk, a mounted network share, a synced folder.
Only verified entries travel: push checks every local entry against its manifest (sizes and
SHA-256) and leaves a damaged one where it is, named; pull checks every remote entry the same way
before it enters the local store. An entry the destination already holds intact is skipped, so a
push or pull is resumable and cheap when little changed. Entries are copied byte for byte
(MANIFEST.json included) into the destination's `.tmp/` and renamed into place in one step, so a
reader on the other side never sees half an entry, and two machines pushing the same run at once
are safe (the first rename wins; both copies are the same run).

Default place (docs/remote.md): $ATTNREPRO_STORE_REMOTE, else `runs` inside the DVC default
remote's folder when that remote is a local path (`../attnrepro-remote/runs` with this project's
.dvc/config), else --to / --from is required.
"""

from __future__ import annotations

import configparser
import os
import shutil
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from attnrepro.config import UserError
from attnrepro.store.run_store import MANIFEST, Damaged, Legacy, RunStore, links_under, verify_entry

ENV = "ATTNREPRO_STORE_REMOTE"


def dvc_default_remote(root: Path) -> Optional[str]:
    """The URL of the DVC default remote (.dvc/config, then .dvc/config.local), or None."""
    url, name = None, None
    for f in (root / ".dvc" / "config", root / ".dvc" / "config.local"):
        if not f.is_file():
            continue
        cp = configparser.ConfigParser()
        cp.read(f, encoding="utf-8")
        if cp.has_option("core", "remote"):
            name = cp.get("core", "remote").strip()
        for section in cp.sections():
            if name and section.strip().strip("'") == f'remote "{name}"' and cp.has_option(section, "url"):
                url = cp.get(section, "url").strip()
    if url is None:
        return None
    # a relative URL in .dvc/config is relative to .dvc/ (DVC's rule)
    return url


def default_remote(root: Path) -> Path:
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    url = dvc_default_remote(root)
    if url is None:
        raise UserError(f"no store remote: pass --to/--from PATH, set ${ENV}, or configure a DVC default remote "
                        "(docs/remote.md)")
    if "://" in url and not url.startswith("file://"):
        raise UserError(f"the DVC default remote is {url}, not a folder: the run store travels to a folder "
                        f"(pass --to/--from PATH or set ${ENV}; docs/remote.md)")
    path = Path(url.removeprefix("file://"))
    if not path.is_absolute():
        path = (root / ".dvc" / path).resolve()
    return path / "runs"


@dataclass
class Transfer:
    copied: list[str] = field(default_factory=list)
    present: int = 0
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (key, reason): not copied
    legacy: list[str] = field(default_factory=list)  # entries no key of this code names: kept, not copied
    links: list[str] = field(default_factory=list)  # symbolic links under the source store: not followed
    megabytes: float = 0.0

    def line(self, verb: str, where: Path) -> str:
        bad = f", {len(self.damaged)} damaged not {verb}" if self.damaged else ""
        bad += f", {len(self.legacy)} legacy not {verb}" if self.legacy else ""
        bad += f", {len(self.links)} symbolic links not followed" if self.links else ""
        return (f"store {verb}: {len(self.copied)} entries copied ({self.megabytes:.0f} MB), {self.present} "
                f"already there{bad}; {where}")


def _place(src: Path, dest_store: RunStore) -> bool:
    """Copy the verified entry folder `src` into `dest_store` byte for byte (via .tmp/ and one rename).
    False when the destination held it already (a race: the first rename wins)."""
    key = src.name
    final = dest_store.path(key)
    tmp_root = dest_store.root / ".tmp"
    link = dest_store.link_on_way(final) or dest_store.link_on_way(tmp_root)
    if link is not None:
        raise Damaged(f"not copied: {link} is a symbolic link in the destination (left alone)")
    tmp_root.mkdir(parents=True, exist_ok=True)
    tmp = tmp_root / f"{key}--{socket.gethostname()}--{os.getpid()}--{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        names = [p.name for p in src.iterdir() if p.name != MANIFEST]
        for name in names:
            shutil.copyfile(src / name, tmp / name)
        shutil.copyfile(src / MANIFEST, tmp / MANIFEST)  # last, as the store writes it
        verify_entry(tmp, full=True, key=key)  # what arrived is what the manifest says, under its own key
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if dest_store.get(key) is None:
                raise
            return False
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def transfer(src: RunStore, dest: RunStore, progress: Callable[[int, int], None] = lambda i, n: None) -> Transfer:
    """Copy every intact entry of `src` that `dest` lacks intact. A damaged `src` entry is reported
    and left in place; a damaged `dest` entry is quarantined by `dest` and replaced."""
    out = Transfer(links=links_under(src.root))
    entries = src.entries()
    for i, p in enumerate(entries):
        key = p.name
        try:
            if p.parent.name != key[:2]:
                raise Damaged(f"misplaced (belongs under {key[:2]}/)")
            if dest.get(key, full=True, label=key[:12]) is not None:
                out.present += 1
                continue
            verify_entry(p, full=True)
            size = sum(f.stat().st_size for f in p.iterdir())
            if _place(p, dest):
                out.copied.append(key)
                out.megabytes += size / 1e6
            else:
                out.present += 1
        except Legacy:
            out.legacy.append(key)  # what `store verify` says of it too: kept, not shared
        except (Damaged, OSError) as e:
            if isinstance(e, OSError) and not p.exists():
                continue  # gone meanwhile (a gc, a quarantine by a sweep)
            out.damaged.append((key, str(e) if isinstance(e, Damaged) else f"unreadable ({e})"))
        finally:
            progress(i + 1, len(entries))
    return out


def push(local: Path, remote: Path, progress=lambda i, n: None) -> Transfer:
    if not local.is_dir():
        raise UserError(f"{local}: no run store here (a sweep creates it; or pass --store)")
    try:
        remote.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the store remote {remote}: {e.strerror or e}") from None
    return transfer(RunStore(local), RunStore(remote), progress)


def pull(local: Path, remote: Path, progress=lambda i, n: None) -> Transfer:
    if not remote.is_dir():
        raise UserError(f"{remote}: no store remote there (push to it first, or pass --from)")
    local.mkdir(parents=True, exist_ok=True)
    return transfer(RunStore(remote), RunStore(local), progress)
