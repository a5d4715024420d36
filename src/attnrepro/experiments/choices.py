"""The protocol choices that may move the headline (params `choices`): how the text keeps its line
breaks and how the tokenizer treats them, and AdamW's weight decay, each an arm trained at paired seeds
with the chapter's four train variants and compared with the protocol as written at the same seeds.

Each arm is its own DVC stage (`choices@<arm>`, writing metrics/choices_<arm>.json), so an arm is kept
once it ran and a new arm trains only its own runs. The baseline is the seeds stage's runs
(metrics/dist/train.json holds each seed's summaries). At seed s every arm starts from the same init draw and batch order as
the baseline; the text arms see a different token stream, so their batches differ in content.

The headline cells of every run: the four final losses, the two gaps (unscaled - scaled), the unscaled
d_head-256 model's layer-0 entropy at step 222, its softmax Jacobian's fall in orders of magnitude
(log10 step 0 / step 1480) and its late scales (logit std, ||W_qkv||, the Jacobian at step 1480): the
steps are train.diag_steps' first after 0 and its last, the chapter's figure steps.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from attnrepro.config import ConfigError, require
from attnrepro.data import corpus
from attnrepro.envinfo import stage_environment
from attnrepro.experiments.comparison import pairs_by_dhead
from attnrepro.experiments.protocol import CORPUS, TrainConfig, model_config, optim_config
from attnrepro.experiments.sensitivity import paired_effect
from attnrepro.files import read_json
from attnrepro.formatting import md_table
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import ALPHA, Band, fieller_ratio, holm_adjusted, holm_detectable

BASELINE = "baseline"
ARM = "arm"
PREFIX = "choices_"  # metrics/choices_<arm>.json, metrics/env/choices_<arm>.json: one per arm's stage
DIST = Path("metrics/dist/train.json")
ARM_KEYS = ("newline", "optim")
LATE = ("trained_logit_std_l0", "trained_w_qkv_fro_l0", "jacobian_fro_step")  # of the unscaled large model


@dataclass
class ChoicesConfig:
    seeds: list[int]  # paired with the seeds stage's runs: a subset of seeds.seeds
    arms: dict[str, dict]  # name -> {newline: <corpus.NEWLINE_RULES>} and/or {optim: {OptimConfig fields}}

    def validate(self, prefix: str = "choices") -> None:
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds")
        require(bool(self.arms) and BASELINE not in self.arms, f"{prefix}.arms", sorted(self.arms),
                f"at least one arm, none named '{BASELINE}'")
        for name, arm in self.arms.items():
            where = f"{prefix}.arms.{name}"
            require(re.fullmatch(r"[a-z0-9_]+", name) is not None, where, name,
                    "a name of a-z, 0-9 and _ (it names metrics/choices_<arm>.json)")
            require(isinstance(arm, dict) and bool(arm) and set(arm) <= set(ARM_KEYS), where, arm,
                    "a mapping with newline: <rule> and/or optim: {...}")
            if "newline" in arm:
                require(arm["newline"] in corpus.NEWLINE_RULES[1:], f"{where}.newline", arm["newline"],
                        " | ".join(corpus.NEWLINE_RULES[1:]) + " (unk is the baseline)")
            if "optim" in arm:
                require(isinstance(arm["optim"], dict) and bool(arm["optim"]), f"{where}.optim", arm["optim"],
                        "a mapping of OptimConfig fields")


def arm_inputs(poems: list[str], vocab_size: int, val_fraction: float, newline: str) -> dict[str, bytes]:
    """The corpus_lm inputs (as the corpus stage writes them) of a text built by rule `newline`."""
    tok, arrays, _ = corpus.build(poems, vocab_size, val_fraction, newline)
    return corpus.input_files(tok, arrays)


def cells(runs: Mapping[str, Mapping], pairs: dict[int, dict[bool, str]], steps: Sequence[int]) -> dict[str, float]:
    """One seed's headline cells from its variants' summaries; `steps`: train.diag_steps (the collapse is
    read at the first after 0, the late scales at the last)."""
    small, large = min(pairs), max(pairs)
    early, late = min(s for s in steps if s > 0), max(steps)
    big = runs[pairs[large][False]]
    out = {f"{v}.loss_final": float(runs[v]["loss_final"]) for p in pairs.values() for v in p.values()}
    for d in (small, large):
        out[f"gap_d{d}"] = float(runs[pairs[d][False]]["loss_final"] - runs[pairs[d][True]]["loss_final"])
    out[f"{pairs[large][False]}.entropy_step{early}"] = float(big[f"entropy_step{early}"])
    out["jacobian_fall_orders"] = math.log10(big["jacobian_fro_step0"] / big[f"jacobian_fro_step{late}"])
    out.update({f"{pairs[large][False]}.{k}": float(big[k]) for k in (*LATE[:2], f"{LATE[2]}{late}")})
    return out


def cell_order(name: str) -> tuple:
    """The report's order: the losses, the gaps, the collapse, the Jacobian's fall, the late scales."""
    groups = ("loss_final", "gap_d", "entropy_step", "jacobian_fall", *LATE)
    return next((i for i, g in enumerate(groups) if g in name), len(groups)), name


def log_cell(name: str) -> bool:
    """Scales and attention statistics are compared on the log scale (a ratio), losses and gaps as they are."""
    return any(g in name.rsplit(".", 1)[-1] for g in ("entropy_step", *LATE))


def analyse(base: Sequence[dict], arm: Sequence[dict], small: int, large: int, alpha: float = ALPHA,
            runs: int = 0) -> dict:
    """base and arm: each seed's cells (seeds in one order). For the baseline and the arm, per cell: mean, sd
    and the mean's 1 - alpha t interval, and the ratio of mean gaps with Fieller's interval; per cell of the
    arm the paired difference from the baseline (log scale where log_cell) with its t interval, p, Holm's
    adjusted p over the arm's cells (each arm is its own question, its own family) and the difference in
    the baseline's seed sd."""
    out: dict = {}
    for name, rows in ((BASELINE, base), (ARM, arm)):
        a: dict = {}
        for cell in rows[0]:
            x = [r[cell] for r in rows]
            b = Band.of(x, log=log_cell(cell))
            lo, hi = b.confidence_interval(alpha)
            entry = {"mean": math.exp(b.mean) if b.log else b.mean, "sd": b.sd, "ci_lo": lo, "ci_hi": hi}
            if name == ARM:
                y = [r[cell] for r in base]
                e = paired_effect(x, y, b.log, alpha)
                sd_base = Band.of(y, log=b.log).sd
                entry.update({"diff": e["diff"], "diff_lo": e["ci_lo"], "diff_hi": e["ci_hi"], "p": e["p"],
                              "diff_in_base_sd": e["diff"] / sd_base if sd_base else math.nan})
            a[cell] = entry
        num, den = [r[f"gap_d{large}"] for r in rows], [r[f"gap_d{small}"] for r in rows]
        lo, hi = fieller_ratio(num, den, alpha)
        bounded = math.isfinite(lo)  # else the d_head-32 gap is not clear of 0 at these seeds: no interval
        a["gap_ratio"] = {"value": float(np.mean(num) / np.mean(den)), "bounded": int(bounded),
                          **({"fieller_lo": lo, "fieller_hi": hi} if bounded else {})}
        out[name] = a
    tests = [c for c in out[ARM] if c != "gap_ratio"]
    for cell, p in zip(tests, holm_adjusted([out[ARM][c]["p"] for c in tests])):
        out[ARM][cell]["p_holm"] = p
    out["design"] = {"seeds": len(base), "alpha": alpha, "tests": len(tests), "runs": runs,
                     "correction": "Holm over the arm's cells"}
    return out


