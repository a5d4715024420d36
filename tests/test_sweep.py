"""The run engine with real Dask (no mocks): one run function, the run store, sweeps that resume.

Tiny corpus_lm runs of a few seconds each. Covers: serial, local-cluster and
external-scheduler sweeps give byte-identical results; a failing and a diverging
run are recorded while the others finish; adding a seed trains exactly one new
run; a sweep killed with SIGKILL half-way resumes without retraining finished runs;
a worker killed mid-run is retried; two writers of one run leave one whole copy.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from attnrepro.config import UserError
from attnrepro.run.task_lm import LMData, LMMeasure, Sample
from attnrepro.run.execute import execute_to_bytes, run_key
from attnrepro.run.spec import RunSpec
from attnrepro.store.run_store import RunStore
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.run.engine import RunsFailed, require_ok, run_sweep
from attnrepro.run.loop import OptimConfig
from conftest import store_entry, tinygpt

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
ITOS = ["<pad>", "<unk>", "\n", "秦", "川", "雄", "帝", "宅", "，", "。", "函", "谷"]


def tiny_inputs(seed: int = 0) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    out = {"vocab.json": json.dumps(ITOS, ensure_ascii=False).encode()}
    for name, n in (("train.npy", 3000), ("val.npy", 400)):
        buf = io.BytesIO()
        np.save(buf, (np.arange(n) % 9 + 2 + (rng.random(n) < 0.1)).astype(np.uint16))
        out[name] = buf.getvalue()
    return out


def tiny_spec(seed: int = 0, steps: int = 12, **model) -> RunSpec:
    optim = OptimConfig(steps=steps, batch_size=4, optimizer="adamw", lr=1e-2, betas=[0.9, 0.95], weight_decay=0.1,
                        decay="2d", schedule="cosine", warmup=2, min_lr_ratio=0.1, grad_clip=1.0)
    return RunSpec(task="corpus_lm",
                   model=tinygpt(**{"vocab_size": None, "block_size": 8, "d_model": 16, "n_head": 2, "n_layer": 1,
                                        **model}),
                   optim=optim, seed=seed, batch_seed=seed, data=LMData(val_batches=2, val_seed=7),
                   diag_every=0, diag_steps=(0, 5), eval_every=4, eval_final=False,
                   measure=LMMeasure(loss_window=3, summary_steps=[0, 5], diagnostics=True, qk_scale=True,
                                     symptoms=False, sample=Sample(prompt="秦川", tokens=4, temperature=0.8, seed=0)),
                   threads=1, device="cpu", label=f"tiny seed {seed}")


def engine(tmp_path, workers=2, scheduler="") -> EngineConfig:
    return EngineConfig(workers=workers, scheduler=scheduler, store=str(tmp_path / "store"))


def result_bytes(records) -> list[dict[str, bytes]]:
    """Each run's files, timing.json (wall-clock seconds) and the manifest (which hashes it) aside."""
    return [{p.name: p.read_bytes() for p in sorted(r.path.iterdir()) if p.name not in ("timing.json", "MANIFEST.json")}
            for r in records]


def test_run_function_writes_one_result_folder(tmp_path):
    files = execute_to_bytes(tiny_spec(), tiny_inputs())
    assert {"spec.json", "status.json", "summary.json", "history.json", "evals.json", "model.pt", "sample.txt",
            "env.json", "timing.json"} == set(files)
    summary = json.loads(files["summary.json"])
    assert summary["params"] > 0 and summary["entropy_step5"] > 0 and "trained_q_std_l0" in summary
    assert [r["step"] for r in json.loads(files["history.json"])] == list(range(12))
    assert [r["step"] for r in json.loads(files["evals.json"])] == [0, 4, 8]
    again = execute_to_bytes(tiny_spec(), tiny_inputs())
    assert {k: v for k, v in again.items() if k != "timing.json"} == \
        {k: v for k, v in files.items() if k != "timing.json"}


