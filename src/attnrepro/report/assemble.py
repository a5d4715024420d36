"""The reproduction report: the chapter's conclusions, checksums and published values
against this run and its seed distributions, per experiment, with figures.

`build(...)` evaluates claims.yaml against metrics/ and returns the content of
metrics/claims.json, metrics/claims_summary.json, report/REPORT.md, report/APPENDIX.md,
report/REPORT.html (REPORT.md, figures and CJK glyphs embedded; report/html.py) and the report's
figures (PNG bytes). REPORT.md is laid out like a paper: its first screen answers (the verdict in
the words and counts `attnrepro check` uses, the headline, each conclusion not reproduced with its
measured cause: `verdict_markdown`), then one section per experiment in the chapter's order
(`SECTIONS`: design, cost, answer, captioned figures, the chapter's conclusions). APPENDIX.md holds
the tables behind it: checksums, published values, per-seed tables, the sensitivity sweep, the
verdict's power and the machine records. This module only assembles: each experiment's answer and
tables live beside the experiment (`ANSWERS`), the claims' tables in report/claims_tables.py.
Everything is a pure function of its inputs: no dates, sorted iteration, PNGs and the font written
without a stamp, so the same metrics give byte-identical outputs.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attnrepro.audit.battery import report_section
from attnrepro.config import require
from attnrepro.data import corpus
from attnrepro.experiments import (charlm, choices, comparison, critical, failures, heads, init_sweep, kv_cache,
                                   latency, precision, qknorm, reversal, sensitivity)
from attnrepro.experiments.comparison import diagnostics_figure, loss_figure, modes_markdown, pairs_by_dhead
from attnrepro.files import read_json
from attnrepro.formatting import dig, fmt, fmt_number, md_table
from attnrepro.judge import endpoints
from attnrepro.judge.claims import (ClaimResult, claims_json, counts, evaluate_all, kind, load, load_json_dir,
                                    load_metrics_dir, on_published, revised, tally_lines)
from attnrepro.model.attention_impl import BUILTIN
from attnrepro.report import collapse, critical_curve, crossing, first_screen
from attnrepro.report.claims_tables import experiment_markdown, self_consistency_markdown, this_run_text
from attnrepro.report.html import anchor, markdown_to_html, resolver
from attnrepro.report.machine import env_markdown, machine_line
from attnrepro.report.power import power_markdown
from attnrepro.stats import Band


@dataclass
class Report:
    claims_json: dict  # metrics/claims.json: every claim (a plain output)
    summary: dict  # metrics/claims_summary.json: the counts per class (the DVC metric)
    markdown: str
    figures: dict[str, bytes]  # file name under report/figures/ -> PNG bytes (the report's own)
    results: list[ClaimResult]
    html: str = ""  # report/REPORT.html: the same report, figures embedded as data URIs
    appendix: str = ""  # report/APPENDIX.md: the tables behind it

    def lines(self, out: str) -> list[str]:
        """The stage's summary: the verdict's counts (judge.claims.tally_lines), then where the report went."""
        return [*tally_lines(self.summary).values(), f"-> {out}/REPORT.md, {out}/APPENDIX.md"]


@dataclass
class ReportConfig:
    """params `report` (no defaults: params.yaml is the only source of values)."""
    claims: str  # the only place published numbers live
    smooth: int  # moving-average window of the training-loss figure

    def validate(self, prefix: str = "report") -> None:
        require(self.smooth > 0, f"{prefix}.smooth", self.smooth, "a positive integer")
        require(Path(self.claims).is_file(), f"{prefix}.claims", self.claims, "an existing claims file")


# ---------------------------------------------------------------- series

def read_series(path: Path) -> dict[str, list[float]]:
    """A CSV of numeric columns -> {column: [values]}; empty cells become nan."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    cols: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            try:
                cols.setdefault(k, []).append(float(v) if v not in ("", None) else math.nan)
            except ValueError:
                cols.setdefault(k, []).append(math.nan)
    return cols


GATE_POWER = Path("benchmarks/results/gate_power.json")  # the gate matrix's reruns (the collapse table's missing rows)


def read_json_or_empty(path: Path) -> dict:
    return read_json(path) if path.exists() else {}


# ---------------------------------------------------------------- sections (the chapter's order)