@dataclass
class ChoicesResult:
    metrics: dict  # metrics/choices_<arm>.json
    rows: list[dict]  # plots/choices/<arm>.csv: one row per (baseline or arm, seed)
    env: dict

    def lines(self) -> list[str]:
        out = []
        for name in (BASELINE, ARM):
            a = self.metrics[name]
            gaps = ", ".join(f"{c} {e['mean']:.3f} [{e['ci_lo']:.3f}, {e['ci_hi']:.3f}]"
                             for c, e in a.items() if c.startswith("gap_d"))
            out.append(f"{name}: {gaps}; ratio {_ratio_text(a['gap_ratio'])}")
        return out


def run(train: TrainConfig, corpus_cfg: corpus.CorpusConfig, cfg: ChoicesConfig, arm: str, device: str,
        engine: EngineConfig) -> ChoicesResult:
    """Arm `arm`'s runs (the train variants at cfg.seeds) and its cells against the baseline's, read from the
    seeds stage's distribution. Params are checked before any run starts."""
    if arm not in cfg.arms:
        raise ConfigError(f"choices arm {arm!r}: not in choices.arms ({', '.join(cfg.arms)})")
    dist = read_json(DIST)
    missing = [s for s in cfg.seeds if str(s) not in dist.get("runs", {})]
    if missing:
        raise ConfigError(f"choices.seeds: {missing} not among the seeds stage's runs ({DIST}); choose from "
                          f"seeds.seeds or run `dvc repro seeds`")
    pairs = pairs_by_dhead(train)
    require(len(pairs) >= 2 and all(set(p) == {True, False} for p in pairs.values()), "train.variants",
            sorted(train.variants), "a scaled and an unscaled variant at two or more d_head")
    spec = cfg.arms[arm]
    optim = spec.get("optim", {})
    if optim:
        optim_config(train, f"choices.arms.{arm}.optim", **optim)
    rule = spec.get("newline", "unk")
    poems = corpus.load_poems([CORPUS / "raw" / n for n in corpus_cfg.files])
    inputs = arm_inputs(poems, corpus_cfg.vocab_size, corpus_cfg.val_fraction, rule)
    planned = [((v, s), train.run(model_config(train.models, train.variants[v], f"train.variants.{v}"), s, device,
                                  f"{v} {arm} seed {s}", **optim))
               for v in train.variants for s in cfg.seeds]
    records = run_sweep(f"choices {arm}", [p for _, p in planned], inputs, engine)
    require_ok(records, "choices")
    summaries = {k: r.summary() for (k, _), r in zip(planned, records)}
    base = [cells(dist["runs"][str(s)], pairs, train.diag_steps) for s in cfg.seeds]
    arm_cells = [cells({v: summaries[(v, s)] for v in train.variants}, pairs, train.diag_steps) for s in cfg.seeds]
    rows = [{"arm": name, "seed": s, **c} for name, cs in ((BASELINE, base), (arm, arm_cells))
            for s, c in zip(cfg.seeds, cs)]
    return ChoicesResult(metrics=analyse(base, arm_cells, min(pairs), max(pairs), runs=len(records)), rows=rows,
                         env=stage_environment(device, records))


