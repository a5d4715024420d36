"""attnrepro: the sqrt(d_k) chapter of a textbook as a reproducible pipeline, and the tools around it.

Run the pipeline with DVC (`dvc repro`, or `bash scripts/reproduce.sh`); then `attnrepro check`
says whether this run reproduces the committed reference, and `attnrepro keep` makes it the new
one. `attnrepro audit` runs the chapter's battery on your own attention function. Each command's
--help says more; exit status 2 is always a problem of usage or input, said in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from attnrepro import __version__
from attnrepro.config import ArgumentParser, UserError


# Subcommands with parsers of their own: name -> (function, help). Each is imported only when it
# runs (a plain import inside the function: --version and --help never import torch). The function
# receives the remaining argv and returns an exit code. Adding one is one function and one line here.
def _kv(argv):
    from attnrepro.commands import kv_calculator
    return kv_calculator.main(argv)


def _audit(argv):
    from attnrepro.commands import audit
    return audit.main(argv)


def _store(argv):
    from attnrepro.commands import store
    return store.store_main(argv)


def _keep(argv):
    from attnrepro.commands import keep_restore
    return keep_restore.keep_main(argv)


def _restore(argv):
    from attnrepro.commands import keep_restore
    return keep_restore.restore_main(argv)


def _tiny(argv):
    from attnrepro.commands import tiny
    return tiny.tiny_main(argv)


def _exp(argv):
    from attnrepro.commands import exp_view
    return exp_view.main(argv)


def _staging(argv):
    from attnrepro.commands import staging_journal
    return staging_journal.staging_main(argv)


COMMANDS = {
    "exp": (_exp, "the headline of the workspace, HEAD and each DVC experiment, one row each (80 columns)"),
    "kv": (_kv, "KV-cache / attention-matrix memory calculator (eq. 1.20-1.21)"),
    "audit": (_audit, "run the chapter's battery against your attention implementation"),
    "store": (_store, "verify the run store (sizes, SHA-256), clean it (gc), re-key it (migrate), share it (push, pull)"),
    "keep": (_keep, "make this run the new reference: regenerate the README, `git add` the outputs and dvc.lock (no commit)"),
    "tiny": (_tiny, "try one stage in seconds on a tiny profile, in a scratch folder (the reference untouched)"),
    "restore": (_restore, "put the committed reference back: git checkout of the outputs and dvc.lock, then dvc checkout"),
    "staging": (_staging, "finish or discard the move of a stage killed while putting its outputs in place"),
}

EPILOG = """\
exit status: 0 PASS: the run reproduces the reference exactly, or (judged statistically)
nothing in it is shown to differ; 1 FAIL (a primary endpoint DIFFERENT, an output or param
edited after the run, a metric missing or drifted, a conclusion or checksum that fails: each
is listed); 2 bad usage or input.

