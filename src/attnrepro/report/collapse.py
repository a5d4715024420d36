"""How often the scaled large model's attention collapses, per perturbation (issue 63, item 6), beside the
chapter's claim that with the scaling it stays steady.

The rule, declared before counting: a seed has collapsed when its layer-0 attention entropy at the end of
training (`entropy_final`, normalised: 1 is uniform, 0 one-hot) is below COLLAPSED_BELOW = 0.1. The chapter's
collapse is the attention going one-hot, its entropy near 0; 0.1 is the line this report already draws for a
saturated attention (the QK-norm section: "below 0.1 on every seed"), far from both the steady level the
chapter prints for the scaled model and the collapsed unscaled one, so one rule serves both sections.

Counted from committed per-seed values only: the seeds stage's runs (metrics/dist/train.json), another CPU's
runs of the same model at the same seeds (the critical stage's, crossing.other_machine_runs), and the
sensitivity sweep's choices on that model, whose summaries (n, mean and sd of the log entropy at step 1480,
its last diagnostic step; no final value is kept there) bound every seed's value from below (Samuelson: no
value lies more than sd (n - 1) / sqrt(n) from the mean), which settles the count when the bound clears the
rule. Each count has its exact (Clopper-Pearson) 95% interval (stats.share_interval). The gate matrix's
reruns at several seeds keep only each case's mean (benchmarks/results/gate_power.json): named as missing,
with their mean factor; so is a perturbation no committed run holds (WANTED).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from attnrepro.formatting import md_table
from attnrepro.report.crossing import kind_text, machine_kind, other_machine_runs
from attnrepro.stats import share_interval

COLLAPSED_BELOW = 0.1  # final layer-0 entropy: the QK-norm section's line for a saturated attention (above)
STATISTIC = "entropy_final"
SENSITIVITY_STATISTIC = "entropy_step1480"  # what metrics/sensitivity.json keeps of the late entropy
# perturbations the issue names that no committed run holds, and what would produce them
WANTED = (("the token embedding's initial std halved (0.02 to 0.01)",
           "a sensitivity arm on the embedding's initial scale at the seeds stage's seeds (training: not run)"),)


def collapsed(values: Sequence[float], below: float = COLLAPSED_BELOW) -> int:
    """How many of `values` fall below the line."""
    return sum(v < below for v in values)


def lowest_possible(center: float, sd: float, n: int, log: bool) -> float:
    """The smallest value any of n values with this mean and sample sd (n - 1 denominator; of the logs when
    `log`) can take: mean - sd (n - 1) / sqrt(n) (Samuelson's inequality)."""
    low = center - sd * (n - 1) / math.sqrt(n)
    return math.exp(low) if log else low


def row(perturbation: str, machine: str, n: int, k: Optional[int], source: str, note: str = "") -> dict:
    """One line of the table; k None: the count is not known from committed values."""
    lo_hi = share_interval(k, n) if k is not None and n else None
    return {"perturbation": perturbation, "machine": machine, "n": n, "k": k, "interval": lo_hi,
            "source": source, "note": note}


def sensitivity_rows(sens: Mapping, variant: str, machine: str) -> list[dict]:
    """One row per sensitivity choice on `variant`: 0 collapsed where the summary's lower bound clears the rule,
    unknown otherwise."""
    cell = (sens.get(variant) or {}).get(SENSITIVITY_STATISTIC) or {}
    out = []
    for choice, s in sorted(cell.items()):
        if choice == "baseline" or not {"center", "sd", "n"} <= set(s):
            continue
        low = lowest_possible(s["center"], s["sd"], int(s["n"]), bool(s.get("log")))
        out.append(row(f"sensitivity: {choice}", machine, int(s["n"]), 0 if low >= COLLAPSED_BELOW else None,
                       "metrics/sensitivity.json",
                       f"{SENSITIVITY_STATISTIC}: every seed at least {low:.3g} (from the summary)"))
    return out


def gate_means(gate: Mapping, variant: str) -> list[str]:
    """The gate matrix's cases rerun at several seeds: '<case> ×<mean factor> (<n> seeds)' of the final entropy."""
    out = []
    for r in gate.get("results", []):
        for e in (r.get("decide") or {}).get("endpoints", []):
            several = (e.get("seeds") or 0) > 1 and e.get("shift") is not None
            if e.get("metric") == f"train.{variant}.{STATISTIC}" and several:
                out.append(f"{r['case']} ×{math.exp(e['shift']):.2g} ({e['seeds']} seeds)")
    return out


def markdown(rows: Sequence[Mapping], variant: str, steady_claim: str = "", gate: Sequence[str] = ()) -> str:
    """The table, its rule and what is missing."""
    if not rows:
        return ""
    claim = steady_claim or "with the scaling the attention stays steady"
    md = [f"**How often the scaled model's attention collapses.** The chapter: {claim}. Counted per perturbation "
          f"over committed runs of `{variant}`: a seed has collapsed when its final layer-0 entropy is below "
          f"{COLLAPSED_BELOW} (declared before counting: the line the QK-norm section draws for a saturated "
          "attention, the chapter's collapse being entropy near 0); exact (Clopper-Pearson) 95% intervals.\n"]
    md += md_table(["perturbation", "machine", "collapsed / seeds", "share [95% CI]", "source", "note"],
                   [[r["perturbation"], r["machine"], f"{'?' if r['k'] is None else r['k']} / {r['n']}",
                     "—" if r["interval"] is None else
                     f"{r['k'] / r['n']:.2f} [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]",
                     r["source"], r["note"]] for r in rows])
    missing = []
    if gate:
        missing.append("the gate matrix's reruns at several seeds keep only each case's mean, not its seeds "
                       "(benchmarks/results/gate_power.json; the final entropy's mean factor: " + ", ".join(gate)
                       + "): `benchmarks/gate_power.py --decide` would have to record each seed's value (the reruns "
                       "cost CPU-hours each)")
    missing += [f"{what}: no committed run; {how}" for what, how in WANTED]
    md += ["", "Not counted: " + "; ".join(missing) + ".", ""]
    return "\n".join(md) + "\n"


def committed_rows(train_dist: Mapping, envs: Mapping[str, Mapping], other_runs: Mapping[int, Mapping],
                   sens: Mapping, variant: str) -> list[dict]:
    """The counts committed data allow: the seeds stage's runs, the same seeds on the critical stage's machine
    where it is another kind (`other_runs`: crossing.other_machine_runs), the sensitivity choices."""
    rows = []
    if "seeds" in envs:
        runs = (train_dist.get("runs") or {}).values()
        base = [r[variant][STATISTIC] for r in runs if STATISTIC in r.get(variant, {})]
        if base:
            rows.append(row("none: the protocol as written", kind_text(envs["seeds"]), len(base), collapsed(base),
                            "metrics/dist/train.json (the seeds stage)"))
    if "critical" in envs and "seeds" in envs and machine_kind(envs["critical"]) != machine_kind(envs["seeds"]):
        other = [r[variant][STATISTIC] for r in other_runs.values() if STATISTIC in r.get(variant, {})]
        if other:
            rows.append(row("another CPU (float order), the same seeds", kind_text(envs["critical"]), len(other),
                            collapsed(other), "plots/critical/per_seed.csv, qk_per_seed.csv"))
    if "sensitivity" in envs:
        rows += sensitivity_rows(sens, variant, kind_text(envs["sensitivity"]))
    return rows


def section(envs: Mapping[str, Mapping], train_dist: Mapping, train_metrics: Mapping, sens: Mapping, gate: Mapping,
            plots_dir, pairs: Mapping[int, Mapping[bool, str]], claims=()) -> str:
    """The train section's collapse table for the scaled variant of the largest d_head, beside the chapter's
    claim `train.<variant>_steady` where claims.yaml has it."""
    if not pairs or True not in pairs[max(pairs)]:
        return ""
    variant = pairs[max(pairs)][True]
    try:
        other = other_machine_runs(envs, "critical", train_metrics, plots_dir, pairs)[0] if "critical" in envs else {}
    except ValueError:  # the critical and train stages disagree on one run: crossing's section says so
        other = {}
    steady = next((c for c in claims if c.id == f"train.{variant}_steady"), None)
    claim = f"{steady.text.split(':', 1)[0]} (`{steady.id}`)" if steady else ""
    return markdown(committed_rows(train_dist, envs, other, sens, variant), variant, claim, gate_means(gate, variant))
