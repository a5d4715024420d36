"""The run store never serves bad data, and the engine survives its faults.

Each kind of damage to a stored run (a truncated or deleted checkpoint, a hand-edited summary or
history that is still valid JSON, truncated JSON, an empty or odd status, no status, no manifest,
a file where the entry's folder should be) makes the next sweep quarantine the entry with one line
naming the run and the reason, train it again, and return the same bytes as an undisturbed run.
`attnrepro store verify` finds the damage and `attnrepro store gc` clears it. A server that is not
a Dask scheduler is one line in bounded time; Ctrl-C and SIGTERM stop a sweep on local workers with
one line, exit 130 / 143, no leaked semaphores, and the old outputs unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from attnrepro.commands.main import main as cli_main
from attnrepro.config import UserError
from attnrepro.store.run_store import MANIFEST, RunStore
from attnrepro.run.engine import connect, run_sweep
from conftest import store_entry
from test_sweep import engine, result_bytes, tiny_inputs, tiny_spec, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store holding one finished tiny run, and that run's record."""
    root = tmp_path_factory.mktemp("pristine")
    (rec,) = run_sweep("t", [tiny_spec()], tiny_inputs(), engine(root, workers=1))
    assert rec.status == "ok" and not rec.cached
    return root / "store", rec


def _rewrite(name: str, edit):
    def damage(entry: Path) -> None:
        p = entry / name
        p.write_bytes(edit(p.read_bytes()))
    return damage


def _same_size_edit(data: bytes) -> bytes:
    """Change one digit: still valid JSON, same size, different numbers."""
    i = next(i for i, b in enumerate(data) if chr(b) in "123456789")
    return data[:i] + (b"2" if data[i:i + 1] != b"2" else b"3") + data[i + 1:]


def _replace_with_file(entry: Path) -> None:
    shutil.rmtree(entry)
    entry.write_text("not a run")