def record_stems(stage: str, stems) -> list[str]:
    """Of the machine records' stems (metrics/env/<stem>.json), those of `stage`'s runs: its own, and for
    choices every arm's (choices_<arm>)."""
    return [s for s in stems if s == stage or (stage == "choices" and s.startswith(PREFIX))]


def load_arms(metrics_dir: str | Path = "metrics") -> dict[str, dict]:
    """{arm: its metrics} from every metrics/choices_<arm>.json."""
    return {f.stem.removeprefix(PREFIX): read_json(f) for f in sorted(Path(metrics_dir).glob(f"{PREFIX}*.json"))}


# ---------------------------------------------------------------- its part of the report

def published_cells(claims) -> dict[str, float]:
    """The chapter's figure for each headline cell, from claims.yaml's value tables (`claims`: its
    Claims): train.<variant>.<metric> and the gaps; the Jacobian's fall and the ratio from two of them."""
    pub = {c.metric: float(c.published) for c in claims if c.cls == "value" and c.published is not None}
    out = {}
    for metric, x in pub.items():
        parts = metric.split(".")
        if len(parts) == 3 and parts[0] == "train":
            gap = parts[2].removesuffix("_loss_final") if parts[1] == "comparison" else None
            out[gap if gap and gap.startswith("gap_d") and "val" not in gap else f"{parts[1]}.{parts[2]}"] = x
    j0, j1 = (out.get(f"d256_unscaled.jacobian_fro_step{s}") for s in (0, 1480))
    if j0 and j1:
        out["jacobian_fall_orders"] = math.log10(j0 / j1)
    gaps = sorted((k for k in out if k.startswith("gap_d")), key=lambda k: int(k[5:]))
    if len(gaps) >= 2 and out[gaps[0]]:
        out["gap_ratio"] = out[gaps[-1]] / out[gaps[0]]
    return out


