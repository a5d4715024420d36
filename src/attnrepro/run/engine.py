"""The run engine: sweeps, many runs fanned out on Dask, skipping what the run store already holds.

A sweep is a list of RunSpecs with the data they read. `run_sweep` looks every run
up in the store, trains the missing ones and stores them, and returns one
RunRecord per spec. Where the runs execute:

  serial      in this process (engine.workers 1, or a single run to do)
  local       a Dask LocalCluster of `workers` processes (0: one per CPU core), one
              torch thread each: the default
  cluster     an existing Dask scheduler (engine.scheduler, $ATTNREPRO_SCHEDULER or a
              stage's --scheduler): `dask scheduler` + `dask worker` on any machines,
              or dask-jobqueue on Slurm (README, "Sweeps, the run store, and a cluster"; docs/sweeps.md)

Every run pins its own seeds and thread count, so its result is byte-identical
whichever way it ran. Results travel back to this process as bytes and are written
to the store here: workers need the same attnrepro installed, not a shared disk
(a worker whose numerics or torch version differs from ours is caught by the key it reports).

Faults are data: a run that raises or loses its worker twice is a failed record
with its reason (not stored: it is tried again next time); a diverged run is a
stored result with status "diverged". The sweep always finishes the other runs.
The inputs reach the workers as the result of a task, not as scattered data, so
when every worker dies at once the scheduler recomputes them and retries each
unfinished run once. A scheduler address gets a bounded connect-and-handshake
(SCHEDULER_TIMEOUT); a damaged store entry is quarantined and trained again
(attnrepro.store.run_store).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import dask
import psutil
from distributed import Client, KilledWorker, LocalCluster, Nanny, as_completed, get_worker
from distributed.core import Status, rpc
from distributed.deploy.spec import SpecCluster

from attnrepro.config import UserError
from attnrepro.progress import progress
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.run.execute import TASKS, execute_to_bytes, run_key
from attnrepro.run.spec import RunSpec
from attnrepro.store.run_store import RunStore

PROGRESS_TOPIC = "attnrepro-progress"
SCHEDULER_TIMEOUT = 20.0  # seconds to connect to a scheduler and hear it answer
RESUBMIT_SETTLE = 2.0  # seconds to wait before resubmitting a run whose worker died
QUIET_TRACKER = "ignore:resource_tracker:UserWarning"


@dataclass
class RunRecord:
    spec: RunSpec
    key: str
    status: str  # ok | diverged | failed
    reason: str
    path: Optional[Path]  # the result folder in the store (None when failed)
    cached: bool  # found in the store, not trained by this sweep
    seconds: Optional[float] = None  # the run's own wall time, when it was trained now

    @property
    def label(self) -> str:
        return self.spec.label or self.key[:12]

    def summary(self) -> dict:
        return json.loads((self.path / "summary.json").read_text(encoding="utf-8"))

    def read(self, name: str):
        return json.loads((self.path / name).read_text(encoding="utf-8"))


class RunsFailed(UserError):
    """Some runs of a sweep failed or diverged; the message names them (one line)."""


def require_ok(records: Sequence[RunRecord], what: str) -> None:
    bad = [r for r in records if r.status != "ok"]
    if bad:
        named = "; ".join(f"{r.label}: {r.status} ({r.reason})" for r in bad[:4])
        more = f"; and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise RunsFailed(f"{what}: {len(bad)} of {len(records)} runs did not finish: {named}{more}")


_MALLOC_TUNED = False


def _undo_dask_malloc_trim() -> None:
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also freezes glibc's
    mmap threshold: every large tensor is then mmap'ed and unmapped again, and training runs
    about 40% slower than in a plain process (measured here). Restore heap reuse in this worker."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return
    _MALLOC_TUNED = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap for reuse
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: the largest glibc allows (32 MiB)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to undo


def _remote(spec: RunSpec, inputs: Mapping[str, bytes], key: str) -> dict[str, bytes]:
    """The task a Dask worker runs: train, report progress as events, return the result files."""
    _undo_dask_malloc_trim()
    worker = get_worker()
    last = [0.0]

    def tick(steps_done: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0 or steps_done == spec.steps:
            last[0] = now
            worker.log_event(PROGRESS_TOPIC, {"key": key, "steps": steps_done})

    return execute_to_bytes(spec, inputs, tick)


def _cost(spec: RunSpec) -> float:
    """A rough relative cost, to start the longest runs first."""
    return spec.steps * spec.model.d_model ** 2 * spec.model.n_layer


class _Progress:
    """runs done/total, failures and an ETA (in training steps) on a terminal and in logs."""
    def __init__(self, name: str, todo: list[tuple[RunSpec, str]], cached: int, total: int):
        self.name, self.total_runs, self.done_runs, self.failed = name, total, cached, 0
        self.steps = {key: 0 for _, key in todo}
        self.limit = {key: spec.steps for spec, key in todo}
        self.bar = progress(sum(self.limit.values()), f"sweep {name}", unit="step")
        self._post()

    def _post(self) -> None:
        self.bar.set_postfix_str(f"runs {self.done_runs}/{self.total_runs}, failed {self.failed}", refresh=False)

    def steps_done(self, key: str, n: int) -> None:
        n = min(n, self.limit.get(key, 0))
        delta = n - self.steps.get(key, 0)
        if delta > 0:
            self.steps[key] = n
            self.bar.update(delta)

    def finished(self, record: RunRecord) -> None:
        self.done_runs += 1
        self.failed += record.status != "ok"
        self.steps_done(record.key, self.limit.get(record.key, 0))
        took = f" in {record.seconds:.0f} s" if record.seconds is not None else ""
        word = {"ok": "done", "diverged": "DIVERGED", "failed": "FAILED"}[record.status]
        reason = f": {record.reason}" if record.reason else ""
        self.bar.write(f"[{self.name}] {record.label} {word}{took}{reason} "
                       f"({self.done_runs}/{self.total_runs} runs, {self.failed} failed)")
        self._post()
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def run_sweep(name: str, specs: Sequence[RunSpec], inputs: Mapping[str, bytes], engine: EngineConfig,
              ) -> list[RunRecord]:
    """Every spec's result from the store, training the missing ones first (see module doc)."""
    RunStore.check_writable(engine.store)
    store = RunStore(engine.store)
    store.clean_tmp()
    keys = [run_key(s, inputs) for s in specs]
    records: dict[str, RunRecord] = {}
    todo: list[tuple[RunSpec, str]] = []
    for spec, key in zip(specs, keys):
        if key in records or any(k == key for _, k in todo):
            continue
        path = store.get(key, full=True, label=spec.label)
        if path is not None:
            status = json.loads((path / "status.json").read_text(encoding="utf-8"))
            records[key] = RunRecord(spec, key, status["status"], status.get("reason", ""), path, True)
        else:
            todo.append((spec, key))
    n_unique = len(records) + len(todo)
    if todo and engine.store_only:
        raise UserError(f"sweep {name}: {len(todo)} of {n_unique} runs are not in the store ({engine.store}); "
                        "--store-only trains none")
    check_inputs(name, [spec for spec, _ in todo], inputs)
    print(f"sweep {name}: {n_unique} runs, {len(records)} in the store ({engine.store}), {len(todo)} to train"
          + (f" on {_where(engine, len(todo))}" if todo else ""), flush=True)
    if todo:
        bar = _Progress(name, todo, len(records), n_unique)
        try:
            if engine.scheduler or (engine.n_workers > 1 and len(todo) > 1):
                _run_dask(todo, inputs, engine, store, records, bar)
            else:
                _run_serial(todo, inputs, store, records, bar)
        finally:
            bar.close()
    return [dataclasses.replace(records[k], spec=s) for s, k in zip(specs, keys)]