@dataclass(frozen=True)
class Section:
    key: str  # the claims.yaml experiment (and metrics/<key>.json) it reports
    title: str
    chapter: str  # where the chapter runs it
    plots: tuple[str, ...]  # plots/<stage>/ folders whose PNGs it shows
    design: str  # the protocol in a sentence or two (numbers come from metrics, never typed here)


SECTIONS: tuple[Section, ...] = (
    Section("corpus", "Corpus", "§1.18.1", ("corpus",),
            "The chapter's training text: the first poems of the complete Tang poems (全唐诗) from the hash-pinned npm "
            "copy of the chinese-poetry collection, tokenized by character into a fixed vocabulary (<pad>, <unk> and the "
            "most frequent characters); the last tenth of the token stream is the validation split."),
    Section("train", "The controlled comparison: scaled against unscaled, over seeds", "§1.1-1.4, §1.7.7, §1.12",
            ("train", "seeds"),
            "TinyGPT at d_head 32 (four heads) and d_head 256 (one head), each with and without 1/√d_k, trained on the "
            "same batches from the same initialisation (the chapter's §1.18 recipe); the reference distribution repeats "
            "the four variants over paired seeds (scaled and unscaled share each seed's init draw and batch order), and "
            "records the layer-0 entropy, logit std and softmax Jacobian norm during training."),
    Section("init_sweep", "How large are q·k at initialisation?", "§1.3, §1.7, §1.19.1", ("init_sweep",),
            "A one-layer, one-head TinyGPT at d_head = d_model from 32 to 512, untrained: the standard deviation of the "
            "raw q·k logits averaged over random token batches, against the footnote's √d and the variance-propagation "
            "prediction v·√d (v = d·σ²)."),
    Section("heads", "What the eight heads of the small model do", "§1.8.5-1.8.6", ("heads",),
            "The trained d_head-32 scaled model on fixed validation sequences: each head's entropy, diagonal, "
            "previous-token weight and mean distance, its attention maps, and the loss increase when it is ablated; "
            "heads are compared with the published ones after a one-to-one matching within each layer."),
    Section("kv_cache", "The KV cache: memory accounting", "§1.8.7-1.8.8, §1.11.5", ("kv_cache",),
            "The KV-cache formula 2·layers·kv_heads·d_head·length·bytes for the chapter's model shapes (MHA, GQA, MQA), "
            "checked against the bytes a real cache for TinyGPT allocates; generation with and without the cache must "
            "give identical tokens; per-token latency against context length."),
    Section("failures", "Injected bugs and their symptoms", "§1.11, §1.13", ("failures",),
            "The small model trained briefly with each of the chapter's attention bugs (mask filled with 0, scaling after "
            "the softmax, no max subtraction, division by d_k) next to the correct attention, same seed and batches; the "
            "symptoms recorded, and the health checks of §1.13 run on every variant."),
    Section("latency", "What O(n²) costs in time", "§1.14.2", ("latency",),
            "Causal attention forward passes (SDPA and a naive version that materialises the n×n matrix) at growing "
            "sequence lengths, warm-up then timed repetitions; on a machine without CUDA a CPU sweep at smaller n."),
    Section("precision", "Numerical precision: fp32, fp16, bf16", "§1.6.4, §1.11.3, §1.16-1.17", ("precision",),
            "Format limits (torch.finfo), the naive against the stable softmax, exp overflow of logits at the chapter's "
            "measured scales, the real attention forward in each format, the additive-mask pitfall, bf16 accumulation, "
            "and parity of the manual attention and its backward with SDPA and autograd in float64."),
    Section("critical", "Exercises 1-2: the critical d_head", "§1.20.1-2", ("critical",),
            "The train protocol, scaled and unscaled, over seeds: with only the query/key width d_qk of one model "
            "moving (one variable), and at every d_head of the chapter's grid with d_model and n_head moving too "
            "(mixed width): where does the loss gap start to rise?"),
    Section("exercise3", "Exercise 3: the attention centroid per head", "§1.20.3", (),
            "For each head of the small model, the centroid distance dist_i = Σ_j (i − j) p_ij of every query row, its "
            "mean and its spread over positions; a head that spreads more than uniform attention is \"conditional\"."),
    Section("qknorm", "QK-norm at d_head 256", "§1.7.8, §1.26.5", ("qknorm",),
            "The large model with q and k normalised per head (LayerNorm, or unit L2 with a learned gain), with and "
            "without 1/√d_k, against the plain scaled and unscaled models, over seeds: had QK-norm been used, would the "
            "failed experiment have failed?"),
    Section("choices", "Protocol choices that move the headline", "§1.18.1, §1.18.3", ("choices",),
            "The choices the chapter does not settle that could move its headline, each an arm trained at paired "
            "seeds against the protocol as written: how the text keeps its line breaks and how the tokenizer encodes "
            "them, and the weight-decay value. The headline cells per arm, with intervals, and where the chapter's "
            "figures sit in each."),
    Section("sensitivity", "Sensitivity to the source's unstated choices", "beyond the chapter", ("sensitivity",),
            "Paired changes of the settings the chapter leaves unstated (docs/PROTOCOL.md): the weight-decay value and "
            "the validation split for every run, and the failures table's schedule, block size and init for its runs "
            "only; each choice, and the combinations params list, against the protocol as written at the same seeds. "
            "Effects with their own paired standard errors, Holm's correction over all cells, the no-overshoot rule, "
            "the pre-registered explanations (docs/sensitivity_preregistration.yaml) and the protocols judged jointly."),
    Section("reversal", "Companion: digit reversal", "companion chapter", ("reversal",),
            "A two-block transformer learns to reverse six digits; four heads, one head, and four heads without the "
            "causal mask; accuracy, the reverse-alignment weight of each layer, and what the mask prevents."),
    Section("charlm", "Companion: a tiny character LM", "companion chapter", ("charlm",),
            "A four-block character-level model trained on eight sentences; loss curves, attention maps and its "
            "greedy and sampled continuations."),
)