def test_key_covers_config_data_and_numerics_but_not_the_label(monkeypatch):
    from attnrepro.run import execute as runs

    spec, inputs = tiny_spec(), tiny_inputs()
    key = run_key(spec, inputs)
    assert run_key(dataclasses.replace(spec, label="renamed"), inputs) == key
    # one run, however its values were written: 1 and 1.0 for a float, a tuple or a list of diag steps
    assert run_key(dataclasses.replace(spec, optim=dataclasses.replace(spec.optim, grad_clip=1), diag_steps=[5, 0]),
                   inputs) == key
    monkeypatch.setitem(runs.NUMERICS, "corpus_lm", runs.NUMERICS["corpus_lm"] + 1)
    assert run_key(spec, inputs) != key
    monkeypatch.undo()
    assert run_key(tiny_spec(seed=1), inputs) != key
    assert run_key(tiny_spec(steps=13), inputs) != key
    assert run_key(spec, tiny_inputs(seed=1)) != key


def test_a_d_qk_equal_to_d_head_is_the_same_run_and_older_keys_hold():
    """ModelConfig.d_qk: a spec stating d_qk = d_head (8 here) is the run that leaves it null, key for key; a
    null d_qk stays out of the key material, so every run keyed before the field existed keeps its key (no
    stored run re-keyed or retrained); a q/k width of its own is a different run, and recorded material
    without d_qk reads back as the same spec."""
    from attnrepro.model.transformer import ModelConfig
    from attnrepro.run.execute import spec_from_material

    inputs = tiny_inputs()
    spec = tiny_spec()
    assert spec.model.d_qk is None
    key = run_key(spec, inputs)
    assert run_key(tiny_spec(d_qk=8), inputs) == key and tiny_spec(d_qk=8) == spec
    material = spec.key_material()
    assert set(material["model"]) == {f.name for f in dataclasses.fields(ModelConfig)} - {"d_qk"}
    assert spec_from_material(material) == spec
    other = tiny_spec(d_qk=4)
    assert run_key(other, inputs) != key and other.key_material()["model"]["d_qk"] == 4
    assert spec_from_material(other.key_material()) == other


@pytest.fixture(scope="module")
def external_scheduler(tmp_path_factory):
    """`dask scheduler` and two `dask worker`s as separate processes on localhost."""
    d = tmp_path_factory.mktemp("cluster")
    sched_file = d / "scheduler.json"
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1")
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.time() + 60
    while not sched_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    address = json.loads(sched_file.read_text())["address"]
    for _ in range(2):
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nthreads", "1", "--no-dashboard"],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    with Client(address, timeout="30s") as c:
        c.wait_for_workers(2, timeout=60)
    yield address
    for p in procs[::-1]:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def test_serial_local_and_external_cluster_are_byte_identical(tmp_path, external_scheduler):
    specs, inputs = [tiny_spec(seed=s) for s in range(3)], tiny_inputs()
    serial = run_sweep("t", specs, inputs, engine(tmp_path / "a", workers=1))
    local = run_sweep("t", specs, inputs, engine(tmp_path / "b", workers=2))
    cluster = run_sweep("t", specs, inputs, engine(tmp_path / "c", scheduler=external_scheduler))
    assert all(r.status == "ok" and not r.cached for r in serial + local + cluster)
    assert result_bytes(serial) == result_bytes(local) == result_bytes(cluster)
    assert [r.key for r in serial] == [r.key for r in cluster]


def test_an_unreachable_scheduler_is_one_clear_error(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UserError, match=f"engine.scheduler: 'tcp://127.0.0.1:{port}': cannot connect"):
        run_sweep("t", [tiny_spec()], tiny_inputs(), engine(tmp_path, scheduler=f"tcp://127.0.0.1:{port}"))
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("summary.json"))


