"""The report's "Gate power" section: how large a change `attnrepro check` catches."""

from __future__ import annotations

import math

from attnrepro.judge.check import detectable_shifts


def power_markdown(dists: dict, exp, float_order: dict) -> str:
    """How large a change the check catches (check.detectable_shifts): the headline metrics one by one,
    the other banded metrics summarised per stage."""
    rows = detectable_shifts(dists, exp.headline, float_order, exp.is_timing)
    if not rows:
        return "No seed distributions yet (metrics/dist/).\n\n"

    def units(r, k):
        x = r[k] * r["sd"]
        return f"×{math.exp(x):.3g}" if r["log"] else f"±{x:.3g}"

    out = ["The smallest shift of a metric's expected value that `attnrepro check` fails at least half the time, "
           "in reference seed sd and in the metric's units (×: a factor, for metrics judged on the log scale): a "
           "one-seed rerun against the prediction interval (metrics on their float-order tolerance, where the same "
           "seed drifts at most 0.01 sd between float orders: 0.1 sd), a five-seed rerun at other seeds by "
           "Welch's test of its mean, and at the reference's first five seeds by the test the check picks there: "
           "paired by seed where the metric's drift between float orders (docs/float_order.json, measured on one "
           "seed: a rough estimate) makes it the stronger, else Welch's; each at the first step of Holm's "
           "correction within its family (check.detectable_shifts). "
           f"{sum(r['float_order'] for r in rows)} of {len(rows)} metrics on their float-order tolerance, "
           f"{sum(r['paired'] for r in rows)} paired at the reference's seeds.\n",
           "| headline metric | seeds | 1-seed rerun: sd | units | 5 other seeds: sd | units | 5 reference seeds: sd "
           "| units |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r["headline"]):
        out.append(f"| {r['metric']} | {r['n']} | {r['one_seed_sd']:.2f} | {units(r, 'one_seed_sd')} | "
                   f"{r['five_seeds_sd']:.2f} | {units(r, 'five_seeds_sd')} | "
                   f"{r['five_reference_seeds_sd']:.2f}{' (paired)' if r['paired'] else ''} | "
                   f"{units(r, 'five_reference_seeds_sd')} |")
    out += ["", "| other banded metrics | count | 1-seed rerun: median sd (range) | 5 other seeds: median sd (range) "
            "| 5 reference seeds: median sd (range) |",
            "| --- | --- | --- | --- | --- |"]
    by_file: dict[str, list[dict]] = {}
    for r in (r for r in rows if not r["headline"]):
        by_file.setdefault(r["metric"].split(".")[0], []).append(r)

    def spread(rs, k):
        x = sorted(r[k] for r in rs)
        return f"{x[len(x) // 2]:.2f} ({x[0]:.2f}–{x[-1]:.2f})"

    for file, rs in sorted(by_file.items()):
        out.append(f"| {file} | {len(rs)} | {spread(rs, 'one_seed_sd')} | {spread(rs, 'five_seeds_sd')} | "
                   f"{spread(rs, 'five_reference_seeds_sd')}, {sum(r['paired'] for r in rs)} paired |")
    return "\n".join(out) + "\n\n"
