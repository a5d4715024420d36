"""Lose nothing: a stage killed (SIGKILL) while it writes its outputs leaves either all the old
outputs or, once its committed journal is rolled forward (staging.recover, which every stage runs
first), all the new ones; never a half-written file. A folder the outputs cannot go to (read-only,
or a file in the way) is one line, exit 2, and nothing moved; an unreadable input is one line too.

The stage here is purpose-built on attnrepro.run.stage.run_stage: three metrics files, a plots folder
and a text file, written slowly enough to be killed in the middle."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO

STAGE = r'''
import os, signal, sys, time
from pathlib import Path

from attnrepro.run.stage import run_stage
from attnrepro.files import write_json, write_text
from attnrepro.staging import atomic_dir

tag, delay = sys.argv[1], float(sys.argv[2])
kill_at = int(os.environ.get("KILL_AT_MOVE", "0"))  # a signal at the k-th os.replace of the commit
if kill_at:
    real, calls = os.replace, [0]
    sig = getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL"))

    def replace(src, dst, *a, **kw):
        if Path(dst).name != "JOURNAL":  # the journal is the commit point; the moves follow it
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), sig)
        return real(src, dst, *a, **kw)

    os.replace = replace


def main():
    if os.environ.get("FULL_DISK"):  # as a write to a full disk fails: an OSError naming no file
        import errno
        from attnrepro.staging import atomic_path
        with atomic_path("metrics/part0.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if os.environ.get("READ_MISSING"):
        Path("inputs/missing.txt").read_text()
    if os.environ.get("BUG"):
        raise OSError("a bug with no file name")
    for i in range(3):
        write_json(f"metrics/part{i}.json", {"tag": tag, "i": i, "pad": "x" * int(os.environ.get("PAD", "4096"))})
        Path("progress").write_text(str(i))  # for the test only: how far the stage got
        time.sleep(delay)
    with atomic_dir("plots/multi") as d:
        for i in range(3):
            (d / f"f{i}.csv").write_text(f"{tag},{i}\n" * 1000)
    write_text("plots/multi.txt", tag)


run_stage(main)
'''

OUTPUTS = ["metrics/part0.json", "metrics/part1.json", "metrics/part2.json", "plots/multi/f0.csv",
           "plots/multi/f1.csv", "plots/multi/f2.csv", "plots/multi.txt"]


def start(root: Path, tag: str, delay: float = 0.0, env=None, as_user: bool = False) -> subprocess.Popen:
    """Run the stage; as_user: as an ordinary user when we are root (setpriv), since root may write
    into read-only folders."""
    e = dict(os.environ, PYTHONPATH=str(REPO / "src"), **(env or {}))
    cmd = [sys.executable, str(root / "stage.py"), tag, str(delay)]
    if as_user and os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    # a shell's background job inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    return subprocess.Popen(cmd, cwd=root, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def run(root: Path, tag: str, **kw) -> subprocess.CompletedProcess:
    p = start(root, tag, **kw)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def tags(root: Path) -> dict[str, str | None]:
    """Each output's tag (None: missing); every file must be whole (valid JSON / full CSV)."""
    out = {}
    for f in OUTPUTS:
        p = root / f
        if not p.exists():
            out[f] = None
        elif f.endswith(".json"):
            out[f] = json.loads(p.read_text())["tag"]  # a half-written file would not parse
        elif f.endswith(".csv"):
            lines = p.read_text().splitlines()
            assert len(lines) == 1000 and len({ln.split(",")[0] for ln in lines}) == 1, f"{f} half-written"
            out[f] = lines[0].split(",")[0]
        else:
            out[f] = p.read_text()
    return out


@pytest.fixture
def stage_root(tmp_path):
    (tmp_path / "stage.py").write_text(STAGE, encoding="utf-8")
    first = run(tmp_path, "old")
    assert first.returncode == 0, first.stderr
    assert set(tags(tmp_path).values()) == {"old"}
    return tmp_path


