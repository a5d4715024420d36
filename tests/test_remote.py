"""The run store travels: `attnrepro store push` / `pull` to a store remote in a folder, and the
project's DVC remote layout (.dvc/config) with `dvc push` / `dvc pull` (docs/remote.md)."""

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import store_entry

from attnrepro.commands import main as cli
from attnrepro.store.remote import default_remote, pull, push
from attnrepro.store.run_store import RunStore

REPO = Path(__file__).resolve().parents[1]


def _fill(store: RunStore, n: int) -> list[str]:
    keys = []
    for i in range(n):
        key, files = store_entry(f"run {i}", {"status.json": b'{"status": "ok"}', "model.pt": os.urandom(2048 + i),
                                               "summary.json": json.dumps({"loss": i}).encode()})
        store.put(key, files)
        keys.append(key)
    return keys


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.relative_to(root).parts[0].startswith(".")}


def test_push_then_pull_into_a_fresh_store_is_byte_identical(tmp_path):
    a, remote, b = tmp_path / "a", tmp_path / "remote", tmp_path / "b"
    keys = _fill(RunStore(a), 3)
    first = push(a, remote)
    assert sorted(first.copied) == sorted(keys) and not first.damaged
    got = pull(b, remote)
    assert sorted(got.copied) == sorted(keys)
    assert _tree(a) == _tree(remote) == _tree(b)  # MANIFEST.json included
    assert RunStore(b).verify().intact == 3
    # again: nothing travels, everything is already there
    again = push(a, remote)
    assert again.copied == [] and again.present == 3
    assert pull(b, remote).present == 3


def test_a_damaged_entry_is_not_pushed(tmp_path, capsys):
    a, remote = tmp_path / "a", tmp_path / "remote"
    keys = _fill(RunStore(a), 3)
    bad = RunStore(a).path(keys[1]) / "model.pt"
    data = bytearray(bad.read_bytes())
    data[10] ^= 0xFF  # same size: only the hash can tell
    bad.write_bytes(bytes(data))
    rc = cli.main(["store", "push", "--store", str(a), "--to", str(remote)])
    out = capsys.readouterr().out
    assert rc == 1
    assert f"damaged, not pushed: {keys[1]}: model.pt does not match its SHA-256" in out
    assert "store pushed: 2 entries copied" in out and "1 damaged not pushed" in out
    assert not RunStore(remote).path(keys[1]).exists()
    assert bad.exists()  # left where it was, for `attnrepro store verify` / gc to deal with
    assert sorted(RunStore(remote).keys()) == sorted([keys[0], keys[2]])


def test_a_damaged_remote_entry_is_not_pulled(tmp_path, capsys):
    a, remote, b = tmp_path / "a", tmp_path / "remote", tmp_path / "b"
    keys = _fill(RunStore(a), 2)
    push(a, remote)
    (RunStore(remote).path(keys[0]) / "summary.json").write_text("{", encoding="utf-8")
    rc = cli.main(["store", "pull", "--store", str(b), "--from", str(remote)])
    out = capsys.readouterr().out
    assert rc == 1 and f"damaged, not pulled: {keys[0]}" in out
    assert RunStore(b).keys() == [keys[1]]


def test_pull_replaces_a_damaged_local_entry(tmp_path):
    a, remote, b = tmp_path / "a", tmp_path / "remote", tmp_path / "b"
    keys = _fill(RunStore(a), 1)
    push(a, remote)
    pull(b, remote)
    (RunStore(b).path(keys[0]) / "model.pt").write_bytes(b"short")
    got = pull(b, remote, )
    assert got.copied == keys
    assert filecmp.cmp(RunStore(b).path(keys[0]) / "model.pt", RunStore(a).path(keys[0]) / "model.pt", shallow=False)


def test_push_and_pull_name_their_own_flag(tmp_path, capsys):
    # each action has its own options: push takes --to, not --from
    assert cli.main(["store", "push", "--store", str(tmp_path), "--from", str(tmp_path / "r")]) == 2
    assert "unrecognized arguments: --from" in capsys.readouterr().err
    assert cli.main(["store", "pull", "--store", str(tmp_path / "s"), "--from", str(tmp_path / "nowhere")]) == 2
    assert "no store remote there" in capsys.readouterr().err