def test_failing_and_diverging_runs_are_data_and_the_others_finish(tmp_path):
    good = tiny_spec(seed=0)
    raises = dataclasses.replace(tiny_spec(seed=1), device="meta")  # its data load, its training raises
    diverges = dataclasses.replace(tiny_spec(seed=2), optim=dataclasses.replace(tiny_spec().optim, lr=1e6,
                                                                                 grad_clip=None))
    recs = run_sweep("t", [good, raises, diverges], tiny_inputs(), engine(tmp_path))
    assert [r.status for r in recs] == ["ok", "failed", "diverged"]
    assert recs[1].reason and recs[1].path is None
    assert "diverged at step" in recs[2].reason and (recs[2].path / "status.json").exists()
    store = RunStore(tmp_path / "store")
    assert set(store.keys()) == {recs[0].key, recs[2].key}  # a raised run is tried again next time
    with pytest.raises(RunsFailed) as e:
        require_ok(recs, "t")
    msg = str(e.value)
    assert "\n" not in msg and "2 of 3 runs" in msg and "tiny seed 1" in msg and "tiny seed 2" in msg


def test_adding_a_seed_trains_exactly_one_new_run(tmp_path):
    inputs = tiny_inputs()
    first = run_sweep("t", [tiny_spec(seed=s) for s in (0, 1)], inputs, engine(tmp_path))
    second = run_sweep("t", [tiny_spec(seed=s) for s in (0, 1, 2)], inputs, engine(tmp_path))
    assert [r.cached for r in first] == [False, False]
    assert [r.cached for r in second] == [True, True, False]
    assert result_bytes(second[:2]) == result_bytes(first)


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_sweep import tiny_inputs, tiny_spec
    from attnrepro.run.engine_settings import EngineConfig
    from attnrepro.run.engine import run_sweep
    if __name__ == "__main__":  # worker processes are spawned: they import this file
        specs = [tiny_spec(seed=s, steps={steps}) for s in range({n})]
        run_sweep("t", specs, tiny_inputs(), EngineConfig(workers={workers}, scheduler="", store={store!r}))
""")


def start_sweep(tmp_path, n, steps, workers) -> subprocess.Popen:
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), steps=steps, n=n, workers=workers,
                                    store=str(tmp_path / "store")))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_for(cond, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False


def test_sweep_killed_half_way_resumes_without_retraining(tmp_path):
    store = RunStore(tmp_path / "store")
    proc = start_sweep(tmp_path, n=4, steps=150, workers=2)
    assert wait_for(lambda: len(store.keys()) >= 1), proc.stderr.read() if proc.poll() is not None else "no run"
    os.killpg(proc.pid, signal.SIGKILL)  # the stage and its workers, as kill -9 of `dvc repro` would
    proc.wait()
    finished = set(store.keys())
    assert 1 <= len(finished) < 4
    specs = [tiny_spec(seed=s, steps=150) for s in range(4)]
    recs = run_sweep("t", specs, tiny_inputs(), engine(tmp_path, workers=1))
    assert all(r.status == "ok" for r in recs)
    assert {r.key for r in recs if r.cached} == finished
    assert len(store.keys()) == 4 and not any((tmp_path / "store" / ".tmp").iterdir())
    # the resumed runs are the same bytes as uninterrupted ones
    fresh = run_sweep("t", specs, tiny_inputs(), engine(tmp_path / "fresh", workers=1))
    assert result_bytes(recs) == result_bytes(fresh)


def _sweep_killing_workers(tmp_path, seeds, scheduler: str, kill) -> list:
    """Run two long tiny runs in a thread; once both train, `kill(client)` SIGKILLs worker processes;
    returns the records, after checking they equal an undisturbed serial sweep's."""
    import threading

    from distributed import Client

    specs = [tiny_spec(seed=s, steps=3000) for s in seeds]
    out: dict = {}
    eng = engine(tmp_path, scheduler=scheduler) if scheduler else engine(tmp_path, workers=2)
    t = threading.Thread(target=lambda: out.update(recs=run_sweep("t", specs, tiny_inputs(), eng)))
    t.start()
    if scheduler:
        client = Client(scheduler, timeout="30s")
    else:  # the sweep's own LocalCluster: find its scheduler through the progress it publishes
        from distributed.deploy.spec import SpecCluster

        assert wait_for(lambda: any(c.status.name == "running" for c in list(SpecCluster._instances)))
        client = Client(next(c for c in list(SpecCluster._instances) if c.status.name == "running"))
    try:
        keys = {run_key(s, tiny_inputs()) for s in specs}  # both runs are training once both reported progress
        assert wait_for(lambda: {e[1]["key"] for e in client.get_events("attnrepro-progress")} >= keys)
        kill(client)
        t.join(timeout=300)
    finally:
        client.close()
    recs = out["recs"]
    assert [r.status for r in recs] == ["ok", "ok"], [r.reason for r in recs]
    fresh = run_sweep("t", specs, tiny_inputs(), engine(tmp_path / "fresh", workers=1))
    assert result_bytes(recs) == result_bytes(fresh)
    return recs