def _not_holding(r: ClaimResult) -> str:
    """Why a conclusion does not hold, in words: on this run (its two sides), and on the reference's seeds, where
    it falls short of the majority it needs."""
    parts = [f"{fmt_number(r.value)} vs {fmt_number(r.bound)} on this run"] if r.value is not None and \
        r.bound is not None else []
    if r.seeds_n and 2 * r.seeds_held <= r.seeds_n:
        parts.append(f"it holds on only {r.share_text()}, short of the majority it needs")
    return "; ".join(parts) or this_run_text(r)


def _claims_sentence(rs: list[ClaimResult]) -> str:
    """How this section's claims came out, in words."""
    parts = []
    for k, word in (("conclusion", "conclusions hold"), ("finding", "findings of this project's own hold"),
                    ("checksum", "checksums hold"), ("value", "published values lie inside our band or tolerance")):
        xs = [r for r in rs if kind(r.claim) == k and r.status != "skipped"]
        if xs:
            parts.append(f"{sum(r.passed for r in xs)} of {len(xs)} {word}")
    failed = [r.claim.id for r in rs if r.claim.cls == "conclusion" and r.status == "fail"]
    text = ("Claims: " + "; ".join(parts) + ".") if parts else ""
    if failed:
        text += " Not reproduced: " + ", ".join(f"`{c}`" for c in failed) + "."
    return text


ANSWERS = {"corpus": corpus.answer, "train": comparison.answer, "init_sweep": init_sweep.answer,
           "heads": heads.answer, "kv_cache": kv_cache.answer, "failures": failures.answer,
           "latency": latency.answer, "precision": precision.answer,
           "critical": lambda m, all_m, d: critical_curve.answer(m, all_m.get("critical_fit") or {}),
           "exercise3": critical.answer_exercise3, "qknorm": qknorm.answer, "sensitivity": sensitivity.answer,
           "choices": choices.answer,
           "reversal": reversal.answer, "charlm": charlm.answer}  # each section's answer, beside its experiment


def answer(key: str, metrics: dict, dists: dict, results: list[ClaimResult]) -> str:
    """The section's one-paragraph answer, written from the numbers (never typed figures); metrics a
    partial workspace lacks leave their sentence out."""
    try:
        extra = ([r.claim for r in results],) if key in ("sensitivity", "choices") else ()
        text = ANSWERS[key](metrics.get(key) or {}, metrics, dists, *extra)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        text = ""  # a metrics file of another layout: the claims sentence still answers
    claims = _claims_sentence([r for r in results if r.claim.experiment == key])
    return " ".join(t for t in (text, claims) if t) or "No metrics for this experiment yet."