def test_killed_while_staging_leaves_all_old_outputs(stage_root):
    p = start(stage_root, "new", delay=0.5)
    deadline = time.monotonic() + 60
    while (stage_root / "progress").read_text() != "1":  # in the middle of writing its outputs
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert set(tags(stage_root).values()) == {"old"}
    again = run(stage_root, "new")  # the next run completes and cleans up what the dead one staged
    assert again.returncode == 0, again.stderr
    assert set(tags(stage_root).values()) == {"new"}
    assert not (stage_root / ".attnrepro-staging").exists()
    assert not list(stage_root.rglob("*.staged-*"))


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_or_sigterm_says_so_and_keeps_the_old_outputs(stage_root, sig, code, word):
    p = start(stage_root, "new", delay=0.5)
    deadline = time.monotonic() + 60
    while (stage_root / "progress").read_text() != "1":
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code
    assert err.strip() == f"{word}; nothing written (the previous outputs are unchanged)"
    assert set(tags(stage_root).values()) == {"old"}
    assert not (stage_root / ".attnrepro-staging").exists() and not list(stage_root.rglob("*.staged-*"))


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_killed_while_moving_outputs_in_is_rolled_forward(stage_root, kill_at):
    """Killed after the commit point (the journal), between two moves: every file is whole, and the
    next run first finishes the move (all new), then runs normally."""
    killed = run(stage_root, "new", env={"KILL_AT_MOVE": str(kill_at)})
    assert killed.returncode == -signal.SIGKILL
    state = tags(stage_root)  # every file whole, old or new (until the roll-forward, a mix of both)
    assert set(state.values()) <= {"old", "new"}
    assert ("new" in state.values()) == (kill_at > 1)
    journals = list((stage_root / ".attnrepro-staging").glob("*/JOURNAL"))
    assert len(journals) == 1

    from attnrepro import staging

    cwd = os.getcwd()
    os.chdir(stage_root)
    try:
        staging.recover()  # what every stage does first
    finally:
        os.chdir(cwd)
    assert set(tags(stage_root).values()) == {"new"}
    assert list((stage_root / ".attnrepro-staging").iterdir()) == []  # the journal's folder is gone
    again = run(stage_root, "newer")
    assert again.returncode == 0, again.stderr
    assert set(tags(stage_root).values()) == {"newer"}
    assert not (stage_root / ".attnrepro-staging").exists()


def test_file_modes_follow_the_umask(stage_root):
    mask = os.umask(0)
    os.umask(mask)
    for f in OUTPUTS:
        assert (stage_root / f).stat().st_mode & 0o777 == 0o666 & ~mask, f
    for d in ("metrics", "plots", "plots/multi"):
        assert (stage_root / d).stat().st_mode & 0o777 == 0o777 & ~mask, d


# ---------------------------------------------------------------- where outputs cannot go

def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_read_only_metrics_folder_is_one_line_and_moves_nothing():
    """A read-only metrics/ (issue 13: a PermissionError traceback): one line naming the output and
    the folder, exit 2, the old outputs untouched, nothing staged left behind. Run as an ordinary
    user (root writes into read-only folders)."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("root without setpriv: cannot run as an ordinary user")
    root = Path(tempfile.mkdtemp(prefix="attnrepro-ro-", dir="/tmp"))
    try:
        root.chmod(0o777)
        (root / "stage.py").write_text(STAGE, encoding="utf-8")
        (root / "stage.py").chmod(0o644)
        first = run(root, "old", as_user=True)
        assert first.returncode == 0, first.stderr
        (root / "metrics").chmod(0o555)
        proc = run(root, "new", as_user=True)
        line = _one_error_line(proc)
        assert line.startswith("error: cannot write metrics/part") and "Permission denied" in line
        assert "(metrics is read-only)" in line
        (root / "metrics").chmod(0o755)
        assert set(tags(root).values()) == {"old"}
        assert not (root / ".attnrepro-staging").exists()
    finally:
        (root / "metrics").chmod(0o755) if (root / "metrics").exists() else None
        shutil.rmtree(root, ignore_errors=True)


def test_a_file_where_a_folder_should_be(stage_root):
    shutil.rmtree(stage_root / "plots")
    (stage_root / "plots").write_text("not a folder")
    line = _one_error_line(run(stage_root, "new"))
    assert line == "error: cannot write plots/multi: plots is a file, not a folder"
    assert (stage_root / "metrics/part0.json").exists() and json.loads(
        (stage_root / "metrics/part0.json").read_text())["tag"] == "old"


def test_unreadable_input_is_one_line_and_a_bug_keeps_its_traceback(stage_root):
    line = _one_error_line(run(stage_root, "new", env={"READ_MISSING": "1"}))
    assert line == "error: cannot read inputs/missing.txt: No such file or directory"
    bug = run(stage_root, "new", env={"BUG": "1"})
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "a bug with no file name" in bug.stderr
    assert set(tags(stage_root).values()) == {"old"}


def test_os_error_line_classifies_paths(tmp_path, monkeypatch):
    from attnrepro.staging import os_error_line

    monkeypatch.chdir(tmp_path)
    final = (tmp_path / "metrics" / "x.json").resolve()
    moves = [(tmp_path / ".attnrepro-staging" / "1-a" / "out0", final)]
    e = PermissionError(13, "Permission denied", str(tmp_path / ".attnrepro-staging" / "1-a" / "out0"), None,
                        str(final))
    assert os_error_line(e, moves) == "cannot write metrics/x.json: Permission denied"
    assert os_error_line(FileNotFoundError(2, "No such file or directory", "data/in.npy")) == \
        "cannot read data/in.npy: No such file or directory"
    assert os_error_line(OSError(5, "Input/output error")) is None


# ---------------------------------------------------------------- outputs on other file systems, journals, full disks

def _other_device_dir(near: Path) -> Path | None:
    """A folder on another file system than `near` (/dev/shm is a tmpfs on Linux), or None."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(near).st_dev or not os.access(shm, os.W_OK):
        return None
    return Path(tempfile.mkdtemp(prefix="attnrepro-xdev-", dir=shm))


