"""`attnrepro tiny STAGE`: try one stage in seconds, on a tiny profile, away from the reference.

Every stage script takes `--params FILE` and writes its outputs relative to the folder it runs in.
So a tiny try is: a scratch folder (default: a new temporary one) holding params.yaml with the
stage's tiny overrides (`TINY` below) applied, links to the stage's input files (its non-code deps
in dvc.yaml, read only), then `python <repo>/stages/<stage>.py --params params.yaml` run there.
The repository's metrics/, plots/, data/, dvc.lock and run store are never written; the scratch
folder keeps the outputs (and its own run store) for you to look at.

The same overrides inside DVC, as an experiment that leaves the workspace alone:
`attnrepro tiny STAGE --print` prints `dvc exp run --temp STAGE -S ... ` (the stage and the stages
upstream of it that are stale, never the sweeps downstream).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from attnrepro.config import ArgumentParser, UserError
from attnrepro.files import dvc_entry, dvc_stages, read_params

# stage -> params overrides (dotted key -> value), each checked against params.yaml's keys. Stages
# not listed are already seconds-cheap (precision, kv_cache, latency run as they are) or need what a
# scratch folder cannot give (corpus: a download; report: every stage's outputs; use dvc for them).
TINY: dict[str, dict[str, object]] = {
    "reversal": {"reversal.steps": 20, "reversal.eval_every": 10, "reversal.n_train": 256, "reversal.n_val": 64,
                 "reversal.n_test": 64},
    "charlm": {"charlm.steps": 20, "charlm.eval_every": 10, "charlm.eval_batches": 2, "charlm.repeat": 5,
               "charlm.gen_tokens": 10},
    "failures": {"failures.steps": 10, "failures.spread_seeds": [1], "failures.loss_window": 5,
                 "failures.val_batches": 2},
    "init_sweep": {"init_sweep.d_heads": [32, 64], "init_sweep.n_batches": 10},
    "precision": {},
    "kv_cache": {},
    "latency": {},
}
RUN_ENGINE = {"engine.workers": 1, "engine.scheduler": "", "engine.store": "runs"}  # serial, a scratch store


def _set(params: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = params
    for i, key in enumerate(parents):
        if not isinstance(node.get(key), dict):
            raise UserError(f"tiny profile: {dotted}: params.yaml has no section {'.'.join(parents[:i + 1])}")
        node = node[key]
    if last not in node:
        raise UserError(f"tiny profile: {dotted}: params.yaml has no such key")
    node[last] = value


def tiny_params(root: Path, stage: str) -> dict:
    params = read_params(root / "params.yaml")
    for key, value in {**TINY[stage], **RUN_ENGINE}.items():
        _set(params, key, value)
    return params


def _inputs(root: Path, stage: str) -> list[str]:
    """The stage's deps in dvc.yaml that are data (not code): what the scratch folder links to."""
    deps = [dvc_entry(d)[0] for d in (dvc_stages(root).get(stage) or {}).get("deps") or []]
    return [d for d in deps if not d.endswith(".py")]


def dvc_command(stage: str) -> str:
    sets = " ".join(f"-S {shlex.quote(f'{k}={json.dumps(v)}')}"
                    for k, v in TINY[stage].items())
    return f"dvc exp run --temp {stage} {sets}".rstrip()


def prepare(root: Path, stage: str, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "params.yaml").write_text(yaml.safe_dump(tiny_params(root, stage), allow_unicode=True, sort_keys=False),
                                       encoding="utf-8")
    for dep in _inputs(root, stage):
        src, dst = root / dep, where / dep
        if not src.exists():
            raise UserError(f"tiny {stage}: its input {dep} is missing here (dvc pull, or dvc repro the stage "
                            "that makes it)")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists() and not dst.is_symlink():
            os.symlink(src.resolve(), dst)
    return where


def tiny_main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="attnrepro tiny",
                        description="Run one stage on its tiny profile in a scratch folder (seconds; the "
                                    "repository's outputs, dvc.lock and run store are not touched), or print the "
                                    "same overrides as a `dvc exp run --temp` command.",
                        epilog="stages with a profile: " + ", ".join(TINY))
    ap.add_argument("stage", choices=sorted(TINY), metavar="STAGE", help="one of: " + ", ".join(TINY))
    ap.add_argument("--dir", default=None, help="the scratch folder (default: a new temporary folder)")
    ap.add_argument("--root", default=".", help="repository root (default: current directory)")
    ap.add_argument("--print", dest="print_only", action="store_true",
                    help="only print the overrides as a `dvc exp run --temp` command")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    if not (root / "dvc.yaml").is_file() or not (root / "stages" / f"{args.stage}.py").is_file():
        raise UserError(f"{root}: not the repository root (no dvc.yaml or stages/{args.stage}.py; pass --root)")
    if args.print_only:
        print(dvc_command(args.stage))
        return 0
    where = Path(args.dir).resolve() if args.dir else Path(tempfile.mkdtemp(prefix=f"attnrepro-tiny-{args.stage}-"))
    if where == root:
        raise UserError(f"{where}: the scratch folder must not be the repository")
    prepare(root, args.stage, where)
    overrides = ", ".join(f"{k}={v}" for k, v in TINY[args.stage].items()) or "none (already seconds)"
    print(f"tiny {args.stage}: {overrides}; in {where}", flush=True)
    rc = subprocess.run([sys.executable, str(root / "stages" / f"{args.stage}.py"), "--params", "params.yaml"],
                        cwd=where).returncode
    print(f"tiny {args.stage}: exit {rc}; outputs in {where} (metrics/, plots/, data/)")
    return rc
