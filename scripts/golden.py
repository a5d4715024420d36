"""Write the golden outputs (tests/golden/), or measure the tolerance they are compared with.

  python scripts/golden.py              run every case (one thread) and write tests/golden/<case>.json,
                                        and the fingerprint (attnrepro.provenance.fingerprint) to fingerprint.json
  python scripts/golden.py CASE ...     only these cases (fingerprint: the fingerprint)
  python scripts/golden.py --measure    run every case with one and with two threads and print the
                                        largest relative difference (the float-order noise
                                        attnrepro.run.golden.RTOL is set from), writing nothing

Regenerate only after bumping attnrepro.run.execute.NUMERICS for each task whose numbers moved:
the store keys runs by those versions, and a stale version would serve old results.
"""

from __future__ import annotations

import argparse
import sys

from attnrepro.provenance import fingerprint
from attnrepro.run import golden


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--measure", action="store_true", help="measure threads 1 vs 2; write nothing")
    args = ap.parse_args()
    cases = golden.cases()
    unknown = sorted(set(args.cases) - set(cases) - {fingerprint.NAME})
    if unknown:
        print(f"error: unknown case {unknown[0]!r} (cases: {', '.join(cases)})", file=sys.stderr)
        return 2
    for name in args.cases or [*cases, fingerprint.NAME]:
        if name == fingerprint.NAME:
            if not args.measure:
                golden.write(name, fingerprint.compute())
                print(f"{name}: wrote {golden.path(name)}")
            continue
        one = golden.run_case(cases[name], threads=1)
        if args.measure:
            worst, where = golden.largest_difference(one, golden.run_case(cases[name], threads=2))
            print(f"{name}: threads 1 vs 2: largest relative difference {worst:.3g} ({where or 'none'})")
        else:
            golden.write(name, one)
            print(f"{name}: wrote {golden.path(name)} (numerics {one['numerics']}, status {one['status']['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
