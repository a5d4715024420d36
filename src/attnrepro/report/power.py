"""The report appendix's "Verdict power" section: how large a shift of each primary endpoint the check can see."""

from __future__ import annotations

from attnrepro.formatting import md_table
from attnrepro.judge.endpoints import power_rows
from attnrepro.stats import ALPHA, LOOKS


def power_markdown(dists: dict, exp) -> str:
    """Per primary endpoint, the smallest true shift called DIFFERENT with 80% power at 1, 3, 5 and 10
    rerun seeds (judge.endpoints.power_rows), in its unit and in reference seed sd, and the simulated probability
    that a faithful rerun of that many seeds is called SAME."""
    rows = power_rows(exp.primary, dists)
    if not rows:
        return "No primary endpoints with seeds yet (claims.yaml `primary:`, metrics/dist/).\n\n"

    def cell(r, n):
        x = r[f"shift_{n}"]
        return f"{'×' if r['log'] else '±'}{x:.3g} ({r[f'shift_sd_{n}']:.1f} sd)"

    out = [f"The smallest true shift of each primary endpoint that `attnrepro check` calls DIFFERENT with 80% power, "
           f"for a rerun of 1, 3, 5 or 10 seeds against the reference's seeds (one look, alpha {ALPHA} over the "
           f"{len(exp.primary)} endpoints: Holm's first step; docs/VERDICT.md), in the endpoint's unit (×: a factor, "
           "log scale) and in reference seed sd. A shift is seen only once it passes its margin by the error of "
           "both means. The last column is the other side, from simulation (judge.endpoints.same_probability: "
           "reruns drawn from the normal the reference's seeds fit, their endpoints' covariance kept, judged as a look "
           "of `--decide` judges them): the probability that a faithful rerun of 1, 3, 5 or 10 seeds is called SAME.\n"]
    header = ["endpoint", "margin (sd)", "reference seeds", *(f"{n} seed{'s' * (n > 1)}" for n in LOOKS),
              "P(SAME), faithful, " + "/".join(map(str, LOOKS)) + " seeds"]
    out += md_table(header, [[r["metric"], f"{r['margin']} ({r['margin_sd']:.2g})", r["n_ref"],
                              *(cell(r, n) for n in LOOKS), " / ".join(f"{r['same'][n]:.2f}" for n in LOOKS)]
                             for r in rows])
    return "\n".join(out) + "\n\n"
