"""`attnrepro check`: workspace metrics vs a git revision's, with tolerances, plus the claims.

`dvc metrics diff` reports changes but has no notion of tolerance. This module
compares every metric in metrics/*.json with the same key at a git revision
(default HEAD, read with `git show REV:metrics/<file>.json`) under the first
matching rule of check.yaml, evaluates claims.yaml, and says which gated items
fail.

Verdicts per metric:
  ok        within tolerance (or exactly equal)
  improved  beyond tolerance in the better direction (rules with `better:`); not a failure
  DRIFT     beyond tolerance; a failure when the rule is gated
  changed   beyond tolerance under an ungated rule (timings); reported only
  MISSING   in the reference but not in the workspace; a failure
  skipped   a GPU-only metric absent from a run made without CUDA
  new       in the workspace but not in the reference; reported only
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .claims import (Result, cuda_run, evaluate_all, flatten, fmt_number, load_claims, load_envs,
                     load_metrics_dir)
from .config import UserError, read_yaml_mapping

EXCLUDED_FILES = ("claims",)  # derived from the others; claims are evaluated directly


@dataclass
class Rule:
    match: list[str]
    exact: bool = False
    abs: float = 0.0
    rel: float = 0.0
    better: str | None = None      # higher | lower | None (two-sided)
    gate: bool = True
    reason: str = ""

    def tolerance(self, ref: float) -> float:
        return 0.0 if self.exact else max(self.abs, self.rel * abs(ref))

    def text(self) -> str:
        if self.exact:
            t = "exact"
        else:
            parts = ([f"±{fmt_number(self.abs)}"] if self.abs else []) + \
                    ([f"±{fmt_number(100 * self.rel)}%"] if self.rel else [])
            t = " or ".join(parts) or "±0"
        if self.better:
            t += f" ({self.better} is better)"
        if not self.gate:
            t += " (not gated)"
        return t


@dataclass
class CheckConfig:
    default: Rule
    rules: list[Rule] = field(default_factory=list)
    gpu_only: list[str] = field(default_factory=list)

    def rule_for(self, key: str) -> Rule:
        for r in self.rules:
            if any(fnmatch.fnmatchcase(key, p) for p in r.match):
                return r
        return self.default

    def is_gpu_only(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in self.gpu_only)


_RULE_KEYS = {"match", "exact", "abs", "rel", "better", "gate", "reason"}


def _rule(raw, where: str, default: bool = False) -> Rule:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise UserError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(_RULE_KEYS))})")
    match = raw.get("match", ["*"] if default else None)
    if isinstance(match, str):
        match = [match]
    if not isinstance(match, list) or not match or not all(isinstance(m, str) for m in match):
        raise UserError(f"{where}.match: expected a glob or a list of globs over <file>.<key>")
    for k in ("abs", "rel"):
        v = raw.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise UserError(f"{where}.{k}: got {v!r}, expected a number >= 0")
    for k in ("exact", "gate"):
        if k in raw and not isinstance(raw[k], bool):
            raise UserError(f"{where}.{k}: got {raw[k]!r}, expected true/false")
    if raw.get("better") not in (None, "higher", "lower"):
        raise UserError(f"{where}.better: got {raw['better']!r}, expected higher or lower")
    if not raw.get("exact") and "abs" not in raw and "rel" not in raw and raw.get("gate", True):
        raise UserError(f"{where}: give `exact: true`, `abs:`, `rel:` or `gate: false`")
    return Rule(match=match, exact=raw.get("exact", False), abs=float(raw.get("abs", 0.0)),
                rel=float(raw.get("rel", 0.0)), better=raw.get("better"), gate=raw.get("gate", True),
                reason=str(raw.get("reason", "")))


def load_check_config(path: str | Path = "check.yaml") -> CheckConfig:
    path = Path(path)
    data = read_yaml_mapping(path, "check config not found (see --config)", UserError)
    unknown = sorted(set(data) - {"default", "rules", "gpu_only"})
    if unknown:
        raise UserError(f"{path}: unknown top-level key {unknown[0]!r} (known: default, rules, gpu_only)")
    default = _rule(data.get("default", {"rel": 0.01}), f"{path}: default", default=True)
    rules = data.get("rules", []) or []
    if not isinstance(rules, list):
        raise UserError(f"{path}: rules: expected a list")
    gpu = data.get("gpu_only", []) or []
    if not isinstance(gpu, list) or not all(isinstance(g, str) for g in gpu):
        raise UserError(f"{path}: gpu_only: expected a list of globs")
    return CheckConfig(default, [_rule(r, f"{path}: rules[{i}]") for i, r in enumerate(rules)], gpu)


# ---------------------------------------------------------------- reading a revision

def git_metrics(rev: str, root: str | Path = ".", metrics_dir: str = "metrics") -> dict:
    """Flattened metrics/*.json as committed at `rev` ({} when the revision has none)."""
    def git(*args) -> str:
        p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise UserError(f"git {' '.join(args)}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else 'failed'}")
        return p.stdout

    try:
        git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except UserError:
        raise UserError(f"--rev: {rev!r} is not a commit in {Path(root).resolve()}") from None
    names = git("ls-tree", "--name-only", rev, f"{metrics_dir}/").split("\n")
    out: dict = {}
    for name in sorted(n for n in names if n.endswith(".json")):
        stem = Path(name).stem
        if stem in EXCLUDED_FILES:
            continue
        try:
            data = json.loads(git("show", f"{rev}:{name}"))
        except json.JSONDecodeError:
            raise UserError(f"{rev}:{name}: not valid JSON") from None
        out.update(flatten(data, f"{stem}."))
    return out


# ---------------------------------------------------------------- comparison

@dataclass
class Row:
    key: str
    ref: float | None
    cur: float | None
    rule: Rule
    verdict: str
    missing_ref: bool = False
    missing_cur: bool = False

    @property
    def failure(self) -> bool:
        return self.verdict == "MISSING" or (self.verdict == "DRIFT" and self.rule.gate)

    @property
    def path(self) -> str:
        return f"metrics/{self.key.split('.', 1)[0]}.json"

    @property
    def metric(self) -> str:
        return self.key.split(".", 1)[1]

    def change(self) -> str:
        if self.ref is None or self.cur is None or self.missing_ref or self.missing_cur:
            return "—"
        d = float(self.cur) - float(self.ref)
        return "0" if d == 0 else ("+" if d > 0 else "") + fmt_number(d)


def _verdict(key: str, ref, cur, rule: Rule) -> str:
    if ref is None or cur is None:  # nan in the metrics file
        return "ok" if ref is None and cur is None else ("DRIFT" if rule.gate else "changed")
    ref, cur = float(ref), float(cur)
    d = cur - ref
    if rule.exact:
        ok = d == 0
    else:
        ok = abs(d) <= rule.tolerance(ref) * (1 + 1e-12)
    if ok:
        return "ok"
    if rule.better == "lower" and d < 0 or rule.better == "higher" and d > 0:
        return "improved"
    return "DRIFT" if rule.gate else "changed"


def compare(ref: dict, cur: dict, cfg: CheckConfig, envs: dict) -> list[Row]:
    rows = []
    for key in sorted(set(ref) | set(cur)):
        rule = cfg.rule_for(key)
        if key not in cur:
            gpu_skip = cfg.is_gpu_only(key) and cuda_run(key.split(".", 1)[0], envs) is not True
            rows.append(Row(key, ref[key], None, rule, "skipped" if gpu_skip else "MISSING", missing_cur=True))
        elif key not in ref:
            rows.append(Row(key, None, cur[key], rule, "new", missing_ref=True))
        else:
            rows.append(Row(key, ref[key], cur[key], rule, _verdict(key, ref[key], cur[key], rule)))
    return rows


# ---------------------------------------------------------------- output

def _cell(row: Row, which: str) -> str:
    if (which == "ref" and row.missing_ref) or (which == "cur" and row.missing_cur):
        return "—"
    v = row.ref if which == "ref" else row.cur
    return "nan" if v is None else fmt_number(v)


def whole_files(rows: list[Row], verdict: str) -> dict[str, int]:
    """Files whose every metric has `verdict` (a file new in, or absent from, the workspace)."""
    by_file: dict[str, list[Row]] = {}
    for r in rows:
        by_file.setdefault(r.path, []).append(r)
    return {f: len(rs) for f, rs in by_file.items() if all(r.verdict == verdict for r in rs)}


def metrics_table(rows: list[Row], rev: str, show_all: bool) -> str:
    new_files = {} if show_all else whole_files(rows, "new")
    shown = [r for r in rows if r.path not in new_files
             and (show_all or r.verdict != "ok" or r.change() not in ("0", "—"))]
    if not shown and not new_files:
        return f"No metric differs from {rev} ({len(rows)} compared).\n"
    out = [f"| Path | Metric | {rev} | workspace | Change | Tolerance | Verdict |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for f, n in sorted(new_files.items()):
        out.append(f"| {f} | ({n} metrics) | — | file not in {rev} | — | — | new |")
    for r in shown:
        out.append(f"| {r.path} | {r.metric} | {_cell(r, 'ref')} | {_cell(r, 'cur')} | {r.change()} | "
                   f"{r.rule.text()} | {r.verdict} |")
    return "\n".join(out) + "\n"


def claim_verdict(r: Result) -> str:
    if r.status == "pass":
        return "pass"
    if r.status == "skipped":
        return "skipped"
    return ("FAIL" if r.claim.gate else "off") + (" (missing)" if r.status == "missing" else "")


def claims_table(results: list[Result], show_all: bool) -> str:
    shown = [r for r in results if show_all or r.claim.gate or r.status != "pass"]
    out = ["| Claim | Kind | Published | Reproduced | Tolerance | Gate | Verdict |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in shown:
        c = r.claim
        if c.kind == "value":
            pub, tol = fmt_number(c.published), c.tolerance_text()
        else:
            pub, tol = f"`{' '.join(c.expr.split())}`", ""
        val = fmt_number(r.value) if r.value is not None else ("—" if r.status != "pass" else "true")
        out.append(f"| {c.id} | {c.kind} | {pub} | {val} | {tol} | {'yes' if c.gate else 'no'} | "
                   f"{claim_verdict(r)} |")
    return "\n".join(out) + "\n"


@dataclass
class Outcome:
    rows: list[Row]
    results: list[Result]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def run_check(rev: str = "HEAD", root: str | Path = ".", metrics_dir: str = "metrics",
              claims_path: str | Path | None = "claims.yaml", config_path: str | Path = "check.yaml") -> Outcome:
    root = Path(root)
    cfg = load_check_config(root / config_path)
    cur = load_metrics_dir(root / metrics_dir, exclude=EXCLUDED_FILES)
    envs = load_envs(root / metrics_dir / "env")
    ref = git_metrics(rev, root, metrics_dir)
    rows = compare(ref, cur, cfg, envs)
    results = evaluate_all(load_claims(root / claims_path), cur, envs) if claims_path else []
    problems = []
    gone = whole_files(rows, "MISSING")
    problems += [f"{f} is in {rev} ({n} metrics) but missing from the workspace" for f, n in sorted(gone.items())]
    for r in rows:
        if r.path in gone:
            continue
        if r.failure and r.verdict == "MISSING":
            problems.append(f"metric {r.key} is in {rev} but missing from the workspace")
        elif r.failure:
            problems.append(f"metric {r.key} drifted {r.change()} (tolerance {r.rule.text()}): "
                            f"{_cell(r, 'ref')} -> {_cell(r, 'cur')}")
    for res in results:
        if res.gated_failure:
            why = res.detail or (f"{fmt_number(res.value)} vs {fmt_number(res.claim.published)} "
                                 f"{res.claim.tolerance_text()}" if res.claim.kind == "value"
                                 else f"`{' '.join(res.claim.expr.split())}` is false")
            problems.append(f"claim {res.claim.id} failed: {why}")
    return Outcome(rows, results, problems)


def render(outcome: Outcome, rev: str, show_all: bool = False) -> str:
    parts = [f"## Metrics: workspace vs {rev}\n\n", metrics_table(outcome.rows, rev, show_all)]
    if outcome.results:
        t = {s: sum(r.status == s for r in outcome.results) for s in ("pass", "fail", "missing", "skipped")}
        parts += [f"\n## Claims ({t['pass']} passed, {t['fail'] + t['missing']} failed, {t['skipped']} skipped "
                  f"of {len(outcome.results)}; {'all' if show_all else 'gated and failing'} shown)\n\n",
                  claims_table(outcome.results, show_all)]
    skipped = sum(r.verdict == "skipped" for r in outcome.rows)
    ungated = sum(not r.rule.gate for r in outcome.rows)
    notes = []
    if skipped:
        notes.append(f"{skipped} GPU-only metric(s) skipped: this run had no CUDA.")
    if ungated:
        notes.append(f"{ungated} timing metric(s) are machine-dependent and not gated against {rev}.")
    if notes:
        parts.append("\n" + "\n".join(notes) + "\n")
    if outcome.ok:
        parts.append(f"\ncheck: OK ({len(outcome.rows)} metrics, {len(outcome.results)} claims)\n")
    else:
        parts.append(f"\ncheck: FAILED, {len(outcome.problems)} gated problem(s):\n"
                     + "".join(f"- {p}\n" for p in outcome.problems))
    return "".join(parts)