def test_default_store_remote_is_runs_in_the_dvc_default_remote(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNREPRO_STORE_REMOTE", raising=False)
    # this repository's .dvc/config: a folder beside the checkout
    assert default_remote(REPO) == (REPO.parent / "attnrepro-remote" / "runs").resolve()
    monkeypatch.setenv("ATTNREPRO_STORE_REMOTE", str(tmp_path / "elsewhere"))
    assert default_remote(REPO) == tmp_path / "elsewhere"


def _git_dvc_repo(path: Path, remote: Path) -> None:
    path.mkdir()
    run = lambda *cmd: subprocess.run(cmd, cwd=path, check=True, capture_output=True, text=True)  # noqa: E731
    run("git", "init", "-q")
    run("git", "config", "user.email", "t@example.com")
    run("git", "config", "user.name", "t")
    run(sys.executable, "-m", "dvc", "init", "-q")
    run(sys.executable, "-m", "dvc", "remote", "add", "-d", "local", str(remote))


@pytest.mark.slow
def test_dvc_push_pull_and_the_store_share_one_remote_folder(tmp_path):
    """The documented layout: DVC's objects and the run store in one folder; `dvc push`/`dvc pull`
    round-trip a DVC-tracked output, `attnrepro store push`/`pull` the runs, and `dvc gc --cloud`
    leaves runs/ alone."""
    remote = tmp_path / "attnrepro-remote"
    one, two = tmp_path / "one", tmp_path / "two"
    _git_dvc_repo(one, remote)
    run = lambda cwd, *cmd: subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)  # noqa: E731
    (one / "data").mkdir()
    (one / "data" / "model.pt").write_bytes(os.urandom(4096))
    run(one, sys.executable, "-m", "dvc", "add", "data/model.pt")
    run(one, "git", "add", "-A")
    run(one, "git", "commit", "-qm", "data")
    run(one, sys.executable, "-m", "dvc", "push")
    keys = _fill(RunStore(one / "runs"), 2)
    env = {**os.environ, "ATTNREPRO_STORE_REMOTE": ""}
    env.pop("ATTNREPRO_STORE_REMOTE")
    subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "store", "push", "--store", "runs"], cwd=one, env=env,
                   check=True, capture_output=True)
    assert sorted(RunStore(remote / "runs").keys()) == sorted(keys)

    run(tmp_path, "git", "clone", "-q", str(one), str(two))
    run(two, sys.executable, "-m", "dvc", "pull")
    assert (two / "data" / "model.pt").read_bytes() == (one / "data" / "model.pt").read_bytes()
    subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "store", "pull", "--store", "runs"], cwd=two, env=env,
                   check=True, capture_output=True)
    assert _tree(two / "runs") == _tree(one / "runs")

    run(one, sys.executable, "-m", "dvc", "gc", "--workspace", "--cloud", "--force")
    assert sorted(RunStore(remote / "runs").keys()) == sorted(keys)
    assert RunStore(remote / "runs").verify().intact == 2


def test_an_entry_planted_under_another_key_is_neither_pulled_nor_pushed(tmp_path, capsys):
    """`cp -a runs/<one run> runs/<another run's key>` once travelled as that other run."""
    a, remote, b = tmp_path / "a", tmp_path / "remote", tmp_path / "b"
    keys = _fill(RunStore(a), 2)
    push(a, remote)
    planted = RunStore(remote).path(keys[1])
    shutil.rmtree(planted)
    shutil.copytree(RunStore(remote).path(keys[0]), planted)  # run 0 filed as run 1
    rc = cli.main(["store", "pull", "--store", str(b), "--from", str(remote)])
    out = capsys.readouterr().out
    assert rc == 1 and f"damaged, not pulled: {keys[1]}: filed under key {keys[1][:12]}, but its spec.json is the " \
                       f"run {keys[0][:12]} (run 0)" in out
    assert RunStore(b).keys() == [keys[0]]
    shutil.rmtree(RunStore(a).path(keys[1]))
    shutil.copytree(RunStore(a).path(keys[0]), RunStore(a).path(keys[1]))
    assert cli.main(["store", "push", "--store", str(a), "--to", str(tmp_path / "remote2")]) == 1
    assert f"damaged, not pushed: {keys[1]}" in capsys.readouterr().out
