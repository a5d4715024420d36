"""Pairs that cross machines (issue 63, item 3): the machine kind of every sweep's baseline and arms, and,
where they differ, what the crossing alone does to each headline cell.

A machine kind is what the check tells machines apart by (envinfo.RUN_MACHINE_KEYS: CPU, torch, Python,
device, threads), read from each stage's record (metrics/env/<stage>.json); a record whose runs came from
elsewhere (`runs_on`) names those kinds too. The choices arms take their baseline from the seeds stage
(metrics/dist/train.json), so their pairs cross machines when the two records differ. The crossing is then
measured on the train variants' runs made at the same seeds on the arms' kind of machine: the critical
stage's d_head arms (plots/critical/per_seed.csv; its d_qk arm at the large d_head, qk_per_seed.csv, is the
same model) and the train stage's run (metrics/train.json, every summary). Sources that share a seed must
agree exactly (one machine, one spec: the same bytes), else none is used. Per headline cell
(experiments.choices.cells): the mean same-seed difference, other machine minus baseline, with its t
interval (log scale where choices.log_cell), and the spread of the differences beside the seed sd.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

from attnrepro.envinfo import RUN_MACHINE_KEYS
from attnrepro.experiments import choices
from attnrepro.experiments.sensitivity import paired_effect
from attnrepro.formatting import md_table
from attnrepro.stats import ALPHA, Band

# sweep -> the stage whose machine record covers its baseline's runs: the choices arms read theirs from the
# seeds stage (experiments/choices.py); every other sweep trains or reads its baseline among its own runs
# (its record's `runs_on` says where they ran)
BASELINE_STAGE = {"choices": "seeds", "critical": "critical", "qknorm": "qknorm", "sensitivity": "sensitivity"}
OTHER_MACHINE_STAGES = ("critical", "train")  # the stages whose train-variant runs measure the crossing


def machine_kind(env: Mapping) -> tuple:
    """A machine record's kind: RUN_MACHINE_KEYS' values and `runs_on` (where its runs were made)."""
    return (*(env.get(k) for k in RUN_MACHINE_KEYS), env.get("runs_on", "this machine"))


def kind_text(env: Mapping) -> str:
    """A machine record's kind in words (the CPU, torch and threads; where its runs were not all made on it,
    those machines too)."""
    runs_on = env.get("runs_on", "this machine")
    return (f"{env.get('cpu')}, torch {env.get('torch')}, {env.get('torch_threads')} thread(s)"
            + ("" if runs_on == "this machine" else f"; runs from: {runs_on}"))


def sweep_machines(envs: Mapping[str, Mapping]) -> list[dict]:
    """Per sweep with machine records: its baseline's stage and machine, its arms' stages and machines, and
    whether all are one kind (never where a record's runs came from elsewhere)."""
    out = []
    for sweep, base in BASELINE_STAGE.items():
        arms = choices.record_stems(sweep, sorted(envs))
        if not arms or base not in envs:
            continue
        kinds = {machine_kind(envs[s]) for s in (base, *arms)}
        out.append({"sweep": sweep, "baseline": base, "baseline_kind": kind_text(envs[base]), "arms": arms,
                    "arm_kinds": sorted({kind_text(envs[s]) for s in arms}),
                    "one_kind": len(kinds) == 1 and envs[base].get("runs_on", "this machine") == "this machine"})
    return out


def critical_runs(per_seed: Sequence[Mapping], qk_per_seed: Sequence[Mapping],
                  pairs: Mapping[int, Mapping[bool, str]]) -> list[dict[int, dict[str, dict]]]:
    """{seed: {variant: {metric: value}}} from the critical stage's per-seed rows, one mapping per file:
    per_seed.csv's rows at each d_head of `pairs`, qk_per_seed.csv's at the largest (d_qk = d_head, its one
    variable model); a column scaled_<m> / unscaled_<m> is metric m of that d_head's scaled / unscaled
    variant."""
    def runs(rows, width: str, keep) -> dict:
        out: dict[int, dict[str, dict]] = {}
        for r in rows:
            d = int(r[width])
            if d not in keep:
                continue
            for scaled, variant in pairs[d].items():
                prefix = "scaled_" if scaled else "unscaled_"
                out.setdefault(int(r["seed"]), {})[variant] = {
                    k.removeprefix(prefix): float(v) for k, v in r.items() if k.startswith(prefix)}
        return out
    return [runs(per_seed, "d_head", set(pairs)), runs(qk_per_seed, "d_qk", {max(pairs)})]


def merge(sources: Sequence[Mapping[int, Mapping[str, Mapping]]]) -> dict[int, dict[str, dict]]:
    """One {seed: {variant: {metric: value}}} from several sources; a value two sources both hold must be
    equal (the same run), else ValueError names it."""
    out: dict[int, dict[str, dict]] = {}
    for src in sources:
        for seed, variants in src.items():
            for v, ms in variants.items():
                have = out.setdefault(seed, {}).setdefault(v, {})
                for k, x in ms.items():
                    if k in have and have[k] != x:
                        raise ValueError(f"seed {seed} {v}.{k}: {have[k]} in one source, {x} in another")
                    have[k] = x
    return out


def seed_of(run: Mapping[str, Mapping], runs: Mapping[int, Mapping[str, Mapping]]) -> Optional[int]:
    """The one seed at which `run` (one run's summaries per variant, its seed unrecorded) equals `runs` on every
    value both hold (at least one); None if no seed or several do."""
    def same(other):
        shared = [(v, k) for v in run if isinstance(run[v], Mapping) for k in run[v] if k in other.get(v, {})]
        return bool(shared) and all(run[v][k] == other[v][k] for v, k in shared)
    hits = [s for s, other in runs.items() if same(other)]
    return hits[0] if len(hits) == 1 else None


class _Partial(dict):
    """A variant's summaries where some metrics were not recorded: those read as nan."""

    def __missing__(self, key):
        return math.nan


def cell_values(runs: Mapping[int, Mapping[str, Mapping]], pairs, steps: Sequence[int]) -> dict[int, dict]:
    """Each seed's headline cells (choices.cells; nan where a variant or metric it needs was not recorded)."""
    variants = [v for p in pairs.values() for v in p.values()]
    return {s: choices.cells({v: _Partial(vs.get(v, {})) for v in variants}, pairs, steps) for s, vs in runs.items()}


def differences(other: Mapping[int, Mapping], base: Mapping[int, Mapping], alpha: float = ALPHA) -> dict[str, dict]:
    """Per cell: n same-seed pairs, the mean difference other - base (log scale where choices.log_cell) with its
    1 - alpha t interval (from 2 pairs), the sd of the differences, and the baseline's seed sd over all its seeds."""
    out = {}
    for cell in sorted({c for cs in base.values() for c in cs}, key=choices.cell_order):
        log = choices.log_cell(cell)
        ok = lambda x: math.isfinite(x) and (x > 0 or not log)
        seeds = [s for s in sorted(other) if s in base and ok(other[s].get(cell, math.nan)) and ok(base[s][cell])]
        if not seeds:
            continue
        x, y = [other[s][cell] for s in seeds], [base[s][cell] for s in seeds]
        row = {"n": len(seeds), "log": log,
               "seed_sd": Band.of([c[cell] for c in base.values() if ok(c[cell])], log=log).sd}
        if len(seeds) >= 2:
            e = paired_effect(x, y, log, alpha)
            row.update(diff=e["diff"], ci_lo=e["ci_lo"], ci_hi=e["ci_hi"], sd=e["se"] * math.sqrt(len(seeds)))
        else:
            row["diff"] = (math.log(x[0]) - math.log(y[0])) if log else x[0] - y[0]
        out[cell] = row
    return out


def _steps(dist_runs: Mapping) -> list[int]:
    """The diagnostic steps the seeds stage recorded (entropy_step<N> of any variant): train.diag_steps."""
    keys = {k for r in dist_runs.values() for ms in r.values() if isinstance(ms, dict) for k in ms}
    return sorted(int(k.removeprefix("entropy_step")) for k in keys if k.removeprefix("entropy_step").isdigit())


def _read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _diff_text(r: Mapping) -> str:
    f = (lambda x: f"×{math.exp(x):.3g}") if r["log"] else (lambda x: f"{x:+.3g}")
    return f(r["diff"]) + (f" [{f(r['ci_lo'])}, {f(r['ci_hi'])}]" if "ci_lo" in r else " (one pair: no interval)")


def other_machine_runs(envs: Mapping[str, Mapping], arm_stage: str, train_metrics: Mapping, plots_dir: Path,
                       pairs: Mapping[int, Mapping[bool, str]]) -> tuple[dict, list[str]]:
    """The train variants' runs made on `arm_stage`'s kind of machine ({seed: {variant: {metric: value}}}) and
    the sources used: the critical stage's per-seed CSVs, and the train stage's run at the seed it equals;
    none where the critical stage ran on another kind. ValueError where two sources disagree on one run."""
    kind = machine_kind(envs[arm_stage])
    same = [s for s in OTHER_MACHINE_STAGES if s in envs and machine_kind(envs[s]) == kind]
    if "critical" not in same:
        return {}, []
    runs = merge(critical_runs(_read_csv(plots_dir / "critical" / "per_seed.csv"),
                               _read_csv(plots_dir / "critical" / "qk_per_seed.csv"), pairs))
    used = [f"the critical stage's d_head arms and d_qk-{max(pairs)} point"] if runs else []
    seed = seed_of(train_metrics, runs) if "train" in same and train_metrics else None
    if seed is not None:
        runs = merge([runs, {seed: train_metrics}])
        used.append(f"the train stage's run, seed {seed}")
    return runs, used


def machines_markdown(sweeps: Sequence[Mapping]) -> list[str]:
    md = ["**Machines.** Each sweep's baseline and arms by machine kind (metrics/env/; the check's kind: CPU, "
          "torch, Python, device, threads):\n"]
    md += md_table(["sweep", "baseline's runs", "their machine", "arms' runs", "their machine", "one kind"],
                   [[s["sweep"], s["baseline"], s["baseline_kind"],
                     s["arms"][0] if len(s["arms"]) == 1 else f"{len(s['arms'])} arms ({s['sweep']}_*)",
                     "; ".join(s["arm_kinds"]), "yes" if s["one_kind"] else "**no**"] for s in sweeps])
    return md + [""]


def crossing_markdown(diffs: Mapping[str, Mapping], used: Sequence[str], machine: str) -> tuple[list[str], str]:
    """The crossing's table (for the appendix) and what it shows: a shift where a cell's interval excludes 0, else
    its spread."""
    ns = sorted({r["n"] for r in diffs.values()})
    md = [f"What the crossing alone does: the train variants' runs on {machine} at the baseline's seeds "
          f"({'; '.join(used)}; {ns[0]} to {ns[-1]} seeds a cell), each minus the baseline's run at that seed (a "
          "factor for attention statistics and scales):\n"]
    md += md_table(["cell", "same-seed pairs", "difference, other machine − baseline [95% CI]",
                    "in seed sd", "sd of the differences", "baseline seed sd"],
                   [[c, r["n"], _diff_text(r), f"{r['diff'] / r['seed_sd']:+.2f}" if r["seed_sd"] else "—",
                     f"{r['sd']:.3g}" if "sd" in r else "—", f"{r['seed_sd']:.3g}"] for c, r in diffs.items()])
    tested = {c: r for c, r in diffs.items() if "ci_lo" in r}
    shifted = [c for c, r in tested.items() if r["ci_lo"] > 0 or r["ci_hi"] < 0]
    spread = sorted(r["sd"] / r["seed_sd"] for r in tested.values() if r["seed_sd"] > 0)
    single = [c for c in diffs if c not in tested]
    return md + [""], ((f"**A shift**: the interval of {', '.join(shifted)} excludes 0, so the arms' differences there carry "
                "the crossing; redoing the arms against a baseline from their machine (hours of training) would "
                "separate the two. " if shifted else
                f"No shift shown: each of the {len(tested)} cells with two or more pairs has an interval that holds 0 "
                "(no narrower than its few pairs allow). ")
           + (f"The crossing adds spread: the same seed's differences scatter by {spread[0]:.2g} to {spread[-1]:.2g} "
              "of a seed sd. " if spread else "")
           + (f"{', '.join(single)}: one pair, no interval." if single else ""))


def markdown(envs: Mapping[str, Mapping], train_dist: Mapping, train_metrics: Mapping, plots_dir: Path,
             pairs: Mapping[int, Mapping[bool, str]]) -> tuple[str, str]:
    """The choices section's machine paragraph: which sweeps cross machine kinds, and where the choices arms' pairs
    cross, what the crossing alone does per headline cell; with the appendix's table of those differences."""
    sweeps = sweep_machines(envs)
    if not sweeps:
        return "", ""
    one = [s["sweep"] for s in sweeps if s["one_kind"]]
    md = [f"**Machines.** Baseline and arms on one machine kind: {', '.join(one) or 'none'}; crossing: "
          + (", ".join(s["sweep"] for s in sweeps if not s["one_kind"]) or "none")
          + " (each sweep's kinds: the appendix's machine records).\n"]
    cross = next((s for s in sweeps if s["sweep"] == "choices" and not s["one_kind"]), None)
    if cross is None:
        return "\n".join(md) + "\n", ""
    every = "Every pair of the choices arms crosses" if cross["baseline_kind"] not in cross["arm_kinds"] else \
        "Some pairs of the choices arms cross"
    md.append(f"{every} machines: the arms ran on {'; '.join(cross['arm_kinds'])}, "
              f"their baseline (the {cross['baseline']} stage's runs) on {cross['baseline_kind']}. A same-seed "
              "difference there is the arm's effect plus the crossing's.\n")
    base = {int(s): r for s, r in (train_dist.get("runs") or {}).items()}
    try:
        other, used = ({}, []) if len(cross["arm_kinds"]) > 1 or not pairs else other_machine_runs(
            envs, cross["arms"][0], train_metrics, plots_dir, pairs)
    except ValueError as e:
        other, used = {}, []
        md.append(f"The runs that would measure the crossing disagree where they should be one run ({e}).\n")
    steps = _steps(base)
    diffs = differences(cell_values(other, pairs, steps), cell_values(base, pairs, steps)) if other and base else {}
    if not diffs:
        md.append("No runs of the train variants at the baseline's seeds on the arms' machine: the crossing is not "
                  "measured.\n")
        return "\n".join(md) + "\n", ""
    table, shown = crossing_markdown(diffs, used, cross["arm_kinds"][0])
    md.append(f"What the crossing alone does, same seed on the two machines: {shown} (the table: the appendix).\n")
    return "\n".join(md) + "\n", "\n".join(table) + "\n"