def check_inputs(name: str, specs: Sequence[RunSpec], inputs: Mapping[str, bytes]) -> None:
    """Each distinct way the runs read their data, prepared here once before any run is scheduled:
    a param the data cannot serve (a block longer than the token stream, say) is one line now, not
    a traceback from every worker after the cluster started."""
    seen = set()
    for spec in specs:
        how = (spec.task, repr(spec.data), spec.model.block_size, spec.optim.batch_size)
        if how in seen:
            continue
        seen.add(how)
        try:
            TASKS[spec.task].prepare(spec, inputs, "cpu")
        except UserError:
            raise
        except (ValueError, KeyError, IndexError) as e:
            raise UserError(f"sweep {name}: run {spec.label or spec.task} cannot read its data: {e}") from None


def _where(engine: EngineConfig, n_todo: int) -> str:
    if engine.scheduler:
        return f"the Dask scheduler at {engine.scheduler}"
    if engine.n_workers > 1 and n_todo > 1:
        return f"{min(engine.n_workers, n_todo)} local Dask workers"
    return "this process"


def _store_result(spec: RunSpec, key: str, files: Mapping[str, bytes], store: RunStore) -> RunRecord:
    if json.loads(files["spec.json"].decode("utf-8")).get("key") != key:
        return RunRecord(spec, key, "failed", "the worker runs different attnrepro code than this process "
                                              "(install the same version on every worker)", None, False)
    status = json.loads(files["status.json"].decode("utf-8"))
    seconds = json.loads(files["timing.json"].decode("utf-8"))["wall_seconds"] if "timing.json" in files else None
    path = store.put(key, files)
    return RunRecord(spec, key, status["status"], status.get("reason", ""), path, False, seconds)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {text[:300]}"


