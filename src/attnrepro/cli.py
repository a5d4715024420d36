"""The `attnrepro` command.

  attnrepro check [--rev HEAD] [--all]   metrics vs a git revision (with tolerances) + claims;
                                         exit 1 when a gated metric drifts or a gated claim fails
  attnrepro claims [--all]               evaluate claims.yaml on the workspace metrics only
  attnrepro kv ...                       KV-cache memory calculator (attnrepro.memory), when installed
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .config import UserError

# Subcommands owned by other modules: name -> (module, function, help). The function
# receives the remaining argv and returns an exit code; the module is imported only
# when the subcommand runs. Adding one is one line here.
PLUGINS: dict[str, tuple[str, str, str]] = {
    "kv": ("attnrepro.memory", "main", "KV-cache / attention-matrix memory calculator (eq. 1.20-1.21)"),
}

EPILOG = """\
exit status: 0 ok; 1 a gated metric drifted beyond tolerance, a metric is missing,
or a gated claim failed (each is named at the end of the output); 2 bad usage or
input (one line on stderr).

Tolerances live in check.yaml (first matching glob over <file>.<key>; exact for
counts and parameter counts; `better:` for one-sided metrics; timings are reported
but not gated because they depend on the machine). Published numbers live only in
claims.yaml. GPU-only metrics and claims are "skipped" on a run without CUDA,
never "passed".
"""


def _check_parser(sub) -> None:
    p = sub.add_parser("check", help="compare workspace metrics with a git revision and evaluate the claims",
                       description="Compare metrics/*.json with the same files at a git revision "
                                   "(default HEAD) under the tolerances of check.yaml, evaluate claims.yaml, "
                                   "and print a markdown report (like `dvc metrics diff --md`, plus tolerance "
                                   "and verdict columns).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="git revision holding the reference metrics (default HEAD)")
    p.add_argument("--root", default=".", help="repository root (default: current directory)")
    p.add_argument("--metrics", default="metrics", help="metrics folder, relative to the root")
    p.add_argument("--config", default="check.yaml", help="tolerance rules (default check.yaml)")
    p.add_argument("--claims", default="claims.yaml", help="claims file (default claims.yaml)")
    p.add_argument("--no-claims", action="store_true", help="compare metrics only")
    p.add_argument("--all", action="store_true", help="list every metric and claim, not only changes/failures")


def _claims_parser(sub) -> None:
    p = sub.add_parser("claims", help="evaluate claims.yaml on the workspace metrics",
                       description="Evaluate every published claim against metrics/*.json and print a table; "
                                   "exit 1 when a gated claim fails or is missing.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=".", help="repository root (default: current directory)")
    p.add_argument("--metrics", default="metrics", help="metrics folder, relative to the root")
    p.add_argument("--claims", default="claims.yaml", help="claims file (default claims.yaml)")
    p.add_argument("--all", action="store_true", help="list every claim, not only gated and failing ones")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="attnrepro", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    _check_parser(sub)
    _claims_parser(sub)
    for name, (_, _, help_) in PLUGINS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return ap


def _run_check(args) -> int:
    from .check import render, run_check

    outcome = run_check(rev=args.rev, root=args.root, metrics_dir=args.metrics,
                        claims_path=None if args.no_claims else args.claims, config_path=args.config)
    sys.stdout.write(render(outcome, args.rev, show_all=args.all))
    return 0 if outcome.ok else 1


def _run_claims(args) -> int:
    from pathlib import Path

    from .check import claims_table
    from .claims import evaluate_all, load_claims, load_envs, load_metrics_dir, totals

    root = Path(args.root)
    results = evaluate_all(load_claims(root / args.claims), load_metrics_dir(root / args.metrics),
                           load_envs(root / args.metrics / "env"))
    t = totals(results)
    sys.stdout.write(claims_table(results, args.all))
    sys.stdout.write(f"\nclaims: {t['passed']} passed, {t['failed']} failed ({t['missing']} missing), "
                     f"{t['skipped']} skipped of {t['n']}; gated {t['gated_passed']}/{t['gated']} passed\n")
    failed = [r.claim.id for r in results if r.gated_failure]
    if failed:
        sys.stdout.write("gated claims failing: " + ", ".join(failed) + "\n")
    return 1 if failed else 0


def _run_plugin(name: str, argv: list[str]) -> int:
    module, func, _ = PLUGINS[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise UserError(f"`attnrepro {name}` needs {module}, which this checkout does not have") from None
        raise
    rc = getattr(mod, func)(argv)
    return int(rc or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in PLUGINS:
            return _run_plugin(argv[0], argv[1:])
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


if __name__ == "__main__":
    sys.exit(main())
