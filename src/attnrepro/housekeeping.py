"""`attnrepro store` and `attnrepro staging`: look after the run store and the stages' output journals.

  attnrepro store verify [--store DIR]   check every entry against its manifest (sizes and SHA-256)
  attnrepro store gc [--store DIR]       remove quarantined, damaged and half-written entries
  attnrepro store migrate [--store DIR]  re-key entries made under an older key format (trains nothing)
  attnrepro store push [--to PATH]       copy verified entries the store remote lacks to it (docs/remote.md)
  attnrepro store pull [--from PATH]     copy verified entries this store lacks from the store remote
  attnrepro staging --finish | --discard   resolve a journal left by a stage killed while moving its outputs in
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .config import ArgumentParser, UserError, read_params


def _store_root(arg: str | None, params: str) -> Path:
    if arg:
        return Path(arg)
    from .engine import engine_config

    return Path(engine_config(read_params(params) if Path(params).exists() else {}).store)


def store_main(argv: list[str]) -> int:
    from .runtime import progress
    from .store import RunStore

    ap = ArgumentParser(prog="attnrepro store",
                        description="Check every run store entry against its manifest (verify: sizes and "
                                    "SHA-256), remove quarantined, damaged and half-written entries (gc), or "
                                    "re-key entries made under an older key format from their recorded spec "
                                    "(migrate: after it, runs of the current numerics version come from the "
                                    "store instead of training again), or share it with another machine (push, "
                                    "pull: verified entries only, byte for byte; entries already there are "
                                    "skipped; docs/remote.md).",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="verify: exit 0 when no entry is damaged, 1 when any is (each is listed; the next "
                               "sweep that needs one quarantines it and trains it again). Entries written before "
                               "manifests are counted as legacy, not damaged. gc, migrate: exit 0. push, pull: exit 0, or 1 "
                               "when a damaged entry was left behind (each is listed).")
    ap.add_argument("action", choices=("verify", "gc", "migrate", "push", "pull"))
    ap.add_argument("--store", default=None, help="the run store folder (default: engine.store in params.yaml)")
    ap.add_argument("--params", default="params.yaml", help="params file naming the store (default params.yaml)")
    ap.add_argument("--legacy", action="store_true",
                    help="gc: also remove entries written before store manifests (only older checkouts can use them)")
    ap.add_argument("--to", default=None, metavar="PATH",
                    help="push: the store remote (default: $ATTNREPRO_STORE_REMOTE, else runs/ in the DVC default "
                         "remote's folder)")
    ap.add_argument("--from", dest="from_", default=None, metavar="PATH", help="pull: the store remote (same default)")
    args = ap.parse_args(argv)
    root = _store_root(args.store, args.params)
    if args.action in ("push", "pull"):
        return _push_pull(args, root)
    if not root.is_dir():
        raise UserError(f"{root}: no run store here (a sweep creates it; or pass --store)")
    store = RunStore(root)
    if args.action == "gc":
        c = store.gc(legacy=args.legacy)
        print(f"store gc: removed {c['quarantined']} quarantined, {c['damaged']} damaged, {c['legacy']} legacy and "
              f"{c['tmp']} half-written entries; {len(store.entries())} entries remain in {root}")
        return 0
    if args.action == "migrate":
        from .migrate import migrate

        bar = progress(len(store.entries()), "migrate", unit="run")
        result = migrate(store, lambda i, n: bar.update(1))
        bar.close()
        for key, reason in result.damaged:
            print(f"skipped: {key}: {reason}")
        print(result.line())
        return 0
    bar = progress(len(store.entries()), "verify", unit="run")
    report = store.verify(lambda i, n: bar.update(1))
    bar.close()
    for key, reason in report.damaged:
        print(f"damaged: {key}: {reason}")
    print(report.line())
    return 1 if report.damaged else 0


def _push_pull(args, root: Path) -> int:
    from . import remote
    from .runtime import progress
    from .store import RunStore

    where = args.to if args.action == "push" else args.from_
    if (args.to and args.action == "pull") or (args.from_ and args.action == "push"):
        raise UserError(f"store {args.action}: {'--to' if args.action == 'push' else '--from'} names the remote "
                        f"(not {'--from' if args.action == 'push' else '--to'})")
    other = Path(where) if where else remote.default_remote(Path("."))
    if other.resolve() == root.resolve():
        raise UserError(f"store {args.action}: {other} is this store itself")
    bar = progress(len(RunStore(root if args.action == "push" else other).entries()), f"store {args.action}",
                   unit="run")
    run = remote.push if args.action == "push" else remote.pull
    result = run(root, other, lambda i, n: bar.update(1))
    bar.close()
    for key, reason in result.damaged:
        print(f"damaged, not {'pushed' if args.action == 'push' else 'pulled'}: {key}: {reason}")
    print(result.line("pushed" if args.action == "push" else "pulled", other))
    return 1 if result.damaged else 0


def staging_main(argv: list[str]) -> int:
    from .io import STAGING, resolve

    ap = ArgumentParser(prog="attnrepro staging",
                        description="A stage killed while moving its outputs into place leaves a journal in "
                                    f"{STAGING}/. The next stage finishes that move by itself when the files it "
                                    "would replace are unchanged; when they changed (restored with git checkout, "
                                    "say), it stops and asks: decide here.")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--finish", action="store_true", help="move in what the killed stage had not moved yet; a file changed since it was killed "
                           "(moved in or not) stays as it is: rerun the stage for a consistent set")
    what.add_argument("--discard", action="store_true",
                      help="drop what it staged and keep every file as it is now (then rerun that stage)")
    args = ap.parse_args(argv)
    n, kept = resolve(finish=args.finish)
    kept_text = f" ({kept} file{'s' * (kept != 1)} changed since kept as they are)" if kept else ""
    print(f"staging: {'finished' if args.finish else 'discarded'} {n} interrupted commit{'s' * (n != 1)}{kept_text}")
    return 0
