"""The run engine's settings: where a sweep's runs execute and where the run store is (params
`engine`; the engine itself is attnrepro.run.engine).

They never change a result (a run is byte-identical whichever way it ran), so no stage
depends on this module or on params `engine` in dvc.yaml.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from attnrepro.config import ConfigError, from_dict, require


@dataclass
class EngineConfig:
    workers: int  # local worker processes; 0 = one per CPU core; 1 = serial, in this process
    scheduler: str  # address of an existing Dask scheduler; "" = a LocalCluster on this machine
    store: str  # the run store folder
    store_only: bool = False  # serve every run from the store, train none (a missing run is an error)

    def validate(self, prefix: str = "engine") -> None:
        require(self.workers >= 0, f"{prefix}.workers", self.workers, "an integer >= 0 (0: one per core)")
        require(bool(self.store.strip()), f"{prefix}.store", self.store, "a folder for the run store")

    @property
    def n_workers(self) -> int:
        if self.workers:
            return self.workers
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        return max(1, len(cores))  # the cores this process may use (a container or taskset may allow fewer)


def engine_config(params: Mapping, scheduler: Optional[str] = None, workers: Optional[int] = None,
                  store: Optional[str] = None, store_only: bool = False) -> EngineConfig:
    """params.yaml's `engine` section; $ATTNREPRO_SCHEDULER / $ATTNREPRO_WORKERS override it,
    and explicit arguments (a stage's --scheduler / --workers / --store / --store-only) override both."""
    section = dict(params.get("engine") or {})
    if os.environ.get("ATTNREPRO_SCHEDULER") is not None:
        section["scheduler"] = os.environ["ATTNREPRO_SCHEDULER"]
    if os.environ.get("ATTNREPRO_WORKERS"):
        try:
            section["workers"] = int(os.environ["ATTNREPRO_WORKERS"])
        except ValueError:
            raise ConfigError(f"ATTNREPRO_WORKERS: got {os.environ['ATTNREPRO_WORKERS']!r}, expected an integer") from None
    if scheduler is not None:
        section["scheduler"] = scheduler
    if workers is not None:
        section["workers"] = workers
    if store is not None:
        section["store"] = store
    section["store_only"] = store_only
    return from_dict(EngineConfig, section, prefix="engine")


def add_engine_args(ap) -> None:
    """--scheduler / --workers for a stage that runs a sweep."""
    ap.add_argument("--scheduler", default=None, metavar="ADDRESS",
                    help="run the sweep on an existing Dask scheduler, e.g. tcp://10.0.0.5:8786 "
                         "(default: engine.scheduler in params.yaml, or $ATTNREPRO_SCHEDULER)")
    ap.add_argument("--workers", type=int, default=None, metavar="N",
                    help="local worker processes; 0 = one per core, 1 = serial (default: engine.workers)")
    ap.add_argument("--store", default=None, metavar="FOLDER", help="the run store (default: engine.store)")
    ap.add_argument("--store-only", action="store_true",
                    help="serve every run from the store and train none: a run it lacks stops the stage "
                         "(attnrepro check makes a sweep's outputs again this way)")