def _ci(e: Mapping, lo: str = "ci_lo", hi: str = "ci_hi", sign: str = "") -> str:
    return f"[{e[lo]:{sign}.3g}, {e[hi]:{sign}.3g}]"


def report_markdown(arms: Mapping[str, Mapping], claims=(), seeds: Optional[Mapping[str, Mapping]] = None) -> str:
    """Per arm (`load_arms`): each headline cell's baseline and arm means with the 95% interval of the mean,
    the paired difference with its interval and Holm's p; and whether the chapter's figure (one run) lies
    inside the 95% prediction interval of one run of the baseline and of the arm (`seeds`: read_seeds)."""
    if not arms:
        return ""
    pub, seeds = published_cells(claims), seeds or {}
    out = ["Each arm against the protocol at its paired seeds: means with their 95% interval of the mean; "
           "differences on the log scale (a factor) for attention statistics and scales, p after Holm over the arm's "
           "distinct tests (made again from plots/choices/<arm>.csv: ‖J‖ at the last step is the fall's test, counted "
           "once). The chapter's figure, one run, against the 95% prediction interval of one run (PI) of each side.\n"]
    for name, m in arms.items():
        base, d = m[BASELINE], m.get("design", {})
        a = {c: m[ARM][c] for c in sorted(m[ARM], key=cell_order) if c != "gap_ratio"}
        power = (f"; a cell moves after Holm with 80% power when its paired effect is at least "
                 f"{holm_detectable(d['seeds'], d['tests']):.2g} sd of its paired differences"
                 if d.get("seeds", 0) > 1 and d.get("tests") else "")
        out.append(f"**{name}** ({d.get('seeds', '?')} paired seeds, {d.get('runs', '?')} runs{power})\n")
        header = ["cell", "chapter", "baseline [95% CI]", "arm [95% CI]", "difference [95% CI]", "p (Holm)",
                  "chapter inside the PI: baseline / arm"]
        rows = []
        sides = seeds.get(name, {})
        for cell, e in a.items():
            log = log_cell(cell)
            diff = (f"×{math.exp(e['diff']):.3g} [×{math.exp(e['diff_lo']):.3g}, ×{math.exp(e['diff_hi']):.3g}]"
                    if log else f"{e['diff']:+.3g} {_ci(e, 'diff_lo', 'diff_hi', '+')}")
            p = pub.get(cell)
            inside = ("—" if p is None or not sides else
                      " / ".join(_yes(prediction_interval(sides.get(k, []), cell), p) for k in (BASELINE, ARM)))
            rows.append([cell, "—" if p is None else f"{p:.4g}", f"{base[cell]['mean']:.4g} {_ci(base[cell])}",
                         f"{e['mean']:.4g} {_ci(e)}", diff, f"{e['p_holm']:.2g}", inside])
        out += md_table(header, rows)
        out.append(f"\nThe ratio of the mean gaps (largest d_head over smallest) with Fieller's 95% interval: baseline "
                   f"{_ratio_text(base['gap_ratio'])}; {name} {_ratio_text(m[ARM]['gap_ratio'])}"
                   + (f" (the chapter: {pub['gap_ratio']:.2g})" if "gap_ratio" in pub else "") + ".")
        out.append(inside_sentence(name, sides, {c: pub[c] for c in a if c in pub}) + "\n")
    return "\n".join(out) + "\n"