DAMAGE = {
    "truncated checkpoint": (_rewrite("model.pt", lambda b: b[: len(b) // 2]), "model.pt has"),
    "deleted checkpoint": (lambda e: (e / "model.pt").unlink(), "model.pt is missing"),
    "edited summary, valid JSON": (_rewrite("summary.json", _same_size_edit), "summary.json does not match"),
    "edited history, valid JSON": (_rewrite("history.json", lambda b: b.replace(b"[", b"[\n", 1)), "history.json has"),
    "truncated JSON": (_rewrite("evals.json", lambda b: b[:-5] + b" " * 5), "evals.json is not valid JSON"),
    "empty status": (_rewrite("status.json", lambda b: b""), "status.json has 0 bytes"),
    "odd status": (lambda e: _fake_status(e, {"status": "weird"}), "status.json says"),
    "no status.json": (lambda e: (e / "status.json").unlink(), "status.json is missing"),
    "no manifest": (lambda e: (e / MANIFEST).unlink(), "no MANIFEST.json"),
    "a file in the entry's place": (_replace_with_file, "not a folder"),
}


def _fake_status(entry: Path, status: dict) -> None:
    """An odd status with a manifest that agrees, as a careless hand-edit of both would leave."""
    data = json.dumps(status).encode()
    (entry / "status.json").write_bytes(data)
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["status.json"]["size"] = len(data)
    import hashlib
    manifest["status.json"]["sha256"] = hashlib.sha256(data).hexdigest()
    (entry / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_entry_is_quarantined_and_trained_again(kind, pristine, tmp_path, capsys):
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    damage, reason = DAMAGE[kind]
    damage(store.path(first.key))
    capsys.readouterr()

    (again,) = run_sweep("t", [tiny_spec()], tiny_inputs(), engine(tmp_path, workers=1))

    err = capsys.readouterr().err
    notices = [ln for ln in err.splitlines() if ln.startswith("store: ")]
    assert len(notices) == 1 and "tiny seed 0" in notices[0] and reason in notices[0], err
    assert "trained again" in notices[0] and "Traceback" not in err
    assert again.status == "ok" and not again.cached
    assert result_bytes([again]) == result_bytes([first])
    quarantined = list((tmp_path / "store" / ".quarantine").glob(f"{first.key}--*"))
    assert len([q for q in quarantined if not q.name.endswith(".REASON")]) == 1
    assert store.verify().damaged == []


def test_verify_finds_damage_and_gc_clears_it(pristine, tmp_path, capsys):
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = tmp_path / "store"
    assert cli_main(["store", "verify", "--store", str(store)]) == 0
    assert "1 entries, 1 intact, 0 damaged (" in capsys.readouterr().out
    _same = DAMAGE["edited summary, valid JSON"][0]
    _same(RunStore(store).path(first.key))
    (RunStore(store).path(first.key).parent / "not-a-key").write_text("x")  # a stray file in the layout
    assert cli_main(["store", "verify", "--store", str(store)]) == 1
    out = capsys.readouterr().out
    assert f"damaged: {first.key}: summary.json does not match its SHA-256" in out
    assert "2 entries, 0 intact, 2 damaged" in out
    assert cli_main(["store", "gc", "--store", str(store)]) == 0
    assert "removed 0 quarantined, 2 damaged, 0 legacy and 0 half-written entries" in capsys.readouterr().out
    assert cli_main(["store", "verify", "--store", str(store)]) == 0
    assert "0 entries" in capsys.readouterr().out and not (store / ".quarantine").exists()


def test_store_verify_without_a_store_is_one_line(tmp_path, capsys):
    assert cli_main(["store", "verify", "--store", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().endswith("no run store here (a sweep creates it; or pass --store)")


def test_store_verify_outside_a_checkout_is_one_clear_line(tmp_path, capsys, monkeypatch):
    """Outside a checkout it said `error: engine.workers: missing` (issue 66)."""
    monkeypatch.chdir(tmp_path)
    assert cli_main(["store", "verify"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: params.yaml: not found, and it names the run store (engine.store): run in an attnrepro "
                   "checkout, or give the store: --store DIR\n")


@pytest.mark.parametrize("manifest", ['{"model.pt": 10, "status.json": 3}', '{"../x": {"size": 1, "sha256": ""}}',
                                      '[]'], ids=["sizes only", "a path out of the entry", "a list"])
def test_a_malformed_manifest_is_damage_not_a_traceback(pristine, tmp_path, manifest, capsys):
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    (store.path(first.key) / MANIFEST).write_text(manifest)
    report = store.verify()
    assert report.damaged == [(first.key, "MANIFEST.json is malformed")] and report.intact == 0
    assert store.get(first.key) is None and "MANIFEST.json is malformed" in capsys.readouterr().err


def test_entries_from_before_manifests_are_legacy_and_kept_unless_asked(pristine, tmp_path, capsys):
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    (store.path(first.key) / MANIFEST).unlink()  # what an older checkout wrote
    assert store.keys() == [] and store.path(first.key).exists()  # listing moves nothing
    report = store.verify()
    assert [k for k, _ in report.legacy] == [first.key] and report.damaged == []
    assert cli_main(["store", "verify", "--store", str(tmp_path / "store")]) == 1  # its files cannot be verified
    assert "1 legacy (not served)" in capsys.readouterr().out
    assert cli_main(["store", "gc", "--store", str(tmp_path / "store")]) == 0 and store.path(first.key).exists()
    assert cli_main(["store", "gc", "--legacy", "--store", str(tmp_path / "store")]) == 0
    assert "1 legacy" in capsys.readouterr().out.splitlines()[-1] and not store.path(first.key).exists()


def test_two_processes_quarantining_one_entry_do_not_crash(pristine, tmp_path):
    """The second of two sweeps sharing a store finds the damaged entry already moved."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    a, b = RunStore(tmp_path / "store", say=lambda s: None), RunStore(tmp_path / "store", say=lambda s: None)
    (a.path(first.key) / "model.pt").write_bytes(b"x")
    assert a.quarantine(first.key, "first") is not None
    assert b.quarantine(first.key, "second") is None and b.get(first.key) is None


def test_put_replaces_a_damaged_entry(tmp_path):
    store = RunStore(tmp_path, say=lambda s: None)
    key, files = store_entry("a run", {"status.json": b'{"status": "ok"}', "summary.json": b"{}"})
    store.path(key).mkdir(parents=True)
    (store.path(key) / "leftover").write_text("x")  # no status, no manifest: once "Directory not empty"
    path = store.put(key, files)
    assert store.get(key, full=True) == path and not (path / "leftover").exists()


# ---------------------------------------------------------------- a scheduler address that is no scheduler

def _server(reply: bytes):
    """A TCP server on localhost that accepts, sends `reply` and then says nothing."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    held = []

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)
            if reply:
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return sock, f"tcp://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("reply", [b"", b"\xff" * 64, b"HTTP/1.1 400 Bad Request\r\n\r\n"],
                         ids=["silent", "garbage", "http"])
def test_a_server_that_is_not_a_scheduler_is_one_line_in_bounded_time(reply):
    sock, address = _server(reply)
    try:
        t0 = time.monotonic()
        with pytest.raises(UserError) as e:
            connect(address, timeout=3)
        took = time.monotonic() - t0
    finally:
        sock.close()
    msg = str(e.value)
    assert msg.startswith(f"engine.scheduler: '{address}': ") and "\n" not in msg and len(msg) < 400, msg
    assert took < 15, took


# ---------------------------------------------------------------- Ctrl-C and SIGTERM with local workers

STAGE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_sweep import tiny_inputs, tiny_spec
    from attnrepro.run.stage import run_stage
    from attnrepro.files import write_json
    from attnrepro.run.engine_settings import EngineConfig
    from attnrepro.run.engine import run_sweep

    def main():
        specs = [tiny_spec(seed=s, steps={steps}) for s in range(2)]
        recs = run_sweep("t", specs, tiny_inputs(), EngineConfig(workers=2, scheduler="", store="store"))
        write_json("metrics/out.json", {{"tag": sys.argv[1], "n": len(recs)}})

    if __name__ == "__main__":  # worker processes are spawned: they import this file
        run_stage(main)
""")


def _start(root: Path, tag: str, steps: int) -> subprocess.Popen:
    (root / "stage.py").write_text(STAGE.format(tests=str(Path(__file__).parent), steps=steps))
    return subprocess.Popen([sys.executable, str(root / "stage.py"), tag], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_as_a_terminal_job)


def _as_a_terminal_job() -> None:
    """Ctrl-C's default action, as in a terminal's foreground job: a test run in the background of a
    non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _workers_ignore_sigint(pid: int) -> bool:
    """Both worker processes are up and every process below the stage ignores SIGINT (their preload ran).
    Counting only the ignoring ones once let a nanny's worker still importing torch take the Ctrl-C (a
    traceback on a loaded machine)."""
    ignoring = []
    for kid in _children(pid):
        try:
            status = Path(f"/proc/{kid}/status").read_text()
            cmd = Path(f"/proc/{kid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker import main" in cmd:
            continue
        sig_ign = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigIgn")), 16)
        ignoring.append(bool(sig_ign & (1 << (signal.SIGINT - 1))))
    return len(ignoring) >= 2 and all(ignoring)


@pytest.mark.parametrize("how,code,word", [("SIGINT to the group", 130, "interrupted"),
                                           ("SIGINT while the workers start", 130, "interrupted"),
                                           ("SIGTERM to the stage", 143, "terminated")])
def test_interrupting_a_sweep_is_one_line_and_keeps_the_outputs(tmp_path, how, code, word):
    import psutil

    first = _start(tmp_path, "old", steps=3)
    assert first.wait(timeout=180) == 0, first.stderr.read()
    p = _start(tmp_path, "new", steps=200_000)  # far longer than any wait below: the runs never finish first
    store = RunStore(tmp_path / "store")
    if how == "SIGINT while the workers start":  # once lost: the stage ignored Ctrl-C while its cluster started
        ready = lambda: len(_children(p.pid)) >= 1 and p.poll() is None  # noqa: E731
    else:
        ready = lambda: _workers_ignore_sigint(p.pid) and p.poll() is None  # noqa: E731
    assert wait_for(ready, timeout=120), p.stderr.read() if p.poll() is not None else "no workers"
    kids = _children(p.pid)
    if how.startswith("SIGINT"):
        os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
    else:
        p.send_signal(signal.SIGTERM)  # `kill PID`, as a job scheduler would
    out, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    said = f"{word}; nothing written (the previous outputs are unchanged)"
    if how == "SIGINT while the workers start":  # a worker hit before its preload may still print
        assert said in err.splitlines(), err
    else:
        assert err.strip().splitlines()[-1] == said, err
        assert "Traceback" not in err and "leaked semaphore" not in err, err
    assert json.loads((tmp_path / "metrics/out.json").read_text())["tag"] == "old"
    assert wait_for(lambda: not any(psutil.pid_exists(k) and psutil.Process(k).status() != "zombie" for k in kids),
                    timeout=30), "worker processes outlived the stage"
    assert not list(tmp_path.rglob("*.staged-*")) and not (tmp_path / ".attnrepro-staging").exists()
    assert len(store.keys()) <= 2


def test_an_entry_planted_under_another_runs_key_is_damage(pristine, tmp_path, capsys):
    """The mask_zero run copied over the correct model's entry was served as the correct model."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    other = run_sweep("t", [tiny_spec(seed=1)], tiny_inputs(), engine(tmp_path, workers=1))[0]  # into this store
    planted = store.path(other.key)
    shutil.rmtree(planted)
    shutil.copytree(store.path(first.key), planted)  # seed 0's run filed under seed 1's key
    report = store.verify()
    assert report.damaged == [(other.key, f"filed under key {other.key[:12]}, but its spec.json is the run "
                                          f"{first.key[:12]} (tiny seed 0)")]
    assert cli_main(["store", "verify", "--store", str(tmp_path / "store")]) == 1
    capsys.readouterr()
    assert store.get(other.key) is None and "filed under key" in capsys.readouterr().err  # quarantined, retrained


def test_a_legacy_entry_is_checked_as_far_as_it_can_be(pristine, tmp_path, capsys):
    """Without a manifest: an entry whose spec.json is another run's is damaged, not legacy."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    (store.path(first.key) / MANIFEST).unlink()
    spec = json.loads((store.path(first.key) / "spec.json").read_text())
    spec["seed"] = 7  # an edited record: it no longer hashes to its folder's key
    (store.path(first.key) / "spec.json").write_text(json.dumps({**spec, "spec": {**spec["spec"], "seed": 7}}))
    report = store.verify()
    assert report.legacy == [] and report.damaged and report.damaged[0][0] == first.key
    assert "filed under key" in report.damaged[0][1]
    assert cli_main(["store", "verify", "--store", str(tmp_path / "store")]) == 1


def test_store_verify_and_push_agree_on_a_legacy_entry(pristine, tmp_path, capsys):
    """An entry without a manifest: `store verify` said legacy (exit 0) while push called it damaged."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    (store.path(first.key) / MANIFEST).unlink()
    assert cli_main(["store", "verify", "--store", str(tmp_path / "store")]) == 1
    assert "1 legacy (not served)" in capsys.readouterr().out
    assert cli_main(["store", "push", "--store", str(tmp_path / "store"), "--to", str(tmp_path / "remote")]) == 0
    out = capsys.readouterr().out
    assert "damaged" not in out and "1 legacy not pushed" in out
    assert store.path(first.key).exists()


# ---------------------------------------------------------------- issue 65: one key rule, a store that stays inside itself

@pytest.mark.parametrize("damage", ["edited summary", "truncated checkpoint"])
def test_a_legacy_entry_with_damaged_files_fails_verify_and_is_never_served(pristine, tmp_path, capsys, damage):
    """Without a manifest, an edited summary or a truncated checkpoint verified with exit 0 ("1 legacy")."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store", say=lambda s: None)
    entry = store.path(first.key)
    (entry / MANIFEST).unlink()
    DAMAGE["edited summary, valid JSON" if damage == "edited summary" else "truncated checkpoint"][0](entry)
    assert cli_main(["store", "verify", "--store", str(tmp_path / "store")]) == 1
    assert f"legacy: {first.key}: no MANIFEST.json: its files cannot be verified" in capsys.readouterr().out
    assert store.get(first.key) is None


def _old_format(entry: Path) -> None:
    """spec.json rewritten in the old key format (a code digest, no numerics), the manifest updated to match."""
    import hashlib

    record = json.loads((entry / "spec.json").read_text())
    record.pop("numerics")
    data = json.dumps({**record, "code": "c" * 64}).encode()
    (entry / "spec.json").write_bytes(data)
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["spec.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (entry / MANIFEST).write_text(json.dumps(manifest))


def test_an_old_format_entry_under_another_runs_key_is_never_served(pristine, tmp_path, capsys):
    """Seed 0's run copied into seed 1's folder, its spec.json in the old format and its manifest updated: verify
    said intact, a sweep served it (0 to train) and died with KeyError: 'numerics', push would spread it."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store")
    other = run_sweep("t", [tiny_spec(seed=1)], tiny_inputs(), engine(tmp_path, workers=1))[0]
    planted = store.path(other.key)
    shutil.rmtree(planted)
    shutil.copytree(store.path(first.key), planted)
    _old_format(planted)
    capsys.readouterr()
    assert cli_main(["store", "verify", "--store", str(tmp_path / "store")]) == 1
    out = capsys.readouterr().out
    assert f"legacy: {other.key}: filed under key {other.key[:12]}, but its spec.json is in the old key format" in out
    assert cli_main(["store", "push", "--store", str(tmp_path / "store"), "--to", str(tmp_path / "remote")]) == 0
    assert "1 legacy not pushed" in capsys.readouterr().out
    assert not RunStore(tmp_path / "remote").path(other.key).exists()

    (again,) = run_sweep("t", [tiny_spec(seed=1)], tiny_inputs(), engine(tmp_path, workers=1))
    err = capsys.readouterr().err
    assert not again.cached and again.status == "ok" and "Traceback" not in err  # quarantined and trained again
    assert "old key format" in err and result_bytes([again]) == result_bytes([other])


def test_links_under_the_store_are_reported_and_gc_never_follows_them(pristine, tmp_path, capsys):
    """A shard that is a link to a folder elsewhere: verify called its subfolders misplaced and gc deleted them;
    a .quarantine that is a link: gc emptied its target."""
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = tmp_path / "store"
    outside, elsewhere = tmp_path / "outside", tmp_path / "elsewhere"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "file").write_text("keep me")
    (elsewhere / "old-run").mkdir(parents=True)
    (elsewhere / "notes.txt").write_text("keep me too")
    (store / "zz").symlink_to(outside)
    (store / ".quarantine").symlink_to(elsewhere)
    (RunStore(store).path(first.key) / "extra").symlink_to(outside / "precious" / "file")  # a link in an entry
    capsys.readouterr()

    assert cli_main(["store", "verify", "--store", str(store)]) == 1
    out = capsys.readouterr().out
    for link in ("zz", ".quarantine"):
        assert f"symbolic link, left alone: {store / link}" in out
    assert f"damaged: {first.key}: extra is a symbolic link" in out and "3 symbolic links (left alone)" in out
    assert "misplaced" not in out
    assert cli_main(["store", "gc", "--store", str(store)]) == 0
    assert (outside / "precious" / "file").read_text() == "keep me"
    assert (elsewhere / "old-run").is_dir() and (elsewhere / "notes.txt").read_text() == "keep me too"
    assert (store / "zz").is_symlink() and (store / ".quarantine").is_symlink()
    assert (RunStore(store).path(first.key) / "extra").is_symlink()  # the entry holding a link is left alone too
    assert RunStore(store, say=lambda s: None).quarantine(first.key, "x") is None  # never moved into a link

    assert cli_main(["store", "push", "--store", str(store), "--to", str(tmp_path / "remote")]) == 1
    assert "symbolic link, not followed: zz" in capsys.readouterr().out
    assert not list((tmp_path / "remote").glob("zz*"))


def test_a_shard_that_is_a_link_is_never_read_nor_written_through(pristine, tmp_path, capsys):
    src, first = pristine
    shutil.copytree(src, tmp_path / "store")
    store = RunStore(tmp_path / "store", say=print)
    shard = store.path(first.key).parent
    shutil.move(shard, tmp_path / "moved")
    shard.symlink_to(tmp_path / "moved")
    capsys.readouterr()
    assert store.get(first.key) is None and "is a symbolic link, left alone" in capsys.readouterr().out
    with pytest.raises(UserError, match="is a symbolic link; the store does not write through links"):
        store.put(first.key, {"status.json": b'{"status": "ok"}'})
    assert (tmp_path / "moved" / first.key).is_dir() and shard.is_symlink()
