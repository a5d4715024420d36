"""One way to run a DVC stage script, so that each script is its inputs, one library call and its outputs.

    from attnrepro.stage import Stage, stage

    def main(st: Stage) -> None:
        cfg = st.section(FailuresConfig, "failures")
        device = st.pin(cfg.device, cfg.threads, "failures.device")
        result = failures.run(cfg, device, st.engine)
        write_json("metrics/failures.json", result.metrics)

    if __name__ == "__main__":
        stage(main, __doc__, engine=True)

`stage` parses the arguments (--params, and --scheduler/--workers for a stage on the run
engine), reads params.yaml, and runs `main` under config.run_stage: user errors are one
line and exit 2, Ctrl-C and SIGTERM leave the previous outputs, and every output file the
stage writes moves in together or not at all.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from .config import ConfigError, from_dict, read_params, run_stage
from .envinfo import setup_determinism
from .runtime import resolve_device

T = TypeVar("T")


@dataclass
class Stage:
    args: argparse.Namespace
    params: dict

    def section(self, cls: type[T], name: str) -> T:
        """params.yaml's section `name`, validated into dataclass `cls`."""
        if name not in self.params:
            raise ConfigError(f"{name}: section missing from {self.args.params}")
        return from_dict(cls, self.params[name], prefix=name)

    @property
    def engine(self):
        """The run engine's settings (params `engine`, the environment and --scheduler/--workers)."""
        from .sweep import engine_config  # the engine is imported only by stages that run on it

        return engine_config(self.params, self.args.scheduler, self.args.workers)

    def pin(self, device: str, threads: int, key: str) -> str:
        """The device `device` names (`key` in messages), with this process's threads and deterministic
        algorithms set as the runs set theirs (so environment records state what the runs used)."""
        resolved = resolve_device(device, key)
        setup_determinism(threads, resolved)
        return resolved


def stage(main: Callable[[Stage], None], doc: Optional[str], engine: bool = False,
          arguments: Callable[[argparse.ArgumentParser], None] = lambda ap: None) -> None:
    """Run a stage script's `main` (see the module docstring); `arguments` adds the stage's own options."""
    def run() -> None:
        ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--params", default="params.yaml", help="the params file (default params.yaml)")
        if engine:
            from .sweep import add_engine_args

            add_engine_args(ap)
        arguments(ap)
        args = ap.parse_args()
        main(Stage(args, read_params(args.params)))

    run_stage(run)
