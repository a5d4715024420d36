"""`attnrepro check`: does this run reproduce the committed reference run?

The reference is what a git revision holds (default HEAD): metrics/*.json, the seed
distributions metrics/dist/*.json, the machine records metrics/env/*.json and
params.yaml. Each stage's metrics file gets one of two verdicts:

  exact        this run was made on the reference's kind of machine (same CPU model, torch,
               Python, thread count, device) with the same params: every metric must be
               identical (timings aside), as reruns on one machine are byte-identical.
  statistical  otherwise (another CPU changes the float order; other params): a metric with
               a seed distribution must fall in its prediction interval for one new run at
               alpha = 0.05 family-wise (Bonferroni over the headline metrics, and again over
               the others; `families`), on the log scale for attention statistics
               (attnrepro.stats); where this run has a distribution of its own (the seeds
               rerun), it must also pass Welch's t-test against the reference's seeds, as
               MLPerf judges convergence; a metric without a distribution stays within its
               drift tolerance in claims.yaml.

Then the claims of claims.yaml: every conclusion and every checksum must hold,
recomputed from the raw metrics (values are reported, never gated). The first line of
the output is the verdict.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from .claims import (Expectations, ClaimResult, Tol, band, counts, evaluate_all, load, load_dists, load_envs,
                     load_metrics_dir, METRIC_FILES_EXCLUDED, cuda_run)
from .config import UserError, read_params
from .expr import fmt_number
from .stats import ALPHA, Band, flatten

# what decides whether a rerun must be byte-identical: the machine's float order and the software
MACHINE_KEYS = ("cpu", "cpu_capability", "torch", "python", "torch_threads", "device", "cuda_available", "cuda_version",
                "cudnn_version", "gpu_name", "runs_on")


# ---------------------------------------------------------------- the reference, from git

class Revision:
    """Files as committed at a git revision."""

    def __init__(self, rev: str, root: Path):
        self.rev, self.root = rev, root
        try:
            self._git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        except UserError:
            raise UserError(f"--rev: {rev!r} is not a commit in {root.resolve()}") from None

    def _git(self, *args) -> str:
        p = subprocess.run(["git", "-C", str(self.root), *args], capture_output=True)
        if p.returncode != 0:
            err = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise UserError(f"git {' '.join(args)}: {err[-1] if err else 'failed'}")
        return p.stdout.decode("utf-8", "replace")

    def files(self, folder: str) -> list[str]:
        return sorted(n for n in self._git("ls-tree", "--name-only", self.rev, f"{folder}/").split("\n")
                      if n.endswith(".json"))

    def json(self, path: str):
        try:
            return json.loads(self._git("show", f"{self.rev}:{path}"))
        except json.JSONDecodeError:
            raise UserError(f"{self.rev}:{path}: not valid JSON") from None

    def yaml(self, path: str) -> dict:
        try:
            return yaml.safe_load(self._git("show", f"{self.rev}:{path}")) or {}
        except UserError:
            return {}


@dataclass
class Reference:
    metrics: dict  # flat <file>.<key> -> number
    dists: dict  # file -> {"stats", "runs"}
    envs: dict  # file -> machine record
    params: dict


def reference(rev: str, root: Path, metrics_dir: str) -> Reference:
    r = Revision(rev, root)
    metrics, dists, envs = {}, {}, {}
    for name in r.files(metrics_dir):
        stem = Path(name).stem
        if stem not in METRIC_FILES_EXCLUDED:
            metrics.update(flatten(r.json(name), f"{stem}."))
    for name in r.files(f"{metrics_dir}/dist"):
        dists[Path(name).stem] = r.json(name)
    for name in r.files(f"{metrics_dir}/env"):
        envs[Path(name).stem] = r.json(name)
    return Reference(metrics, dists, envs, r.yaml("params.yaml"))


def _resolve(text: str, params: dict) -> str:
    """dvc.yaml templating: ${a.b} from params (left as is when params lack it)."""
    def look(m):
        v = params
        for k in m.group(1).split("."):
            v = v.get(k) if isinstance(v, dict) else None
        return m.group(0) if v is None or isinstance(v, (dict, list)) else str(v)
    return re.sub(r"\$\{([^}]+)\}", look, text)


def stage_params(root: Path, params: dict) -> dict[str, set[str]]:
    """{metrics file: the params sections its stage and the stages upstream of it read} (dvc.yaml)."""
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages", {})
    except (OSError, yaml.YAMLError):
        return {}
    own, outs, deps = {}, {}, {}
    for name, st in stages.items():
        st = st.get("do", st)
        own[name] = {str(p if isinstance(p, str) else next(iter(p))).split(".")[0] for p in st.get("params", [])}
        outs[name] = [str(o if isinstance(o, str) else next(iter(o)))
                      for k in ("outs", "metrics", "plots") for o in st.get(k, [])]
        deps[name] = [_resolve(str(d if isinstance(d, str) else next(iter(d))), params) for d in st.get("deps", [])]

    def upstream(name, seen):
        for other, paths in outs.items():
            if other not in seen and any(d == p or d.startswith(p + "/") for d in deps[name] for p in paths):
                seen.add(other)
                upstream(other, seen)
        return seen

    out: dict[str, set[str]] = {}
    for name in stages:
        sections = set().union(*(own[s] for s in upstream(name, {name})))
        for p in outs[name]:
            if p.startswith("metrics/") and p.endswith(".json") and p.count("/") == 1:
                out[Path(p).stem] = sections
    return out


# ---------------------------------------------------------------- verdicts per metric

@dataclass
class Row:
    key: str
    ref: Optional[float]
    cur: Optional[float]
    how: str  # exact | band | band+welch | the drift tolerance's text | not gated
    verdict: str  # ok | OUTSIDE | DRIFT | MISSING | new | skipped | info
    band: Optional[Band] = None
    alpha: float = ALPHA  # the per-metric alpha of the band (family-wise ALPHA, Bonferroni)
    p: Optional[float] = None  # Welch's p-value, when this run has seeds of its own

    @property
    def failure(self) -> bool:
        return self.verdict in ("OUTSIDE", "DRIFT", "MISSING")

    @property
    def file(self) -> str:
        return self.key.split(".", 1)[0]

    def band_text(self) -> str:
        if self.band is None:
            return "—"
        lo, hi = self.band.prediction_interval(self.alpha)
        return f"{lo:.4g} – {hi:.4g} (n={self.band.n})"


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def machine(env: Optional[dict]) -> dict:
    return {k: (env or {}).get(k) for k in MACHINE_KEYS}


def families(keys, ref: "Reference", headline: list[str]) -> dict[str, float]:
    """The per-metric alpha of every banded metric: ALPHA family-wise (Bonferroni) over the headline
    metrics, and again over all the other banded metrics. Measured here: a faithful rerun on another
    CPU moved single metrics up to 4 seed sd (Intel -> AMD, same seed), so an uncorrected per-metric
    interval would fail faithful reruns by chance."""
    banded = [k for k in keys if band(ref.dists, k) is not None]
    head = [k for k in banded if k in headline]
    rest = [k for k in banded if k not in headline]
    return {**{k: ALPHA / len(head) for k in head}, **{k: ALPHA / len(rest) for k in rest}}


def compare(cur: dict, ref: Reference, cur_dists: dict, exp: Expectations, modes: dict[str, str],
            envs: dict) -> list[Row]:
    rows = []
    keys = sorted(set(ref.metrics) | set(cur))
    alphas = families([k for k in keys if k in cur and k in ref.metrics and not exp.is_timing(k)], ref, exp.headline)
    for key in keys:
        file = key.split(".", 1)[0]
        if exp.is_timing(key):
            rows.append(Row(key, ref.metrics.get(key), cur.get(key), "timing, not gated", "info"))
            continue
        if key not in cur:
            skip = exp.is_gpu_only(key) and cuda_run(file, envs) is not True
            rows.append(Row(key, ref.metrics[key], None, "—", "skipped" if skip else "MISSING"))
            continue
        if key not in ref.metrics:
            rows.append(Row(key, None, cur[key], "—", "new"))
            continue
        r, c = ref.metrics[key], cur[key]
        b, alpha = band(ref.dists, key), alphas.get(key, ALPHA)
        if modes.get(file) == "exact":
            rows.append(Row(key, r, c, "exact", "ok" if _same(r, c) else "DRIFT", b, alpha))
            continue
        rule = exp.drift_rule(key)
        if b is not None and b.sd == 0:  # the same on every seed (a count, a row sum): its drift rule, or exact,
            b = None  # against the full-precision value (the stored summary keeps 6 significant digits, too few for a 7-digit count)
        if b is not None:
            ok = b.contains(c, alpha)
            mine = band(cur_dists, key)
            if mine is not None and cur_dists.get(file) != ref.dists.get(file):  # this run has seeds of its own
                p = b.welch(mine)
                rows.append(Row(key, r, c, "band+welch", "ok" if ok and p >= alpha else "OUTSIDE", b, alpha, p))
            else:
                rows.append(Row(key, r, c, "band", "ok" if ok else "OUTSIDE", b, alpha))
        elif rule is not None and rule.tol.kind == "info":
            rows.append(Row(key, r, c, "not gated", "info"))
        else:
            tol = rule.tol if rule is not None else Tol("exact")
            rows.append(Row(key, r, c, tol.text(), "ok" if tol.ok(c, r) else "DRIFT"))
    for file in sorted({k.split(".", 1)[0] for k in keys}):
        if modes.get(file) == "exact" and file in ref.dists and cur_dists.get(file) != ref.dists[file]:
            rows.append(Row(f"dist/{file}", None, None, "exact", "DRIFT"))
    return rows


# ---------------------------------------------------------------- the check

@dataclass
class Outcome:
    rows: list[Row]
    results: list[ClaimResult]
    modes: dict[str, str]  # metrics file -> exact | statistical
    why: dict[str, str]  # metrics file -> why statistical
    headline: list[str]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_check(rev: str = "HEAD", root: str | Path = ".", metrics_dir: str = "metrics",
              claims_path: str | Path = "claims.yaml", mode: str = "auto") -> Outcome:
    root = Path(root)
    exp = load(root / claims_path)
    cur = load_metrics_dir(root / metrics_dir)
    cur_dists = load_dists(root / metrics_dir / "dist")
    envs = load_envs(root / metrics_dir / "env")
    ref = reference(rev, root, metrics_dir)
    params = read_params(root / "params.yaml")
    sections = stage_params(root, params)

    modes, why = {}, {}
    for file in sorted({k.split(".", 1)[0] for k in set(cur) | set(ref.metrics)}):
        reasons = []
        if mode == "statistical":
            reasons.append("asked for (--mode statistical)")
        elif mode == "auto":
            if machine(envs.get(file)) != machine(ref.envs.get(file)):
                diff = [k for k in MACHINE_KEYS if machine(envs.get(file))[k] != machine(ref.envs.get(file))[k]]
                reasons.append("another machine (" + ", ".join(
                    f"{k}: {machine(ref.envs.get(file))[k]} -> {machine(envs.get(file))[k]}" for k in diff) + ")")
            changed = sorted(s for s in sections.get(file, {file}) if params.get(s) != ref.params.get(s))
            if changed:
                reasons.append("other params (" + ", ".join(changed) + ")")
        modes[file] = "statistical" if reasons else "exact"
        if reasons:
            why[file] = "; ".join(reasons)

    rows = compare(cur, ref, cur_dists, exp, modes, envs)
    results = evaluate_all(exp, cur, cur_dists, envs)
    out = Outcome(rows, results, modes, why, exp.headline)
    for r in rows:
        if r.verdict == "MISSING":
            out.problems.append(f"metric {r.key} is in {rev} but missing from this run")
        elif r.verdict == "OUTSIDE" and r.p is not None and r.p < r.alpha:
            out.problems.append(f"metric {r.key}: this run's seeds differ from the reference's (Welch p = {r.p:.3g}, "
                                f"alpha {r.alpha:.2g})")
        elif r.verdict == "OUTSIDE":
            out.problems.append(f"metric {r.key} = {fmt_number(r.cur)} is outside the reference band {r.band_text()}")
        elif r.verdict == "DRIFT" and r.key.startswith("dist/"):
            out.problems.append(f"metrics/{r.key}.json (the seed distribution) differs from {rev}'s")
        elif r.verdict == "DRIFT":
            out.problems.append(f"metric {r.key} = {fmt_number(r.cur)} drifted from {fmt_number(r.ref)} ({r.how})")
    for res in results:
        if res.gated_failure:
            c = res.claim
            detail = res.detail or (f"{fmt_number(res.value)} vs published {fmt_number(c.published)} ({c.tol.text()})"
                                    if c.is_cell else "is false")
            out.problems.append(f"{c.cls} {c.id} fails: {c.text} — {detail}")
    return out


def _cell(x) -> str:
    return "—" if x is None else fmt_number(x)


def render(o: Outcome, rev: str, show_all: bool = False) -> str:
    c = counts(o.results)
    gated = [r for r in o.rows if r.verdict not in ("info", "new", "skipped")]
    exact = sorted(f for f, m in o.modes.items() if m == "exact")
    stat = sorted(f for f, m in o.modes.items() if m == "statistical")
    lines = [f"check: {'PASS' if o.ok else 'FAIL'} — this run "
             + ("reproduces" if o.ok else "does not reproduce") + f" the reference ({rev})"
             + ("" if o.ok else f": {len(o.problems)} problem(s), listed below"), ""]
    lines.append(f"  conclusions {c['conclusion']['passed']} of {c['conclusion']['n'] - c['conclusion']['skipped']} hold"
                 f" (each on this run, and on every reference seed and the seed mean where a stage has seeds)"
                 + (f", {c['conclusion']['skipped']} skipped (need a GPU)" if c['conclusion']['skipped'] else ""))
    lines.append(f"  checksums   {c['checksum']['passed']} of {c['checksum']['n'] - c['checksum']['skipped']} hold")
    lines.append(f"  metrics     {sum(not r.failure for r in gated)} of {len(gated)} within their reference "
                 f"({sum(r.how.startswith('band') for r in gated)} against a seed band, "
                 f"{sum(r.how == 'exact' for r in gated)} exact); "
                 f"{sum(r.how == 'timing, not gated' for r in o.rows)} timings and "
                 f"{sum(r.how == 'not gated' for r in o.rows)} informational metrics not gated")
    lines.append(f"  published   {c['value']['passed']} of {c['value']['n'] - c['value']['skipped']} published values "
                 f"inside our band or tolerance; of the others {c['value']['unexplained']} unexplained (informational)")
    if exact:
        lines.append(f"  exact verdict (same machine and params as the reference): {', '.join(exact)}")
    reasons: dict[str, list[str]] = {}
    for f in stat:
        reasons.setdefault(o.why.get(f, ""), []).append(f)
    for why, files in reasons.items():
        lines.append(f"  statistical verdict ({why}): {', '.join(files)}")
    if stat:
        lines.append(f"    (prediction interval of one run, alpha = {ALPHA} family-wise: Bonferroni over the headline "
                     "metrics and again over the others)")
    if o.problems:
        lines += ["", "problems:"] + [f"- {p}" for p in o.problems]
    by_key = {r.key: r for r in o.rows}
    head = [by_key[k] for k in o.headline if k in by_key]
    if head:
        lines += ["", f"headline metrics (reference band: the prediction interval of one run over the reference seeds, "
                  f"alpha = {ALPHA} over the headline family)", "",
                  "| metric | this run | reference run | reference band | verdict |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r.key} | {_cell(r.cur)} | {_cell(r.ref)} | {r.band_text()} | {r.verdict} ({r.how}) |" for r in head]
    shown = [r for r in o.rows if show_all or (r.failure and r.key not in o.headline)]
    if shown:
        lines += ["", "all metrics" if show_all else "other metrics that failed", "",
                  "| metric | this run | reference run | reference band | how | verdict |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r.key} | {_cell(r.cur)} | {_cell(r.ref)} | {r.band_text()} | {r.how} | {r.verdict} |"
                  for r in shown]
    claims = [r for r in o.results if show_all or r.gated_failure]
    if claims:
        lines += ["", "claims" if show_all else "claims that failed", "",
                  "| claim | class | result | detail |", "| --- | --- | --- | --- |"]
        for r in claims:
            detail = r.detail or (f"{_cell(r.value)} vs {_cell(r.claim.published)}" if r.claim.is_cell else "")
            if r.seeds_n:
                detail = (detail + "; " if detail else "") + f"{r.seeds_held}/{r.seeds_n} seeds, mean {'holds' if r.mean_holds else 'fails'}"
            lines.append(f"| {r.claim.id} | {r.claim.cls} | {r.status} | {detail} |")
    if not show_all:
        lines += ["", "(`attnrepro check --all` lists every metric and claim, timings included)"]
    return "\n".join(lines) + "\n"