def runs_count(key: str, metrics: dict, dists: dict) -> tuple[int | None, str]:
    """The training runs behind a section, counted from what metrics record, and how."""
    m = metrics.get(key) or {}
    if key == "train":
        v = [k for k in m if k != "comparison" and isinstance(m[k], dict)]
        n = (metrics.get("seeds") or {}).get("n_seeds")
        if n:
            return len(v) * n, f"{len(v)} variants × {n} seeds (this run's seed among them)"
        return (len(v), f"{len(v)} variants") if v else (None, "")
    if key == "failures":
        runs = (dists.get("failures") or {}).get("runs") or {}
        n = len(runs) or 1
        return (len(m) * n, f"{len(m)} variants × {n} seed(s)") if m else (None, "")
    if key == "critical":
        d = [k for k in m if k.startswith("d") and k[1:].isdigit()]
        q = m.get("d_qk") or {}
        w = [k for k in q if k.startswith("dqk") and k[3:].isdigit()]
        if d and m.get("seeds") and w and q.get("seeds"):
            return (m.get("runs") or len(d) * 2 * m["seeds"] + len(w) * 2 * q["seeds"],
                    f"{len(w)} d_qk × scaled/unscaled × {q['seeds']} seeds (one variable), {len(d)} d_head × "
                    f"scaled/unscaled × {m['seeds']} seeds (mixed width) and the chapter's variants at the one-variable "
                    "seeds (reference points), a run two of these share counted once; one another stage shares is "
                    "trained once")
        if d and m.get("seeds"):
            return len(d) * 2 * m["seeds"], f"{len(d)} d_head × scaled/unscaled × {m['seeds']} seeds"
    if key == "qknorm":
        seeds = {v.get("seeds") for v in m.values() if isinstance(v, dict)}
        if m and len(seeds) == 1 and None not in seeds:
            n = seeds.pop()
            return len(m) * n, f"{len(m)} forms and references × {n} seeds (references shared through the run store)"
    if key == "sensitivity":
        d = m.get("design") if isinstance(m, dict) else None
        if d and d.get("runs"):
            return d["runs"], (f"{d['protocols']} protocols (the baseline, choices, combinations) × the variants each "
                               f"applies to × {d['seeds']} paired seeds; the baseline's runs at shared seeds are the "
                               "seeds and failures stages' own")
    if key == "choices" and m:
        seeds = sorted({a["design"]["seeds"] for a in m.values()})
        return sum(a["design"]["runs"] for a in m.values()), (
            f"{len(m)} arm{'s' * (len(m) != 1)} × the train variants × {'/'.join(map(str, seeds))} paired seeds; "
            "the baseline's runs are the seeds stage's")
    if key == "reversal":
        models = [k for k, v in m.items() if isinstance(v, dict) and "digit_acc" in v]
        return (len(models), f"{len(models)} models of {dig(m, 'config.steps')} steps") if models else (None, "")
    if key == "charlm":
        return (1, f"1 model of {m.get('final_step')} steps") if m else (None, "")
    return None, ""


NO_TRAINING = {"corpus": "no training", "init_sweep": "no training (forward passes at initialisation)",
               "heads": "no training (probes of the trained small model)", "kv_cache": "no training",
               "latency": "no training (timed forward passes)", "precision": "no training",
               "exercise3": "no training (from the heads stage's probes)"}


COST_STAGES = {"train": ("train", "seeds")}  # a section whose runs come from more than its own stage


def run_hours(envs: dict, stages) -> Optional[tuple[int, float]]:
    """(runs, hours of the runs' own wall time when they were trained) from the stages' environment
    records (choices: every arm's); None where no record has them."""
    recs = [envs[s] for stage in stages for s in choices.record_stems(stage, envs) if "run_wall_seconds" in envs[s]]
    if not recs:
        return None
    return sum(e["runs"] for e in recs), sum(e["run_wall_seconds"] for e in recs) / 3600


def cost_line(key: str, metrics: dict, dists: dict, envs: Optional[dict] = None) -> str:
    n, how = runs_count(key, metrics, dists)
    what = NO_TRAINING.get(key) or (f"{n} training run{'s' if n != 1 else ''} ({how})" if n
                                    else "training runs not counted in metrics/")
    spent = run_hours(envs or {}, COST_STAGES.get(key, (key,)))
    if spent:
        return (f"**Cost.** {what}; {spent[1]:.2f} h of run wall time over {spent[0]} runs (each run's own time "
                "when it was trained, on one core; metrics/env records it).")
    extra = ""
    if key == "kv_cache":
        lat = dig(metrics, "kv_cache.latency") or {}
        if "gen_cached_s" in lat and "gen_uncached_s" in lat:
            extra = (f"; its timed generations took {lat['gen_cached_s']:.2f} s with the cache and "
                     f"{lat['gen_uncached_s']:.2f} s without")
    return f"**Cost.** {what}; wall time not recorded in metrics/{extra}."


