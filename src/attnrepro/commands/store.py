"""`attnrepro store`: look after the run store.

  attnrepro store verify [--store DIR]   check every entry against its manifest (sizes and SHA-256)
  attnrepro store gc [--store DIR]       remove quarantined, damaged and half-written entries
  attnrepro store migrate [--store DIR]  re-key entries made under an older key format (trains nothing)
  attnrepro store push [--to PATH]       copy verified entries the store remote lacks to it (docs/remote.md)
  attnrepro store pull [--from PATH]     copy verified entries this store lacks from the store remote
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnrepro.config import ArgumentParser, UserError
from attnrepro.files import read_params
from attnrepro.progress import progress
from attnrepro.run.engine_settings import engine_config
from attnrepro.store import remote
from attnrepro.store.run_store import RunStore


def _store_root(arg: str | None, params: str) -> Path:
    if arg:
        return Path(arg)
    if not Path(params).exists():
        raise UserError(f"{params}: not found, and it names the run store (engine.store): run in an attnrepro "
                        "checkout, or give the store: --store DIR")
    return Path(engine_config(read_params(params)).store)


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="attnrepro store", description="Look after the run store (runs/): every finished run "
                        "under its key, each entry checked against its manifest and its key before use.")
    sub = ap.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_: str, epilog: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".", epilog=epilog)
        p.add_argument("--store", default=None, help="the run store folder (default: engine.store in params.yaml)")
        p.add_argument("--params", default="params.yaml", help="params file naming the store (default params.yaml)")
        return p

    action("verify", "check every entry against its manifest (sizes, SHA-256) and the key it is filed under",
           "exit 0 when every entry is intact, 1 when any is damaged or legacy (no manifest, or a spec.json of the "
           "old key format: never served; store migrate re-keys the latter) or a symbolic link lies anywhere under "
           "the store (each is listed and left alone; the next sweep that needs a damaged entry quarantines it and "
           "trains it again).")
    gc = action("gc", "remove quarantined, damaged and half-written entries", "only regular files and folders "
                "inside the store's real path; a symbolic link is left alone. exit 0.")
    gc.add_argument("--legacy", action="store_true",
                    help="also remove legacy entries (no manifest, or the old key format: this code serves neither)")
    action("migrate", "re-key entries made under an older key format from their recorded spec (trains nothing)",
           "after it, runs of the current numerics version come from the store instead of training again; exit 0.")
    push = action("push", "copy verified entries the store remote lacks to it (docs/remote.md)",
                  "byte for byte; entries already there are skipped; exit 1 when a damaged entry or a symbolic link "
                  "was left behind.")
    push.add_argument("--to", default=None, metavar="PATH", help="the store remote (default: "
                      "$ATTNREPRO_STORE_REMOTE, else runs/ in the DVC default remote's folder)")
    pull = action("pull", "copy verified entries this store lacks from the store remote",
                  "byte for byte; exit 1 when a damaged entry was left behind.")
    pull.add_argument("--from", dest="from_", default=None, metavar="PATH", help="the store remote (same default)")
    return ap


def store_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
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
        from attnrepro.run.store_migrate import migrate  # torch: imported only by the action that needs it

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
    for key, reason in report.legacy:
        print(f"legacy: {key}: {reason}")
    for link in report.links:
        print(f"symbolic link, left alone: {root / link}")
    print(report.line())
    return 0 if report.ok else 1


def _push_pull(args, root: Path) -> int:
    where = args.to if args.action == "push" else args.from_
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
    for link in result.links:
        print(f"symbolic link, not followed: {link}")
    print(result.line("pushed" if args.action == "push" else "pulled", other))
    return 1 if result.damaged or result.links else 0