def _run_serial(todo, inputs, store: RunStore, records: dict, bar: _Progress) -> None:
    for spec, key in todo:
        try:
            files = execute_to_bytes(spec, inputs, lambda n, key=key: bar.steps_done(key, n))
            rec = _store_result(spec, key, files, store)
        except Exception as e:  # a run that raises is data; the sweep goes on
            rec = RunRecord(spec, key, "failed", _one_line(e), None, False)
        records[key] = rec
        bar.finished(rec)


def _inputs(inputs: dict) -> dict:
    return inputs


def connect(address: str, timeout: float = SCHEDULER_TIMEOUT):
    """A Client of the Dask scheduler at `address`, or one UserError line: the address must accept a
    TCP connection (within `timeout` s) and answer Dask's identity call (within `timeout` s more; a
    server that is not a Dask scheduler may never answer, or answer garbage)."""


    async def identity() -> dict:
        r = rpc(address, timeout=timeout)
        try:
            return await asyncio.wait_for(r.identity(), timeout)
        finally:
            await r.close_rpc()

    where = f"engine.scheduler: {address!r}"
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if address.startswith("tcp://") and port.isdigit():  # a closed port fails now, not after Dask's retries
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except OSError as e:
            raise UserError(f"{where}: cannot connect ({_one_line(e)})") from None
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # a failed handshake is our one line, not Dask's log
    try:
        ident = asyncio.run(asyncio.wait_for(identity(), timeout + 1))
    except (asyncio.TimeoutError, TimeoutError):
        raise UserError(f"{where}: no Dask scheduler answered within {timeout:.0f} s") from None
    except OSError as e:
        raise UserError(f"{where}: cannot connect ({_one_line(e)})") from None
    except Exception as e:  # not an address, or a server speaking another protocol
        raise UserError(f"{where}: not a Dask scheduler ({_one_line(e)})") from None
    finally:
        logger.setLevel(level)
    if not isinstance(ident, dict) or ident.get("type") != "Scheduler":
        raise UserError(f"{where}: answered, but is not a Dask scheduler")
    return Client(address, timeout=f"{timeout:.0f}s")