def per_seed_markdown(dist: dict, this: dict, keys: list[str], prefix: str) -> str:
    """Each seed's value of the headline metrics `keys` ('<prefix>.<variant>.<metric>'), with this run,
    the mean and the sd over seeds."""
    runs = dist.get("runs") or {}
    keys = [k[len(prefix) + 1:] for k in keys if k.startswith(prefix + ".")]
    rows = [k for k in keys if any(dig(r, k) is not None for r in runs.values())]
    if not runs or not rows:
        return ""
    seeds = sorted(runs, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    out = [f"Per seed: the headline metrics of `{prefix}` for each of the {len(seeds)} seeds of metrics/dist/{prefix}.json "
           "(mean and sd over those seeds):\n"]
    header = ["metric", "this run", *(f"seed {s}" for s in seeds), "mean", "sd"]
    table = []
    for k in rows:
        vals = [dig(runs[s], k) for s in seeds]
        xs = [v for v in vals if isinstance(v, (int, float))]
        b = Band.of(xs) if xs else None
        mean, sd = (b.mean if b else None), (b.sd if b and b.n > 1 else None)
        table.append([k, fmt(dig(this, k), 4), *(fmt(v, 4) for v in vals), fmt(mean, 4), fmt(sd, 3)])
    out += md_table(header, table)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the report

def build(claims_path: Path, metrics_dir: Path, plots_dir: Path, pairs, steps: tuple[int, ...] = (), smooth: int = 20,
          exclude_plots: tuple[str, ...] = ("report",), plots_href: str = "../plots") -> Report:
    """pairs: [(d_head, {scaled: variant})]; steps: train.diag_steps (with pairs, the first screen's table of
    headline cells); plots_href: plots_dir as seen from the report's folder."""
    exp = load(claims_path)
    flat = load_metrics_dir(metrics_dir)
    dists = load_json_dir(metrics_dir / "dist")
    envs = load_json_dir(metrics_dir / "env")
    results = evaluate_all(exp, flat, dists, envs)
    c = counts(results)
    series = {}
    for _, pair in pairs:
        for name in pair.values():
            f = plots_dir / "train" / f"{name}.csv"
            if f.exists():
                series[name] = read_series(f)
    figures: dict[str, bytes] = {}
    for name, fig in (("train_loss.png", loss_figure(series, pairs, smooth)),
                      ("train_diagnostics.png", diagnostics_figure(series, pairs))):
        if fig:
            figures[name] = fig
    embedded = [(png.parent.name, png.name) for png in sorted(plots_dir.glob("*/*.png"))
                if png.parent.name not in exclude_plots]
    # each section's own metrics file, nested as its stage writes it (and the seed summaries)
    metrics = {k: read_json_or_empty(metrics_dir / f"{k}.json") for k in sorted({s.key for s in SECTIONS} | {"seeds"})}
    arm_seeds = choices.read_seeds(plots_dir)
    metrics["choices"] = choices.reanalysed(choices.load_arms(metrics_dir), arm_seeds)
    metrics["critical_fit"] = critical_curve.fits(plots_dir)  # the critical curve's model, from its per-seed tables
    seeds = metrics.get("seeds") or {}
    train_dist = dists.get("train", {})

    md = ["# attnrepro: reproduction report\n",
          "Does the chapter's attention experiment reproduce? The verdict first, then one section per experiment in "
          "the chapter's order (design, cost, answer, figures, the chapter's conclusions). Every published value, the "
          "per-seed tables, the sensitivity sweep and the machine records are in [the appendix](APPENDIX.md). "
          "Generated by the `report` stage from metrics/ and plots/; same metrics, same bytes.\n"]
    table = first_screen.rows(dists, dict(pairs), steps, exp.claims, results, arm_seeds)
    md += verdict_markdown(exp, results, flat, dists, envs, table)
    consistent, on_figures = self_consistency_markdown(on_published(exp), revised(results, flat, dists, envs))
    md += consistent
    appendix = ["# attnrepro: reproduction report, appendix\n",
                "The detail behind [REPORT.md](REPORT.md): per experiment, its checksums, every published value "
                "against our seeds, and its per-seed tables; then the sensitivity sweep, the verdict's power and the "
                "machine records.\n",
                "## How to read a published value\n", READING.format(c["value"]["unexplained"])]

    shown: set[tuple[str, str]] = set()
    own = {"train": [("figures/train_loss.png", "train_loss.png"), ("figures/train_diagnostics.png",
                                                                     "train_diagnostics.png")]}
    crossed = crossing.markdown(envs, train_dist, metrics.get("train") or {}, plots_dir, dict(pairs))
    extras = {"critical": lambda: critical_curve.report_markdown(metrics.get("critical") or {},
                                                                 metrics["critical_fit"]),
              "exercise3": lambda: heads.centroid_markdown(metrics.get("heads") or {}),
              "choices": lambda: choices.report_markdown(metrics["choices"], exp.claims, arm_seeds) + "\n" + crossed[0],
              "train": lambda: modes_markdown(seeds) + "\n" + collapse.section(
                  envs, train_dist, metrics.get("train") or {}, metrics.get("sensitivity") or {},
                  read_json_or_empty(claims_path.parent / GATE_POWER), plots_dir, dict(pairs), exp.claims)}
    details = {"choices": lambda: crossed[1],
               "qknorm": lambda: qknorm.report_markdown(metrics.get("qknorm") or {}),
               "sensitivity": lambda: sensitivity.report_markdown(metrics.get("sensitivity") or {}, exp),
               "train": lambda: per_seed_markdown(train_dist, metrics.get("train") or {}, exp.headline, "train"),
               "failures": lambda: per_seed_markdown(dists.get("failures", {}), metrics.get("failures") or {},
                                                     exp.headline, "failures")}
    # an experiment with claims but no place in SECTIONS yet is reported after the chapter's
    sections = list(SECTIONS) + [Section(k, exp.sections[k], "", (k,), f"the `{k}` stage: see the docstring of "
                                         f"src/attnrepro/experiments/{k}.py (its place in this report: SECTIONS)")
                                 for k in exp.sections
                                 if k not in {s.key for s in SECTIONS} and any(r.claim.experiment == k for r in results)]
    for number, sec in enumerate(sections, 1):
        rs = [r for r in results if r.claim.experiment == sec.key]
        title = f"{number}. {sec.title}" + (f" ({sec.chapter})" if sec.chapter else "")
        md.append(f"## {title}\n")
        if sec.design:
            md.append(f"**Design.** {sec.design}\n")
        md.append(cost_line(sec.key, metrics, dists, envs) + "\n")
        md.append(f"**Answer.** {answer(sec.key, metrics, dists, results)}\n")
        figs = [(src, name) for src, name in own.get(sec.key, []) if name in figures]
        if sec.key == "train" and not series:
            md.append("No training curves yet (plots/train/*.csv missing).\n")
        for stage in sec.plots:
            for st, name in embedded:
                if st == stage:
                    figs.append((f"{plots_href}/{st}/{name}", f"{st}/{name}"))
                    shown.add((st, name))
        for src, name in figs:
            caption = CAPTIONS.get(name, name)
            md.append(f"![{caption}]({src})\n\n*{caption}*\n")
        if sec.key in extras:
            md.append(extras[sec.key]())
        if rs:
            md.append(experiment_markdown(None, rs, classes=("conclusion",)))
        more = experiment_markdown(None, rs, classes=("checksum", "value")) if rs else ""
        extra = details[sec.key]() if sec.key in details else ""
        if more.strip() or extra.strip():  # unnumbered there: not every section has tables, so its numbers would skip
            in_appendix = title.split(". ", 1)[1]
            appendix += [f"## {in_appendix}\n", extra, more]
            md.append(f"Its checksums, published values and per-seed tables: [the appendix](APPENDIX.md#"
                      f"{anchor(in_appendix)}).\n")
    rest = [e for e in embedded if e not in shown]
    if rest:
        md.append("## Other figures\n")
        md += [f"![{st}/{name}]({plots_href}/{st}/{name})\n" for st, name in rest]
    appendix += causes_markdown(exp, results, flat)
    appendix += ["## The chapter's conclusions on its own figures\n",
                 "Each conclusion's predicate evaluated on the chapter's published values (claims.yaml) in place of "
                 "our metrics; where they lack a figure it reads, the first one.\n", *on_figures]
    appendix += ["## Verdict power\n", power_markdown(dists, exp)]
    appendix += ["## Machine records\n", "\n".join(crossing.machines_markdown(crossing.sweep_machines(envs))),
                 env_markdown(envs)]
    summary = {k: dict(v) for k, v in c.items()}
    markdown = tidy(md)
    page = markdown_to_html(markdown, resolver(figures, plots_dir, plots_href))
    return Report(claims_json(results), summary, markdown, figures, results, page, tidy(appendix))


def tidy(lines: list[str]) -> str:
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines).rstrip() + "\n")