def test_outputs_on_another_file_system_move_in_together(stage_root):
    """plots/ a symlink to a tmpfs (or data/ to another disk): once new metrics beside old plots and a
    journal that stopped every later stage; now each output is staged beside its destination."""
    other = _other_device_dir(stage_root)
    if other is None:
        pytest.skip("no second file system to put an output folder on")
    try:
        shutil.copytree(stage_root / "plots", other / "plots")
        shutil.rmtree(stage_root / "plots")
        (stage_root / "plots").symlink_to(other / "plots")
        killed = run(stage_root, "new", env={"KILL_AT_MOVE": "5"})  # killed after the metrics moved in
        assert killed.returncode == -signal.SIGKILL
        again = run(stage_root, "newer")  # finishes the killed commit (all "new"), then runs
        assert again.returncode == 0, again.stderr
        assert "finished moving in the outputs of a stage killed" in again.stderr
        assert set(tags(stage_root).values()) == {"newer"}
        assert not list(other.rglob("*.staged-*")) and not list(other.rglob("*.old-*"))
        assert not (stage_root / ".attnrepro-staging").exists()
    finally:
        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.parametrize("resolution", ["--finish", "--discard"])
def test_a_journal_whose_files_changed_stops_and_names_the_way_out(stage_root, resolution):
    """Killed inside the commit window, then the user restores the moved file (git checkout): the
    next stage, related or not, must not roll the rest forward over the restore. It stops with one
    line naming the journal and the command; the command resolves it."""
    old = (stage_root / "metrics/part0.json").read_bytes()
    killed = run(stage_root, "new", env={"KILL_AT_MOVE": "2"})  # part0.json moved in, the rest not
    assert killed.returncode == -signal.SIGKILL
    assert tags(stage_root)["metrics/part0.json"] == "new"
    (stage_root / "metrics/part0.json").write_bytes(old)  # the user's restore
    line = _one_error_line(run(stage_root, "newer"))
    assert "JOURNAL: a stage was killed while moving its outputs in" in line
    assert "metrics/part0.json is no longer what the stage moved in" in line
    assert "attnrepro staging --finish" in line and "attnrepro staging --discard" in line
    assert set(tags(stage_root).values()) == {"old"}  # nothing rolled forward over the restore
    cli = subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "staging", resolution], cwd=stage_root,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True)
    assert cli.returncode == 0 and "1 interrupted commit" in cli.stdout, cli.stderr
    state = tags(stage_root)
    if resolution == "--finish":  # what had not moved yet moves in; the file the user restored stays
        assert state.pop("metrics/part0.json") == "old" and set(state.values()) == {"new"}
    else:
        assert set(state.values()) == {"old"}
    assert not list(stage_root.rglob("*.staged-*")) and not list(stage_root.rglob("*.old-*"))
    assert run(stage_root, "newer").returncode == 0 and set(tags(stage_root).values()) == {"newer"}


def test_a_folder_at_an_output_files_path_is_never_deleted(stage_root):
    (stage_root / "metrics/part1.json").unlink()
    (stage_root / "metrics/part1.json").mkdir()
    (stage_root / "metrics/part1.json/precious.txt").write_text("keep me")
    line = _one_error_line(run(stage_root, "new"))
    assert line.startswith("error: cannot write metrics/part1.json: a folder is in its place")
    assert (stage_root / "metrics/part1.json/precious.txt").read_text() == "keep me"
    assert json.loads((stage_root / "metrics/part0.json").read_text())["tag"] == "old"  # nothing moved
    assert not list(stage_root.rglob("*.staged-*")) and not (stage_root / ".attnrepro-staging").exists()


def test_a_full_disk_names_the_file(stage_root):
    line = _one_error_line(run(stage_root, "new", env={"FULL_DISK": "1"}))
    assert line == "error: cannot write metrics/part0.json: No space left on device"
    assert set(tags(stage_root).values()) == {"old"}