def _kill_one_busy_worker(client):
    busy = [w for w, tasks in client.processing().items() if tasks]
    os.kill(client.run(os.getpid, workers=busy[:1])[busy[0]], signal.SIGKILL)  # its nanny starts a new one


def _kill_every_worker(client):
    for pid in client.run(os.getpid).values():
        os.kill(pid, signal.SIGKILL)  # every worker at once (the inputs they held die with them)


def test_a_killed_worker_is_retried_once(tmp_path, external_scheduler):
    _sweep_killing_workers(tmp_path, (10, 11), external_scheduler, _kill_one_busy_worker)
    with __import__("distributed").Client(external_scheduler, timeout="30s") as client:
        client.wait_for_workers(2, timeout=60)


@pytest.mark.parametrize("where", ["external", "local"])
def test_losing_every_worker_at_once_retries_each_run(tmp_path, external_scheduler, where):
    """Once "already forgotten" and the whole sweep cancelled; now the inputs are recomputed and
    each run is resubmitted once. The local cluster's scheduler gives up at the first death
    (allowed-failures 0): there only the sweep's own resubmission saves the runs."""
    _sweep_killing_workers(tmp_path, (20, 21) if where == "external" else (22, 23),
                           external_scheduler if where == "external" else "", _kill_every_worker)
    if where == "external":
        with __import__("distributed").Client(external_scheduler, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)


def test_two_writers_of_one_run_leave_one_whole_copy(tmp_path):
    store = RunStore(tmp_path / "store")
    key, files = store_entry("a run", {"status.json": b'{"status": "ok"}', "summary.json": b"{}"})
    a = store.put(key, files)
    b = store.put(key, {**files, "summary.json": b'{"other": 1}'})
    assert a == b and (a / "summary.json").read_bytes() == b"{}"
    # a half-written result of a writer that died is not a result, and is cleaned away
    dead = tmp_path / "store" / ".tmp" / f"{'cd' + '0' * 62}--{socket.gethostname()}--999999999--x"
    dead.mkdir(parents=True)
    (dead / "status.json").write_text("{}")
    assert store.get("cd" + "0" * 62) is None
    assert store.clean_tmp() == 1 and not dead.exists()


def test_a_store_path_that_is_a_file_is_refused_before_any_run_trains(tmp_path):
    (tmp_path / "README.md").write_text("not a store")
    eng = EngineConfig(workers=1, scheduler="", store=str(tmp_path / "README.md"))
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=r"^engine\.store: .*README\.md is a file, not a folder for the run store$"):
        run_sweep("t", [tiny_spec()], tiny_inputs(), eng)
    assert time.perf_counter() - t0 < 5


def test_a_block_longer_than_the_data_is_one_line_before_the_cluster_starts(tmp_path):
    eng = engine(tmp_path, workers=2)
    specs = [tiny_spec(seed=s, block_size=10_000) for s in range(3)]
    with pytest.raises(UserError, match=r"^sweep t: run tiny seed 0 cannot read its data: token stream of \d+ is "
                                         r"too short for block_size 10000$"):
        run_sweep("t", specs, tiny_inputs(), eng)
    assert not (tmp_path / "store").exists() or RunStore(tmp_path / "store").keys() == []