READING = (
    "Where our runs have seeds, first by its **percentile among our seeds** (0 or 100: beyond all of them; with n "
    "seeds it moves in steps of 100/n, a tie counting half), and where a variant's seeds fall into modes, by the mode "
    "the chapter's run was in (read once per variant off the chapter's published value of the statistic the modes were "
    "found on; unknown where it prints none). Then by our band: the published figure, with the rounding interval of "
    "its printed digits, is \"inside\" when it meets the 95% prediction interval of one run over our seeds (per mode "
    "where there are modes; z: seed standard deviations from our mean, or with modes from the chapter's mode where its "
    "diagnostic names one, else the nearest, in within-mode sd; on the log scale for attention statistics), \"off\" "
    "when it misses its tolerance where no seed distribution exists. Head portraits are judged after matching our "
    "heads to the published ones one-to-one within a layer (Hungarian assignment over their statistics). Published "
    "values outside without an explanation measured here: **{}** (marked \"unexplained\").\n")

# what each figure shows (the report's captions; the numbers are in the text beside them)
CAPTIONS = {
    "train_loss.png": "Training loss of this run's four models: d_head 32 and 256, each with and without 1/√d_k "
                      "(the chapter's Fig 1.2).",
    "train_diagnostics.png": "Layer-0 attention entropy and softmax Jacobian norm over training, d_head 32 and 256, "
                             "with and without scaling (the chapter's Fig 1.4).",
    "seeds/bands.png": "Every seed at once: each variant's mean training curve with its range over the seeds, and the "
                       "layer-0 entropy's mean.",
    "seeds/gaps.png": "The loss gap (unscaled minus scaled) at d_head 32 and 256, one point per seed.",
    "seeds/points.png": "Each seed's headline values per variant; the statistic the modes were tested on.",
    "seeds/runs.png": "Every run's loss curve, per variant.",
    "init_sweep/sweep.png": "Std of the raw q·k logits at initialisation against d_head, with √d and the "
                            "variance-propagation prediction.",
    "heads/layer0.png": "Attention maps of the small model's layer-0 heads on a validation sequence.",
    "heads/layer1.png": "Attention maps of the small model's layer-1 heads on a validation sequence.",
    "kv_cache/latency.png": "Per-token generation time against context length, with and without the KV cache.",
    "failures/training.png": "Training loss of the correct attention and each injected bug, same seed and batches.",
    "latency/latency.png": "Attention forward time against sequence length, SDPA and the naive n×n version.",
    "critical/curve.png": "The loss gap against d_qk (one variable) and against d_head (mixed width), each arm's "
                          "final loss and the attention entropies, with the paired onset shaded.",
    "critical/gap_vs_logit_std.png": "The loss gap against the initial logit std, both designs and the chapter's "
                                     "variants.",
    "qknorm/forms.png": "The large model's training loss with QK-norm (LayerNorm, L2) with and without 1/√d_k, "
                        "against the plain scaled and unscaled models.",
    "reversal/loss_curves.png": "Digit reversal: answer loss over training, per model.",
    "reversal/attention_heads1.png": "Digit reversal: attention maps of the one-head model.",
    "reversal/attention_heads4.png": "Digit reversal: attention maps of the four-head model.",
    "reversal/attention_no_mask.png": "Digit reversal: attention maps of the model trained without the causal mask.",
    "charlm/loss_curve.png": "Character LM: loss on a fixed batch over training.",
    "charlm/attention_block1.png": "Character LM: attention maps of the first block.",
    "charlm/attention_block4.png": "Character LM: attention maps of the last block.",
}


