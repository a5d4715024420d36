"""`attnrepro staging --finish | --discard`: resolve the journal left by a stage killed while moving
its outputs in (attnrepro.staging)."""

from __future__ import annotations

from attnrepro.config import ArgumentParser
from attnrepro.staging import STAGING, resolve


def staging_main(argv: list[str]) -> int:
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