Two questions: on the reference's kind of machine with its params every metric must be
identical; everywhere, the primary endpoints of the reference's claims.yaml are judged
SAME / DIFFERENT / INCONCLUSIVE against the reference's seeds within their equivalence
margins (Holm, alpha 0.05): SAME shown inside its margin; DIFFERENT shown beyond it (a
problem); INCONCLUSIVE neither, not a failure (--decide reruns seeds to decide it). The
rules: docs/VERDICT.md.
"""


def _check_parser(sub) -> None:
    p = sub.add_parser("check", help="does this run reproduce the committed reference? (verdict first)",
                       description="Compare this run (metrics/) with the reference committed at a git revision "
                                   "(default HEAD) and evaluate claims.yaml. The first line is the verdict; about a minute "
                                   "on two cores (--decide: minutes to hours).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--rev", default="HEAD", help="git revision holding the reference run (default HEAD)")
    ref.add_argument("--base", metavar="REF", help="the reference is the merge base of HEAD and REF (a pull "
                                                   "request against its base branch, e.g. origin/main)")
    p.add_argument("--made-on", metavar="MACHINE", help="the run's outputs were made on another machine than this "
                   "one: say which (printed in the verdict); without it a run whose env records describe another "
                   "machine is refused")
    p.add_argument("--root", default=".", help="repository root (default: current directory)")
    p.add_argument("--claims", default="claims.yaml", help="claims file, read from the reference revision "
                                                           "(default claims.yaml)")
    p.add_argument("--mode", choices=("auto", "exact", "statistical"), default="auto",
                   help="auto (default): exact on the reference's machine with its params, else statistical")
    p.add_argument("--all", action="store_true", help="list every metric and claim, timings included")
    p.add_argument("--decide", nargs="?", type=int, const=10, metavar="MAX_SEEDS",
                   help="rerun the primary endpoints' runs at the reference's first 1, 3, 5, 10 seeds (the run store "
                   "serves those already made) until each is SAME or DIFFERENT, at most MAX_SEEDS (default 10; "
                   "docs/VERDICT.md); minutes to hours on a CPU")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the verdict as JSON (for scripts)")
    fmt.add_argument("--md", action="store_true", help="print the verdict as a Markdown document (for CI comments)")


def _claims_parser(sub) -> None:
    p = sub.add_parser("claims", help="evaluate claims.yaml on the workspace metrics",
                       description="Evaluate every published claim against metrics/*.json and print a table; "
                                   "exit 1 when a gated claim fails or is missing.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=".", help="repository root (default: current directory)")
    p.add_argument("--metrics", default="metrics", help="metrics folder, relative to the root")
    p.add_argument("--claims", default="claims.yaml", help="claims file (default claims.yaml)")
    p.add_argument("--all", action="store_true", help="list every claim, not only gated and failing ones")


def version_line() -> str:
    """`attnrepro --version`: this package's installed version and torch's (from the installed
    distributions' metadata: nothing is imported, so it answers in milliseconds)."""
    def of(dist: str, fallback: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return fallback

    return f"attnrepro {of('attnrepro', __version__)} (torch {of('torch', 'not installed')})"


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="attnrepro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=version_line())
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    _check_parser(sub)
    _claims_parser(sub)
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return ap


def _run_check(args) -> int:
    from attnrepro.judge.check import as_json, render, render_md, run_check
    from attnrepro.files import read_params
    from attnrepro.report.headline_metrics import headline_of
    from attnrepro.run.engine_settings import engine_config

    if args.decide is not None and args.decide < 1:
        raise UserError(f"--decide: got {args.decide}, expected at least 1 seed")
    engine = engine_config(read_params(Path(args.root) / "params.yaml")) if args.decide else None
    with _progress_to_stderr():
        outcome = run_check(rev=args.rev, root=args.root, claims_path=args.claims, mode=args.mode,
                            made_on=args.made_on, base=args.base, decide_with=engine, max_seeds=args.decide,
                            headline_of=headline_of)
    if args.json:
        sys.stdout.write(json.dumps(as_json(outcome), indent=1, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write((render_md if args.md else render)(outcome, show_all=args.all))
    return 0 if outcome.ok else 1


@contextlib.contextmanager
def _progress_to_stderr():
    """What the check prints while it works (--decide's sweeps and their workers, remade sweeps) goes to
    stderr, at the file descriptor too (worker processes write to it): stdout holds the verdict alone, which
    scripts parse (--json)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _run_claims(args) -> int:
    from attnrepro.judge.claims import (counts, evaluate_all, kind, load, load_json_dir, load_metrics_dir,
                                        tally_lines)
    from attnrepro.report.claims_tables import claims_table

    root = Path(args.root)
    if not (root / args.metrics).is_dir():
        raise UserError(f"{root / args.metrics}: no metrics folder here (run the pipeline first: dvc repro)")
    results = evaluate_all(load(root / args.claims), load_metrics_dir(root / args.metrics),
                           load_json_dir(root / args.metrics / "dist"), load_json_dir(root / args.metrics / "env"))
    sys.stdout.write(claims_table(results, args.all))
    sys.stdout.write("\n" + "\n".join(tally_lines(counts(results)).values()) + "\n")
    not_reproduced = [r.claim.id for r in results if kind(r.claim) == "conclusion" and r.gated_failure]
    if not_reproduced:
        sys.stdout.write("the chapter's conclusions not reproduced on these metrics: " + ", ".join(not_reproduced)
                         + " (whether that is a change: attnrepro check)\n")
    failed = [r.claim.id for r in results if r.claim.cls == "checksum" and r.gated_failure]
    if failed:
        sys.stdout.write("checksums failing (true by construction: a bug): " + ", ".join(failed) + "\n")
    gated = [r.claim.id for r in results if r.gated_failure]
    if gated:
        sys.stdout.write(f"exit 1: {len(gated)} gated " + ("claim fails or is missing" if len(gated) == 1 else
                                                             "claims fail or are missing")
                         + " (published values outside their band are informational)\n")
    return 1 if gated else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            return int(COMMANDS[argv[0]][0](argv[1:]) or 0)
        ap = build_parser()
        args = ap.parse_args(argv)
        if args.command == "check":
            return _run_check(args)
        if args.command == "claims":
            return _run_claims(args)
        ap.print_help()
        return 2
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attnrepro ... | head`: the reader left; no traceback (Python's docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