def verdict_markdown(exp, results: list[ClaimResult], flat: dict, dists: dict, envs: dict, table: list) -> list[str]:
    """The first screen: the verdict in one line (the words and counts `attnrepro check` uses:
    judge.claims.tally_lines, endpoints.summary_line), the chapter's headline figures against ours
    (report.first_screen), each conclusion not reproduced with its measured cause in a sentence
    (claims.yaml `causes:`; the metrics it rests on: the appendix), the compute."""
    c = counts(results)
    tally = tally_lines(c)
    judged = endpoints.judge(exp.primary, endpoints.reference_values(exp.primary, dists),
                             {e.metric: [v] for e in exp.primary if (v := endpoints.value(flat, e.metric)) is not None})
    e = endpoints.summary(judged)
    con = c["conclusion"]
    failed = [r for r in results if kind(r.claim) == "conclusion" and r.status in ("fail", "missing")]
    md = ["## Verdict\n",
          f"**The chapter {'reproduces' if not failed else 'partly reproduces'}:** {con['passed']} of the {con['n']} "
          "conclusions this machine can test hold" + (f", {len(failed)} do not (below, with their causes)" if failed
                                                      else "")
          + f"; **this run against the reference:** of {len(judged)} primary endpoints {e['SAME']} SAME, "
          f"{e['DIFFERENT']} DIFFERENT, {e['INCONCLUSIVE']} INCONCLUSIVE (one run cannot tell; `attnrepro check`).\n"]
    md += first_screen.markdown(table, (dists.get("train") or {}).get("runs", {}).__len__())
    md += ["```", *[tally[k] for k in ("conclusion", "finding", "checksum") if k in tally]]
    if judged:
        md.append(endpoints.summary_line(judged))
    md += [tally["value"]] if "value" in tally else []
    md += ["```\n"]
    own = [r for r in results if kind(r.claim) == "finding" and r.status == "fail"]
    own_text = ("; this project's own finding" + ("s" if len(own) > 1 else "") + " not holding, in its section: "
                + ", ".join(f"`{r.claim.id}`" for r in own)) if own else ""
    if failed:
        md.append("**Not reproduced, and why** (the metrics each cause rests on: [the appendix](APPENDIX.md#causes)"
                  f"{own_text})\n")
        for r in failed:
            cause = exp.causes.get(r.claim.id)
            why = f"Measured cause: {cause.says}." if cause else f"Ours: {_not_holding(r)}. No measured cause."
            md.append(f"- `{r.claim.id}` ({r.claim.text.split(':', 1)[0]}). {why}")
        md.append("")
    elif own:
        md.append(own_text[2].upper() + own_text[3:] + ".\n")
    spent = run_hours(envs, sorted(envs))
    md.append(f"**Compute spent:** {spent[1]:.1f} h of run wall time over {spent[0]} training runs (a run shared by two "
              "stages through the run store counts in both). " if spent else "**Compute spent:** not recorded. ")
    md[-1] += f"**Machine:** {machine_line(envs)}.\n"
    return md


