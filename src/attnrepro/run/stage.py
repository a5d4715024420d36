"""One way to run a DVC stage script, so that each script is its inputs, one library call and its outputs.

    from attnrepro.run.stage import Stage, stage

    def main(st: Stage) -> None:
        cfg = st.section(FailuresConfig, "failures")
        device = st.pin(cfg.device, cfg.threads, "failures.device")
        result = failures.run(cfg, device, st.engine)
        write_json("metrics/failures.json", result.metrics)

    if __name__ == "__main__":
        stage(main, __doc__, engine=True)

`stage` parses the arguments (--params, and --scheduler/--workers for a stage on the run
engine), reads params.yaml, and runs `main` under `run_stage`: user errors are one
line and exit 2, Ctrl-C and SIGTERM leave the previous outputs, and every output file the
stage writes moves in together or not at all.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar

from attnrepro.config import ConfigError, UserError, from_dict
from attnrepro.envinfo import resolve_device, setup_determinism
from attnrepro.files import dvc_entry, dvc_stages, read_params
from attnrepro.run.engine_settings import add_engine_args, engine_config
from attnrepro.staging import OutputError, check_writable, os_error_line, stage_outputs
from attnrepro.store.run_store import RunStore

T = TypeVar("T")

# the stages that train hours of runs from an empty run store: scripts/reproduce.sh leaves them out
# unless asked (--sweeps), `attnrepro keep` never advises them lightly
SWEEPS = ("seeds", "critical", "qknorm", "choices", "sensitivity")


def is_sweep(stage: str) -> bool:
    """A sweep's stage, a foreach copy (choices@<arm>) included."""
    return stage.split("@")[0] in SWEEPS


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
        """The run engine's settings (params `engine`, the environment and --scheduler, --workers, --store,
        --store-only)."""
        a = self.args
        return engine_config(self.params, a.scheduler, a.workers, a.store, a.store_only)

    def pin(self, device: str, threads: int, key: str, timing: bool = False) -> str:
        """The device `device` names (`key` in messages), with this process's threads and deterministic
        algorithms set as the runs set theirs (so environment records state what the runs used); `timing`
        for a stage that times (envinfo.setup_determinism: no NaN fill inside the timed calls)."""
        resolved = resolve_device(device, key)
        setup_determinism(threads, resolved, timing)
        return resolved


def stage(main: Callable[[Stage], None], doc: Optional[str], engine: bool = False,
          arguments: Callable[[argparse.ArgumentParser], None] = lambda ap: None,
          figures: Optional[Callable[[Stage], None]] = None) -> None:
    """Run a stage script's `main` (see the module docstring); `arguments` adds the stage's own options.
    A sweep whose figures are drawn from its written tables passes `figures` (what main calls), and
    gets --figures-only: a change to figure code redraws its PNGs without the runs."""
    def run() -> None:
        ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--params", default="params.yaml", help="the params file (default params.yaml)")
        if engine:
            add_engine_args(ap)
        if figures is not None:
            ap.add_argument("--figures-only", action="store_true",
                            help="draw the stage's figures again from its tables and metrics as they are "
                                 "(trains and writes nothing else)")
        arguments(ap)
        args = ap.parse_args()
        params = read_params(args.params)
        preflight(sys.argv, engine_config(params, store=args.store).store if engine else None)
        (figures if getattr(args, "figures_only", False) else main)(Stage(args, params))

    run_stage(run)


def stage_order(stages: dict) -> list[str]:
    """A topological order of `stages` (dvc.yaml's mapping): a stage comes after every stage that
    writes one of its deps (the dep is that output or lies under it)."""
    outs = {name: [dvc_entry(o)[0].rstrip("/") for o in st.get("outs", [])] for name, st in stages.items()}
    needs = {name: {other for other in stages if other != name
                    for dep in (dvc_entry(d)[0].rstrip("/") for d in st.get("deps", [])) for out in outs[other]
                    if dep == out or dep.startswith(out + "/")}
             for name, st in stages.items()}
    done: list[str] = []
    while len(done) < len(stages):
        ready = [name for name in stages if name not in done and needs[name] <= set(done)]
        if not ready:
            raise UserError(f"dvc.yaml's stages depend on each other in a cycle: {sorted(set(stages) - set(done))}")
        done.append(ready[0])
    return done


def declared_outputs(argv: list[str], root: Path = Path(".")) -> list[Path]:
    """The outs, metrics and plots dvc.yaml declares for the stage whose command runs `argv` (the script
    and its arguments; [] where there is no dvc.yaml or no such stage: a script run on its own)."""
    script = Path(argv[0]).as_posix()
    for st in dvc_stages(root, required=False).values():
        words = str(st.get("cmd", "")).split() if isinstance(st, dict) else []
        at = words.index(script) if script in words else None
        if at is not None and all(w in argv[1:] for w in words[at + 1:]):
            return [Path(dvc_entry(e)[0]) for k in ("outs", "metrics", "plots") for e in st.get(k) or []]
    return []


def preflight(argv: list[str], store: Optional[str]) -> None:
    """Before any work: every output dvc.yaml declares for this stage can be written, and (for a stage
    on the run engine) the run store is a folder that can hold results. One line each (exit 2)."""
    check_writable([(None, out) for out in declared_outputs(argv)])
    if store is not None:
        RunStore.check_writable(store)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that a stage ends as on Ctrl-C (nothing written)."""


def _terminate(signum, frame):
    raise Terminated()


def run_stage(main) -> None:
    """Run a stage entry point: its outputs replace the old ones all together or not at all
    (staging.stage_outputs); user errors become one line on stderr and exit 2; Ctrl-C exits 130 and
    SIGTERM 143, each with one line and the previous outputs unchanged.

    Before the outputs move in, every folder they go to is checked (check_writable), so a
    read-only metrics/ stops the stage with nothing moved. An OSError naming a file (a folder
    that cannot be written, a full disk, an input that cannot be read) is one line too:
    "error: cannot write <path>: <reason>" (or "cannot read"), exit 2."""
    signal.signal(signal.SIGTERM, _terminate)
    tx = None
    try:
        with stage_outputs() as tx:
            main()
            check_writable(tx.moves)
    except (UserError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, Terminated) as e:
        word = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
        if tx is not None and tx.committed:  # the signal came while the outputs moved in (it was held)
            print(f"{word} after the outputs were written (they are complete)", file=sys.stderr)
        else:
            print(f"{word}; nothing written (the previous outputs are unchanged)", file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 143)
    except OSError as e:
        line = os_error_line(e, tx.moves if tx is not None else [])
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