def prediction_interval(seeds: Sequence[Mapping[str, float]], cell: str) -> Optional[tuple[float, float]]:
    """The 95% prediction interval of one run of `cell` over these seeds (log scale for a log cell); None
    with fewer than two seeds."""
    values = [s[cell] for s in seeds if cell in s and math.isfinite(s[cell])]
    if len(values) < 2 or (log_cell(cell) and min(values) <= 0):
        return None
    return Band.of(values, log=log_cell(cell)).prediction_interval()


def _yes(pi: Optional[tuple[float, float]], x: float) -> str:
    return "—" if pi is None else ("yes" if pi[0] <= x <= pi[1] else "no")


def inside_sentence(name: str, sides: Mapping[str, Sequence], pub: Mapping[str, float]) -> str:
    """How many of the chapter's headline figures each side's PI holds, and the arm's misses with its PI."""
    if not sides or not pub:
        return ""
    held = {k: {c: pi for c in pub if (pi := prediction_interval(sides.get(k, []), c))} for k in (BASELINE, ARM)}
    inside = {k: [c for c, pi in v.items() if pi[0] <= pub[c] <= pi[1]] for k, v in held.items()}
    misses = [f"{c} {pub[c]:.4g} against [{held[ARM][c][0]:.3g}, {held[ARM][c][1]:.3g}]"
              for c in held[ARM] if c not in inside[ARM]]
    return (f"The chapter's headline figures inside the 95% prediction interval of one run: {len(inside[ARM])} of "
            f"{len(held[ARM])} with {name}, {len(inside[BASELINE])} of {len(held[BASELINE])} with the protocol"
            + (f"; outside with {name}: {'; '.join(misses)}." if misses else "."))


def read_seeds(plots_dir: str | Path = "plots") -> dict[str, dict[str, list[dict]]]:
    """{arm: {'baseline' | 'arm': [one seed's cells]}} from plots/choices/<arm>.csv (whose `arm` column is
    'baseline' or the arm's name), each side in the order of its seeds."""
    out: dict[str, dict[str, list[dict]]] = {}
    for f in sorted((Path(plots_dir) / "choices").glob("*.csv")):
        with open(f, newline="", encoding="utf-8") as fh:
            rows = sorted(csv.DictReader(fh), key=lambda r: int(r["seed"]))
        for r in rows:
            cells = {k: float(v) for k, v in r.items() if k not in ("arm", "seed") and v not in ("", None)}
            out.setdefault(f.stem, {}).setdefault(BASELINE if r["arm"] == BASELINE else ARM, []).append(cells)
    return out


def same_test(cells) -> dict[str, str]:
    """Cells whose paired test is another cell's: the large unscaled model's ‖J‖ at the last step is the fall's
    (the fall is log10 of ‖J‖ at step 0 over it, and step 0 is the shared init's), so one Holm family holds one."""
    return {c: "jacobian_fall_orders" for c in cells if "jacobian_fall_orders" in cells and ".jacobian_fro_step" in c}