def causes_markdown(exp, results: list[ClaimResult], flat: dict) -> list[str]:
    """The appendix's causes: each conclusion not reproduced, its cause and the values of the metrics it rests on."""
    rows = [[f"`{r.claim.id}`", exp.causes[r.claim.id].says,
             "; ".join(f"`{k}` = {fmt_number(flat[k])}" if k in flat else f"`{k}` missing"
                       for k in exp.causes[r.claim.id].metrics)]
            for r in results if r.claim.id in exp.causes and r.status in ("fail", "missing")]
    return ["## Causes\n", *md_table(["conclusion", "measured cause", "the metrics it rests on"], rows), ""] if rows else []


def run(cfg: ReportConfig, train, attention, out: str | Path) -> Report:
    """The `report` stage's report of metrics/ and plots/ (in the working folder) for the report folder
    `out` (figure links relative to it). train: params `train` (experiments.protocol.TrainConfig: the
    scaled/unscaled pairs of the loss figures); attention: params `attention` (audit.load.AttentionConfig):
    with an implementation other than the builtin, REPORT.md ends with its audit."""
    pairs = sorted(pairs_by_dhead(train).items())
    plots_href = Path(os.path.relpath(Path("plots").resolve(), Path(out).resolve())).as_posix()
    rep = build(Path(cfg.claims), Path("metrics"), Path("plots"), pairs, tuple(train.diag_steps), smooth=cfg.smooth,
                plots_href=plots_href)
    if attention.impl not in BUILTIN:  # the builtin's report stays as it was
        rep.markdown += "\n" + report_section(attention.impl)
        rep.html = markdown_to_html(rep.markdown, resolver(rep.figures, Path("plots"), plots_href))
    return rep