def test_a_full_tmpfs_names_the_file(stage_root):
    """The same on a real full file system: a 32 KiB tmpfs for metrics/, where it can be mounted."""
    mnt = stage_root / "metrics"
    saved = {p.name: p.read_bytes() for p in mnt.iterdir()}
    shutil.rmtree(mnt)
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        for name, data in saved.items():
            (mnt / name).write_bytes(data)
        line = _one_error_line(run(stage_root, "new", env={"PAD": "12000"}))
        assert line.startswith("error: cannot write metrics/part") and line.endswith("No space left on device")
        assert set(tags(stage_root).values()) == {"old"}
        assert not list(stage_root.rglob("*.staged-*"))
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_finish_keeps_a_file_changed_before_it_moved_in(stage_root):
    killed = run(stage_root, "new", env={"KILL_AT_MOVE": "2"})  # part0.json moved in, the rest not
    assert killed.returncode == -signal.SIGKILL
    (stage_root / "metrics/part1.json").write_text(json.dumps({"tag": "user"}))  # not moved in yet: edited
    cli = subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "staging", "--finish"], cwd=stage_root,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True)
    assert cli.returncode == 0 and "(1 file changed since kept as they are)" in cli.stdout, cli.stderr
    state = tags(stage_root)
    assert state.pop("metrics/part1.json") == "user" and set(state.values()) == {"new"}
    assert not list(stage_root.rglob("*.staged-*")) and not (stage_root / ".attnrepro-staging").exists()


def test_a_running_stages_journal_is_left_to_it(stage_root):
    """A second stage (dvc exp queue, a stage run by hand) must not roll another live stage's commit."""
    killed = run(stage_root, "new", env={"KILL_AT_MOVE": "2"})
    (journal_dir,) = list((stage_root / ".attnrepro-staging").iterdir())
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = journal_dir.with_name(f"{alive.pid}-{journal_dir.name.split('-', 1)[1]}")
        journal_dir.rename(live)  # as if that live process owned it
        assert run(stage_root, "newer").returncode == 0
        assert live.exists() and tags(stage_root)["metrics/part2.json"] == "newer"
    finally:
        alive.kill()
        alive.wait()
    assert killed.returncode == -signal.SIGKILL


@pytest.mark.parametrize("sig,code,word", [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")])
def test_a_signal_while_outputs_move_in_waits_for_the_commit(stage_root, sig, code, word):
    """Ctrl-C or SIGTERM between two moves once left a half-moved set behind a message saying
    "nothing written"; now it is held until every output is in place, and the message says so."""
    p = run(stage_root, "new", env={"KILL_AT_MOVE": "2", "KILL_SIGNAL": sig})
    assert p.returncode == code
    assert p.stderr.strip() == f"{word} after the outputs were written (they are complete)"
    assert set(tags(stage_root).values()) == {"new"} and not (stage_root / ".attnrepro-staging").exists()


PREFLIGHT_STAGE = '''
from pathlib import Path
from attnrepro.files import write_json
from attnrepro.run.stage import stage

def main(st):
    Path("started").write_text("training...")  # hours of work, in a real stage
    write_json("metrics/out.json", {"n": 1})

if __name__ == "__main__":
    stage(main, None)
'''


def test_a_read_only_output_folder_is_refused_before_the_stage_starts_work():
    """A read-only metrics/ was found only after the stage's training (issue 39): now `stage` checks
    every output dvc.yaml declares before main runs. Run as an ordinary user (root writes anywhere)."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("root without setpriv: cannot run as an ordinary user")
    root = Path(tempfile.mkdtemp(prefix="attnrepro-pre-", dir="/tmp"))
    try:
        root.chmod(0o777)
        (root / "stages").mkdir(mode=0o755)
        (root / "stages" / "s.py").write_text(PREFLIGHT_STAGE, encoding="utf-8")
        (root / "params.yaml").write_text("{}\n", encoding="utf-8")
        (root / "dvc.yaml").write_text("stages:\n  s:\n    cmd: sh scripts/py stages/s.py\n    outs:\n"
                                       "      - metrics/out.json:\n          cache: false\n", encoding="utf-8")
        (root / "metrics").mkdir(mode=0o555)
        cmd = [sys.executable, "stages/s.py"]
        if os.geteuid() == 0:
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        proc = subprocess.run(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=str(REPO / "src")), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "error: cannot write metrics/out.json: Permission denied (metrics is read-only)"]
        assert not (root / "started").exists()
    finally:
        (root / "metrics").chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)