def reanalysed(arms: Mapping[str, Mapping], seeds: Mapping[str, Mapping[str, list[dict]]]) -> dict[str, dict]:
    """Each arm's analysis made again from its per-seed cells (read_seeds) with Holm over its distinct tests: a
    cell that is another's test (same_test) is shown with that cell's p, out of the family. The stages' own
    metrics/choices_<arm>.json counted ‖J‖ at the last step and the fall as two tests (issue 63); an arm without
    per-seed cells keeps its stage's analysis."""
    out = {}
    for name, m in arms.items():
        sides = seeds.get(name) or {}
        if not sides.get(BASELINE) or len(sides.get(ARM, [])) != len(sides[BASELINE]):
            out[name] = dict(m)
            continue
        twins = same_test(sides[ARM][0])
        gaps = sorted(int(c[5:]) for c in sides[ARM][0] if c.startswith("gap_d"))
        small, large = gaps[0], gaps[-1]
        keep = lambda rows: [{k: v for k, v in r.items() if k not in twins} for r in rows]  # noqa: E731
        a = analyse(keep(sides[BASELINE]), keep(sides[ARM]), small, large, runs=m.get("design", {}).get("runs", 0))
        twin_rows = analyse(sides[BASELINE], sides[ARM], small, large)
        for cell, test in twins.items():
            a[BASELINE][cell] = twin_rows[BASELINE][cell]
            a[ARM][cell] = {**twin_rows[ARM][cell], "p_holm": a[ARM][test]["p_holm"]}
        a["design"]["correction"] = "Holm over the arm's distinct tests (" + ", ".join(
            f"{c} is {t}'s" for c, t in twins.items()) + ")"
        out[name] = a
    return out


def _ratio_text(r: Mapping) -> str:
    if r.get("bounded"):
        return f"{r['value']:.2f} [{r['fieller_lo']:.2f}, {r['fieller_hi']:.2f}]"
    return f"{r['value']:.2f} (unbounded: the smaller gap is not clear of 0 at these seeds)"


def answer(arms, all_metrics, dists, claims=()) -> str:
    if not arms:
        return ""
    parts = []
    for name, m in arms.items():
        a, base = m[ARM], m[BASELINE]
        moved = [c for c, e in a.items() if c != "gap_ratio" and e.get("p_holm", 1) < ALPHA]
        gaps = ", ".join(f"{c} {a[c]['mean']:.3f} (baseline {base[c]['mean']:.3f})" for c in a if c.startswith("gap_d"))
        parts.append(f"{name} ({m.get('design', {}).get('seeds', '?')} seeds): {len(moved)} of {len(a) - 1} headline "
                     "cells move after Holm" + (f" ({', '.join(moved)})" if moved else "") + f"; gaps {gaps}")
    return ("Over paired seeds, " + "; ".join(parts) + ". An arm closer to a published figure is not adopted for "
            "that: the protocol changes only for a reason in the chapter's text (docs/PROTOCOL.md). "
            + text_rules_sentence(all_metrics.get("corpus") or {}, claims))


def text_rules_sentence(corpus: Mapping, claims=()) -> str:
    """Which newline rule the chapter's own corpus figures agree with (metrics/corpus.json `by_newline`,
    no training): its character count against each rule's token stream, its coverage against each's."""
    rules = corpus.get("by_newline") or {}
    pub = {c.id.rsplit(".", 1)[-1]: c for c in claims if c.id.startswith("corpus.") and c.is_cell}
    if not rules or "tokens" not in pub or "coverage" not in pub:
        return ""
    n, cov = pub["tokens"].published, pub["coverage"]
    streams = "; ".join(f"{r} {m['tokens']:,} ({100 * (m['tokens'] / n - 1):+.1f}%)" for r, m in rules.items())
    covs = [m["coverage"] for m in rules.values()]
    return (f"The chapter's own corpus figures, measured without training: its {n:,.0f} characters against each "
            f"rule's token stream: {streams}; its {100 * cov.published:.1f}% coverage against ours "
            f"{100 * min(covs):.2f}-{100 * max(covs):.2f}% under every rule, which does not tell the rules apart.")