def _run_dask(todo, inputs, engine: EngineConfig, store: RunStore, records: dict, bar: _Progress) -> None:
    cluster = client = None
    futures: dict = {}
    before = _ours()
    try:
        # A run whose worker dies is resubmitted once by the loop below, then reported as failed. The local
        # scheduler gives up at the first death (allowed-failures 0): when every worker dies at once, its
        # own count would charge a run for each worker it was moved to while they were dying.
        with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
            if engine.scheduler:
                client = connect(engine.scheduler)
            else:
                # Workers ended on Ctrl-C leave semaphores that multiprocessing's resource tracker (a
                # process of its own, started with this process's -W options) cleans up with a warning
                if QUIET_TRACKER not in sys.warnoptions:
                    sys.warnoptions.append(QUIET_TRACKER)
                cluster = LocalCluster(n_workers=min(engine.n_workers, len(todo)), threads_per_worker=1,
                                       processes=True, dashboard_address=":0", silence_logs=logging.ERROR,
                                       preload=["attnrepro.run.engine"])  # dask_setup below
                client = Client(cluster)
        client.subscribe_topic(PROGRESS_TOPIC, lambda event: bar.steps_done(event[1]["key"], event[1]["steps"]))
        # a task's result, not scattered data: if every worker holding it dies, the scheduler recomputes it
        data = client.submit(_inputs, dict(inputs), pure=False)
        for spec, key in sorted(todo, key=lambda t: _cost(t[0]), reverse=True):
            fut = client.submit(_remote, spec, data, key, pure=False)
            futures[fut.key] = (fut, spec, key)
        retried: set[str] = set()
        pending = as_completed([f for f, *_ in futures.values()])
        for fut in pending:
            _, spec, key = futures[fut.key]
            try:
                rec = _store_result(spec, key, fut.result(), store)
            except KilledWorker:
                if key not in retried:
                    retried.add(key)
                    # workers that die together are removed by the scheduler one after the other: a run
                    # resubmitted at once can land on one that is dead but not yet removed, and die twice
                    time.sleep(RESUBMIT_SETTLE)
                    if data.status == "error":  # a worker died computing the inputs themselves
                        data = client.submit(_inputs, dict(inputs), pure=False)
                    again = client.submit(_remote, spec, data, key, pure=False)
                    futures[again.key] = (again, spec, key)
                    pending.add(again)
                    continue
                rec = RunRecord(spec, key, "failed", "lost its worker twice (killed, or out of memory)", None, False)
            except Exception as e:
                rec = RunRecord(spec, key, "failed", _one_line(e), None, False)
            records[key] = rec
            bar.finished(rec)
    except BaseException as e:
        if isinstance(e, Exception):  # an error: close as usual, the error is the report
            for c in (client, cluster):
                if c is not None:
                    with contextlib.suppress(Exception):
                        c.close()
        else:  # Ctrl-C, SIGTERM: possibly while the cluster was still starting
            shutdown_quietly(client, cluster, [f for f, *_ in futures.values()], before)
        raise
    client.close()
    if cluster is not None:
        cluster.close()


def dask_setup(worker) -> None:
    """Run in each local worker process as it starts (Dask's preload): ignore SIGINT. A terminal's
    Ctrl-C reaches every process of the job; the stage stops its workers itself, so they print no
    tracebacks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ours() -> tuple[set[int], set[int], set[int]]:
    """This process's child processes, Dask clusters and nannies now (what a sweep must not touch)."""
    return ({p.pid for p in psutil.Process().children(recursive=True)}, {id(c) for c in SpecCluster._instances},
            {id(n) for n in Nanny._instances})


def shutdown_quietly(client, cluster, futures, before: tuple[set[int], set[int], set[int]]) -> None:
    """Stop the runs and the local cluster after an interruption, without Dask's shutdown noise (its
    loggers are switched off: their levels are their own, and its exit handlers log too). A cluster
    interrupted while starting cannot close itself: the processes this sweep started are ended here,
    and Dask's exit handler is told not to try again."""
    for name in [*logging.root.manager.loggerDict, "asyncio"]:  # asyncio: a worker interrupted while its
        if name.split(".")[0] in ("distributed", "tornado", "asyncio"):  # nanny started it logs a traceback
            logging.getLogger(name).disabled = True
    steps = [lambda: client.cancel(futures), lambda: client.close(timeout=10)] if client is not None else []
    steps += [lambda: cluster.close(timeout=10)] if cluster is not None else []
    for step in steps:
        with contextlib.suppress(BaseException):
            step()
    children_before, clusters_before, nannies_before = before
    for c in [c for c in list(SpecCluster._instances) if id(c) not in clusters_before]:
        SpecCluster._instances.discard(c)
    # a nanny still "running" restarts the worker ended below (whose new process then dies noisily)
    for n in [n for n in list(Nanny._instances) if id(n) not in nannies_before]:
        n.status = Status.closed
    kids = [k for k in psutil.Process().children(recursive=True)
            if k.pid not in children_before and not _is_resource_tracker(k)]
    for k in kids:
        with contextlib.suppress(psutil.Error):
            k.terminate()
    _, alive = psutil.wait_procs(kids, timeout=5)
    for k in alive:
        with contextlib.suppress(psutil.Error):
            k.kill()


def _is_resource_tracker(proc) -> bool:
    """multiprocessing's resource tracker: it outlives the workers and cleans up after them."""
    try:
        return any("resource_tracker import main" in part for part in proc.cmdline())
    except psutil.Error:
        return True
