"""The expectations: claims.yaml (what the chapter publishes, and the tolerances: data) and
judge/conclusions.py (what it concludes, and this repository's checksums: Python predicates), in one
list of claims with one tolerance grammar, evaluated on a run. The format and the rules of
evaluation: docs/CLAIMS.md; how the verdict uses them: docs/VERDICT.md.
"""

from __future__ import annotations

import ast
import fnmatch
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Callable, Mapping, Optional

import yaml

from attnrepro.config import UserError
from attnrepro.experiments.sensitivity import BASELINE, ROW_KEYS, accounts_for
from attnrepro.files import parse_yaml, read_json, read_yaml_mapping
from attnrepro.formatting import fmt_number
from attnrepro.judge.endpoints import Endpoint, EndpointError, parse_primary, parts, seed_values
from attnrepro.measure.head_matching import least_cost_pairs
from attnrepro.provenance.lock import same
from attnrepro.stats import Band, fieller_ratio, flatten, from_summary, percentile_of, share_interval

CLASSES = ("conclusion", "checksum", "value")
# `requires`: the kind of device a claim means something on (its files made elsewhere: skipped, named)
REQUIRES = {None: "", "cuda": "CUDA", "cpu": "CPU"}
ID_RE = re.compile(r"^[a-z0-9_]+$")
KEY_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$")  # a metric key: <file>.<key path>
CONCLUSIONS = "src/attnrepro/judge/conclusions.py"  # the predicates, relative to the directory of claims.yaml
EPS = {"eps16": 2.0 ** -10, "epsbf16": 2.0 ** -7, "eps32": 2.0 ** -23, "eps64": 2.0 ** -52}


class ClaimError(UserError):
    """A malformed claims file; the message names the place."""


class MissingMetric(Exception):
    """A claim read a metric (or a glob matching none) that is not in the metrics."""
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


class View:
    """The metrics as a predicate sees them: m["<file>.<key>"] a float (None reads nan),
    m.all("<glob>") the floats of the matching keys, sorted by key (fnmatch); MissingMetric for
    a key or glob that finds nothing. Every key read (or glob that found nothing) is recorded,
    in order, in `read`."""
    def __init__(self, metrics: Mapping[str, float]):
        self._metrics = metrics
        self.read: dict[str, None] = {}  # an ordered set

    def __getitem__(self, key: str) -> float:
        self.read[key] = None
        if key not in self._metrics:
            raise MissingMetric(key)
        v = self._metrics[key]
        return math.nan if v is None else float(v)

    def all(self, pattern: str) -> list[float]:
        keys = sorted(k for k in self._metrics if fnmatch.fnmatchcase(k, pattern))
        if not keys:
            self.read[pattern] = None
            raise MissingMetric(pattern)
        return [self[k] for k in keys]

    def files(self) -> set[str]:
        return {k.split(".", 1)[0] for k in self.read}


# ---------------------------------------------------------------- the tolerance grammar

@dataclass(frozen=True)
class Tol:
    kind: str  # exact | abs | rel | factor | eps | info
    amount: float = 0.0

    @classmethod
    def parse(cls, text, where: str = "tol") -> "Tol":
        s = str(text).strip().replace("+-", "±").replace(" ", "")
        try:
            if s in ("exact", "info"):
                return cls(s)
            if s.startswith("±") and s.endswith("%"):
                return cls("rel", float(s[1:-1]) / 100)
            if s.startswith("±"):
                return cls("abs", float(s[1:]))
            if s.startswith(("×", "x")):
                v = float(s[1:])
                if v >= 1:
                    return cls("factor", v)
            if s.startswith("<="):
                for name, eps in EPS.items():
                    if s.endswith(name):
                        return cls("eps", float(s[2:-len(name)]) * eps)
        except ValueError:
            pass
        raise ClaimError(f"{where}: {text!r} is not a tolerance (exact | ±x | ±x% | ×x | <= N eps32 | "
                         "<= N eps64 | info)")

    def ok(self, value: Optional[float], reference: Optional[float]) -> bool:
        if self.kind == "info":
            return True
        if value is None or not math.isfinite(value):
            return self.kind == "exact" and reference is not None and same(value, reference)
        if self.kind == "eps":
            return abs(value) <= self.amount
        if reference is None or not math.isfinite(reference):
            return False
        d = abs(value - reference)
        if self.kind == "exact":
            return d == 0
        if self.kind == "abs":
            return d <= self.amount * (1 + 1e-12) + 1e-15
        if self.kind == "rel":
            return d <= self.amount * abs(reference) * (1 + 1e-12) + 1e-15
        return value * reference > 0 and abs(math.log(value / reference)) <= math.log(self.amount) + 1e-12

    def text(self) -> str:
        a = fmt_number(self.amount)
        return {"exact": "exact", "info": "not gated", "abs": f"±{a}", "rel": f"±{fmt_number(100 * self.amount)}%",
                "factor": f"×{a}", "eps": f"≤ {a}"}[self.kind]


# ---------------------------------------------------------------- claims

@dataclass
class Claim:
    id: str  # <experiment>.<entry id>[.<row>].<col>
    experiment: str
    cls: str  # conclusion | checksum | value
    text: str
    metric: str = ""  # table cells: the metric key
    predicate: Optional[Callable] = None  # predicates (conclusions.py): the function of a View
    source: str = ""  # predicates: the function's body as written (its returned expression alone)
    code: str = ""  # predicates: what it computes (ast of its body and the module's shared code), to compare revisions
    sides: Optional[Callable] = None  # predicates that return one comparison a OP b: View -> (a, b)
    published: Optional[float] = None  # table cells: the source's figure
    published_half: float = 0.0  # half a unit of its last printed digit (0: exact)
    tol: Optional[Tol] = None
    requires: Optional[str] = None
    note: str = ""
    evidence: tuple[str, ...] = ()
    evidence_note: str = ""
    moved_by: tuple[str, ...] = ()  # sensitivity rows that must account for its deviation (accounts_for)
    fieller: Optional[tuple[str, str]] = None  # a ratio of means: the metrics over seeds of its numerator, denominator
    match: Optional["Match"] = None  # a matched table's cell: its row is matched with one of ours
    row: str = ""  # table cells: the published row and column
    col: str = ""
    own: bool = False  # a conclusion that is this project's finding, not the chapter's (@claim(..., own=True))
    was: Optional[Callable] = None  # predicates: the predicate this one replaced (@claim(..., was=, why=))
    why: str = ""  # ... and why it was replaced

    @property
    def gate(self) -> bool:
        return self.cls != "value"

    @property
    def is_cell(self) -> bool:
        return self.published is not None


@dataclass(eq=False)
class Match:
    """A table whose rows are matched with ours one-to-one within groups (the table key `match`)."""
    template: str
    columns: list[str]
    rows: dict[str, list[Optional[float]]]  # published row -> one number per column (None: not published)
    groups: list[list[str]]
    scale: list[float]  # per column: the sd of the published column

    def key(self, row: str, col: str) -> str:
        return self.template.replace("{row}", row).replace("{col}", col)

    def assign(self, row: str, metrics: Mapping[str, float]) -> str:
        """Our row matched with the published `row`: the least-cost assignment within its group
        (MissingMetric if a statistic of the group is missing)."""
        group = next(g for g in self.groups if row in g)
        m = View(metrics)
        ours = [[m[self.key(r, c)] for c in self.columns] for r in group]
        pairs = dict(least_cost_pairs([self.rows[p] for p in group], ours, self.scale))
        return group[pairs[group.index(row)]]


@dataclass
class DriftRule:
    glob: str
    tol: Tol
    why: str


@dataclass
class Expectations:
    claims: list[Claim]
    drift: list[DriftRule]
    gpu_only: list[str]
    timings: list[str]  # metrics that depend on the machine's speed and load: reported, never compared
    sections: dict[str, str]  # experiment -> section title
    primary: list[Endpoint] = field(default_factory=list)
    causes: dict[str, "Cause"] = field(default_factory=dict)  # conclusion id -> its measured cause (`causes:`)

    @property
    def headline(self) -> list[str]:
        """The metrics the primary endpoints read (a contrast's two), in order."""
        return list(dict.fromkeys(k for e in self.primary for k in parts(e.metric)))

    def drift_rule(self, key: str) -> Optional[DriftRule]:
        return next((r for r in self.drift if fnmatch.fnmatchcase(key, r.glob)), None)

    def is_gpu_only(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, g) for g in self.gpu_only)

    def is_timing(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, g) for g in self.timings)


class _PrintedLoader(yaml.SafeLoader):
    """YAML whose numbers remember half a unit of their last printed digit (`half`)."""


for _tag, _cls in (("float", type("_Float", (float,), {})), ("int", type("_Int", (int,), {}))):
    def _constructor(loader, node, cls=_cls, construct=getattr(yaml.SafeLoader, f"construct_yaml_{_tag}")):
        x = cls(construct(loader, node))
        x.half = _half(node.value)
        return x
    _PrintedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _constructor)


def _half(text: str) -> float:
    """Half a unit of the last digit of a number as printed: "1.20" 0.005, "42" 0.5, "3.4e38" 0.5e37
    (0 for a form without one, e.g. .inf or 0x1f)."""
    try:
        d = Decimal(text.replace("_", ""))
    except InvalidOperation:
        return 0.0
    # 5 * 10^(e - 1), computed in Decimal: no OverflowError for a huge exponent
    return float(Decimal(5).scaleb(d.as_tuple().exponent - 1)) if d.is_finite() else 0.0


def load(path: str | Path = "claims.yaml", conclusions: str | Path | None = None, name: str = "",
         text: Optional[str] = None) -> Expectations:
    """Read and validate the expectations: claims.yaml at `path` (or its `text`, which `path` names) and the
    predicates, `conclusions` (their source text, which `name` names in errors, or a path; by default
    CONCLUSIONS beside claims.yaml, where it exists). Every problem is one line naming the place."""
    path = Path(path)
    if text is None:
        read_yaml_mapping(path, "claims file not found", ClaimError)  # a missing or malformed file: one line
        text = path.read_text(encoding="utf-8")
    parse_yaml(text, str(path), ClaimError)
    data = yaml.load(text, Loader=_PrintedLoader) or {}
    unknown = sorted(set(data) - {"gpu_only", "timings", "primary", "causes", "experiments"})
    if unknown:
        raise ClaimError(f"{path}: unknown top-level key {unknown[0]!r} (known: experiments, gpu_only, timings, "
                         "primary, causes)")
    exps = data.get("experiments")
    if not isinstance(exps, dict) or not exps:
        raise ClaimError(f"{path}: expected `experiments:`, a mapping of metrics file -> expectations")
    if conclusions is None and (path.parent / CONCLUSIONS).is_file():
        conclusions = path.parent / CONCLUSIONS
    if isinstance(conclusions, Path):
        name, conclusions = str(conclusions), conclusions.read_text(encoding="utf-8")
    tables, drift, sections = [], [], {}
    for exp, body in exps.items():
        where = f"{path}: experiments.{exp}"
        if not isinstance(body, dict):
            raise ClaimError(f"{where}: expected a mapping")
        bad = sorted(set(body) - {"section", "checksums", "values", "drift"})
        if bad:
            raise ClaimError(f"{where}.{bad[0]}: unknown key (known: section, checksums, values, drift; conclusions "
                             f"are predicates in {CONCLUSIONS})")
        sections[exp] = _text(body.get("section"), f"{where}.section")
        for cls, key in (("checksum", "checksums"), ("value", "values")):
            for i, entry in enumerate(body.get(key) or []):
                tables += _entry(entry, cls, exp, f"{where}.{key}[{i}]")
        for i, rule in enumerate(body.get("drift") or []):
            if not (isinstance(rule, list) and len(rule) == 3 and isinstance(rule[0], str)):
                raise ClaimError(f"{where}.drift[{i}]: expected [glob, tolerance, why]")
            drift.append(DriftRule(rule[0], Tol.parse(rule[1], f"{where}.drift[{i}]"),
                                   _text(rule[2], f"{where}.drift[{i}] why")))
    preds = predicates(conclusions, name or CONCLUSIONS, sections) if conclusions else []
    order = {(e, c): i for i, (e, c) in enumerate((e, c) for e in sections for c in CLASSES)}
    claims = sorted(tables + preds, key=lambda c: (order[c.experiment, c.cls], c.predicate is not None))
    seen = set()
    for c in claims:
        if c.id in seen:
            raise ClaimError(f"{path}: claim {c.id} appears twice")
        seen.add(c.id)
    lists = {k: data.get(k) or [] for k in ("gpu_only", "timings")}
    for what, val in lists.items():
        if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
            raise ClaimError(f"{path}: {what}: expected a list of metric keys (globs)")
    try:
        primary = parse_primary(data["primary"], f"{path}: primary") if "primary" in data else []
    except EndpointError as e:
        raise ClaimError(str(e)) from None
    known = {c.id for c in preds if c.cls == "conclusion"} if preds else None  # None: read without the predicates
    causes = parse_causes(data.get("causes") or {}, known, f"{path}: causes")
    return Expectations(claims, drift, lists["gpu_only"], lists["timings"], sections, primary, causes)


CAUSE_WORDS = 40


@dataclass(frozen=True)
class Cause:
    """`causes:` in claims.yaml: why a conclusion does not reproduce here, as measured: a sentence and the
    metrics it rests on (the report prints their values beside it)."""
    says: str
    metrics: tuple[str, ...]

    def text(self, metrics: Mapping[str, float]) -> str:
        shown = "; ".join(f"{k} = {metrics[k]:.3g}" if k in metrics else f"{k} missing" for k in self.metrics)
        return f"{self.says} ({shown})" if shown else self.says


def parse_causes(entries, conclusions: Optional[set[str]], where: str) -> dict[str, Cause]:
    if not isinstance(entries, dict):
        raise ClaimError(f"{where}: expected a mapping of conclusion id -> {{says, metrics}}")
    out = {}
    for cid, e in entries.items():
        if conclusions is not None and cid not in conclusions:
            raise ClaimError(f"{where}.{cid}: not a conclusion of claims.yaml")
        if not (isinstance(e, dict) and set(e) == {"says", "metrics"} and isinstance(e["says"], str)
                and isinstance(e["metrics"], list) and all(isinstance(m, str) for m in e["metrics"])):
            raise ClaimError(f"{where}.{cid}: expected {{says: <sentence>, metrics: [<metric key>, ...]}}")
        if len(e["says"].split()) > CAUSE_WORDS:
            raise ClaimError(f"{where}.{cid}.says: {len(e['says'].split())} words; a cause is a sentence of at most "
                             f"{CAUSE_WORDS} (the report's first screen prints it; its metrics go to the appendix)")
        out[cid] = Cause(e["says"].strip(), tuple(e["metrics"]))
    return out


def predicates(text: str, where: str, sections: Mapping[str, str]) -> list[Claim]:
    """The claims that a conclusions.py source registers, executed in a fresh namespace (what it
    imports is its own affair: the standard library), in its order."""
    try:
        tree = ast.parse(text, where)
        namespace: dict = {"__name__": "attnrepro_conclusions"}
        exec(compile(tree, where, "exec"), namespace)
    except Exception as e:  # noqa: BLE001 (any failure of that code is the file's: one line)
        raise ClaimError(f"{where}: does not load ({type(e).__name__}: {e})") from None
    registry = namespace.get("CLAIMS")
    if not isinstance(registry, list):
        raise ClaimError(f"{where}: expected a list CLAIMS (what @claim registers)")
    def first(n):  # a statement's first line (a decorated function's: its first decorator's)
        return min([d.lineno for d in getattr(n, "decorator_list", [])] + [n.lineno])

    def line(e):  # the first line of a registered function (None: not a function)
        return getattr(getattr(e.get("fn") if isinstance(e, dict) else None, "__code__", None), "co_firstlineno", None)

    functions = {first(f): f for f in tree.body if isinstance(f, ast.FunctionDef)}
    claimed = {line(e) for e in registry}
    shared = [ast.dump(n) for n in tree.body[1 if ast.get_docstring(tree) else 0:]  # the registry, helpers, constants
              if first(n) not in claimed]
    out = []
    for e in registry:
        node = functions.get(line(e))
        here = f"{where}: {node.name if node else 'a registered claim'}"
        if node is None or not isinstance(e.get("id"), str) or not ID_RE.match(e["id"]):
            raise ClaimError(f"{here}: expected a module-level function with @claim(experiment, cls, id, text) and a "
                             "lower_snake_case id")
        cid, exp, cls = e["id"], e.get("experiment"), e.get("cls")
        if exp not in sections:
            raise ClaimError(f"{here}: experiment {exp!r} has no section in claims.yaml")
        if cls not in ("conclusion", "checksum"):
            raise ClaimError(f"{here}: class {cls!r}, expected conclusion or checksum (published values are tables)")
        if e.get("requires") not in REQUIRES:
            raise ClaimError(f"{here}: requires={e.get('requires')!r}, expected cuda, cpu or nothing")
        if e.get("own", False) not in (True, False) or (e.get("own") and cls != "conclusion"):
            raise ClaimError(f"{here}: own={e.get('own')!r}, expected True (a conclusion only) or False")
        if e.get("was") is not None and not (callable(e["was"]) and isinstance(e.get("why"), str) and e["why"].strip()):
            raise ClaimError(f"{here}: was= needs the replaced predicate (a function) and why= (a sentence)")
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        sides = None
        if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Compare) \
                and len(body[0].value.ops) == 1:  # a single comparison: the report shows its two sides
            both = ast.Tuple([body[0].value.left, body[0].value.comparators[0]], ast.Load())
            sides = eval(compile(ast.fix_missing_locations(ast.Expression(ast.Lambda(node.args, both))), where,
                                 "eval"), namespace)
        source = ast.get_source_segment(text, body[0].value) if len(body) == 1 and isinstance(body[0], ast.Return) \
            else "; ".join(ast.get_source_segment(text, b) for b in body)
        out.append(Claim(f"{exp}.{cid}", exp, cls, _text(e.get("text"), f"{here}: text"),
                         predicate=e["fn"], source=" ".join(source.split()), sides=sides,
                         code="\n".join([ast.dump(node.args), *(ast.dump(b) for b in body), *shared]),
                         requires=e.get("requires"), note=" ".join(str(e.get("note") or "").split()),
                         own=bool(e.get("own")), was=e.get("was"), why=" ".join(str(e.get("why") or "").split())))
    return out


def _text(v, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ClaimError(f"{where}: a non-empty string is required")
    return " ".join(v.split())


def _number(x, where: str) -> Optional[float]:
    if x is None:
        return None
    if isinstance(x, str):  # YAML 1.1 reads 3.4e38 (no exponent sign) as a string
        try:
            return float(x)
        except ValueError:
            pass
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ClaimError(f"{where}: {x!r} is not a number")
    return float(x)


def _published(x, where: str) -> tuple[Optional[float], float]:
    """A published number and half a unit of its last printed digit."""
    half = _half(x) if isinstance(x, str) else getattr(x, "half", 0.0)
    return _number(x, where), half


_TABLE_KEYS = {"id", "text", "metric", "columns", "rows", "published", "tol", "fieller", "requires", "note",
               "explain", "match"}


def _key(key: str, where: str) -> str:
    if not KEY_RE.match(key):
        raise ClaimError(f"{where}: {key!r} is not a metric key (<file>.<key>, e.g. train.d32_scaled.loss_final)")
    return key


def _entry(raw, cls: str, exp: str, where: str) -> list[Claim]:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where}: expected a mapping")
    cid = raw.get("id")
    if not isinstance(cid, str) or not ID_RE.match(cid):
        raise ClaimError(f"{where}: id {cid!r} must be lower_snake_case")
    where = f"{where} ({cid})"
    requires = raw.get("requires")
    if requires not in REQUIRES:
        raise ClaimError(f"{where}.requires: {requires!r}, expected cuda, cpu or nothing")
    text = _text(raw.get("text"), f"{where}.text")
    if "expr" in raw:
        raise ClaimError(f"{where}.expr: a claim that is not a table is a Python predicate in {CONCLUSIONS}")
    bad = sorted(set(raw) - _TABLE_KEYS)
    if bad:
        raise ClaimError(f"{where}.{bad[0]}: unknown key for a table (known: {', '.join(sorted(_TABLE_KEYS))})")
    template = raw.get("metric")
    if not isinstance(template, str) or "{col}" not in template:
        raise ClaimError(f"{where}.metric: a template with {{col}} (and {{row}} for a table with rows) is required")
    cells: list[tuple[str, str, str, Optional[float], float]] = []  # (row, col, metric key, published, half)
    match = None
    if "published" in raw:
        if not isinstance(raw["published"], dict) or "rows" in raw or "{row}" in template or "match" in raw:
            raise ClaimError(f"{where}.published: a one-row table is {{column: number}}, without rows, {{row}} or "
                             "match")
        for col, pub in raw["published"].items():
            cells.append(("", col, template.replace("{col}", col), *_published(pub, f"{where}.published.{col}")))
    else:
        cols, rows = raw.get("columns"), raw.get("rows")
        if not isinstance(cols, list) or not isinstance(rows, dict) or not rows:
            raise ClaimError(f"{where}: a table needs `columns:` (a list) and `rows:` (row -> numbers)")
        cols, rows = [str(c) for c in cols], {str(r): v for r, v in rows.items()}
        for row, vals in rows.items():
            if not isinstance(vals, list) or len(vals) != len(cols):
                raise ClaimError(f"{where}.rows.{row}: expected {len(cols)} numbers (one per column; null for none)")
            for col, pub in zip(cols, vals):
                _key(template.replace("{row}", row).replace("{col}", col), f"{where}.metric")
                if pub is not None:
                    cells.append((row, col, template.replace("{row}", row).replace("{col}", col),
                                  *_published(pub, f"{where}.rows.{row}")))
        if "match" in raw:
            match = _match(raw["match"], template, cols, rows, f"{where}.match")
    tol = Tol.parse(raw["tol"], f"{where}.tol") if "tol" in raw else None
    fieller = raw.get("fieller")
    if fieller is not None and not (isinstance(fieller, list) and len(fieller) == 2
                                    and all(isinstance(x, str) for x in fieller)):
        raise ClaimError(f"{where}.fieller: expected [numerator, denominator], two metric keys with seeds")
    if cls == "checksum" and tol is None:
        raise ClaimError(f"{where}: a checksum table needs `tol:` (usually exact)")
    explain = raw.get("explain") or {}
    if not isinstance(explain, dict):
        raise ClaimError(f"{where}.explain: expected {{cell or '*': {{by: [metric keys], note: text}}}}")
    shape = "expected {by: [metric keys], moved_by: [sensitivity rows], note: text}"
    out = []
    for row, col, key, pub, half in cells:
        cell = f"{row}.{col}" if row else col
        _key(key, f"{where}.metric")
        ex = explain.get(cell) or explain.get("*") or {}
        if not isinstance(ex, dict) or set(ex) - {"by", "moved_by", "note"} or not all(
                isinstance(ex.get(k, []), list) and all(isinstance(x, str) for x in ex.get(k, []))
                for k in ("by", "moved_by")):
            raise ClaimError(f"{where}.explain.{cell}: {shape}")
        ratio = tuple(_key(k, f"{where}.fieller") for k in fieller) if fieller else None
        out.append(Claim(f"{exp}.{cid}.{cell}", exp, cls, text, key, published=pub, published_half=half,
                         tol=tol, requires=requires, note=" ".join(str(raw.get("note", "")).split()),
                         evidence=tuple(ex.get("by", [])), evidence_note=" ".join(str(ex.get("note", "")).split()),
                         moved_by=tuple(ex.get("moved_by", [])), fieller=ratio, match=match, row=row, col=col))
    if not out:
        raise ClaimError(f"{where}: the table has no published number")
    return out


def _match(pattern, template: str, cols: list[str], rows: dict, where: str) -> Match:
    """A table's `match:` regex, validated: it groups the rows (by its first group) into groups of equal size."""
    try:
        rx = re.compile(pattern) if isinstance(pattern, str) else None
    except re.error as e:
        raise ClaimError(f"{where}: {pattern!r} is not a regular expression ({e.msg})") from None
    if rx is None or rx.groups < 1 or "{row}" not in template:
        raise ClaimError(f"{where}: expected a regular expression with a group, e.g. \"l(\\d+)h\\d+\" (and "
                         "{row} in the metric)")
    groups: dict[str, list[str]] = {}
    for row in rows:
        m = rx.fullmatch(row)
        if m is None:
            raise ClaimError(f"{where}: row {row} does not match {pattern!r}")
        groups.setdefault(m.group(1), []).append(row)
    sizes = {g: len(rs) for g, rs in groups.items()}
    if len(set(sizes.values())) > 1:
        raise ClaimError(f"{where}: groups of unequal size ({', '.join(f'{g}: {n} rows' for g, n in sizes.items())})")
    published = {row: [_number(v, f"{where} row {row}") for v in vals] for row, vals in rows.items()}
    scale = []
    for j in range(len(cols)):
        xs = [p[j] for p in published.values() if p[j] is not None]
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        scale.append(sd if sd > 0 else 1.0)  # a column without spread adds the same to every pairing
    return Match(template, cols, published, list(groups.values()), scale)


# ---------------------------------------------------------------- metrics, distributions, machines

METRIC_FILES_EXCLUDED = ("claims", "claims_summary", "headline")  # the report's and the DVC view's own files


def load_metrics_dir(path: str | Path = "metrics") -> dict[str, float]:
    """Every metrics/<file>.json (not env/, dist/, nor the claims' own files), flattened to
    {'<file>.<key>': number}."""
    out: dict = {}
    for f in sorted(Path(path).glob("*.json")):
        if f.stem not in METRIC_FILES_EXCLUDED:
            out.update(flatten(read_json(f), f"{f.stem}."))
    return out


def load_json_dir(path: str | Path) -> dict[str, dict]:
    """{file stem: its content} of every <path>/*.json: the seed distributions of metrics/dist ({"stats":
    {key: summary}, "runs": {seed: metrics}}), the machine records of metrics/env."""
    return {f.stem: read_json(f) for f in sorted(Path(path).glob("*.json"))}


def ran_on(stage: str, envs: Mapping[str, dict]) -> Optional[str]:
    """The kind of device `stage` ran on, "cuda" or "cpu", from the device its own record
    (metrics/env/<stage>.json) names; None where it has none. Never what the machine has: a CPU
    stage on a machine with a GPU ran on the CPU, and another stage's device says nothing of this one's."""
    device = (envs.get(stage) or {}).get("device")
    if not device:
        return None
    return "cuda" if str(device).startswith("cuda") else "cpu"


def paired_seed_values(dists: Mapping[str, dict], a: str, b: str) -> tuple[list[float], list[float]]:
    """Metrics `a` and `b` (one stage's) on each seed that has both: paired, seed by seed."""
    file = a.partition(".")[0]
    runs = [flatten(r, f"{file}.") for r in dists.get(file, {}).get("runs", {}).values()]
    pairs = [(r[a], r[b]) for r in runs if a in r and b in r]
    if len(pairs) < 2:
        raise MissingMetric(f"{a} and {b} over seeds (metrics/dist/{file}.json)")
    return [x for x, _ in pairs], [y for _, y in pairs]


def band(dists: Mapping[str, dict], key: str) -> Optional[Band]:
    """The seed distribution of metric `<file>.<key>`, if its stage has one."""
    file, _, rest = key.partition(".")
    s = dists.get(file, {}).get("stats", {}).get(rest)
    return from_summary(s) if s and s.get("n", 0) >= 2 else None


# ---------------------------------------------------------------- evaluation

@dataclass
class ClaimResult:
    claim: Claim
    status: str  # pass | fail | missing | skipped
    value: Optional[float] = None  # cells: the reproduced number; comparisons: the left side
    bound: Optional[float] = None  # comparisons: the right side
    detail: str = ""
    seeds_held: Optional[int] = None  # conclusions: on how many seeds it holds
    seeds_n: Optional[int] = None
    band: Optional[Band] = None  # cells: our seed distribution of the metric
    z: Optional[float] = None  # cells: (published - our mean) / our seed sd (with modes: from the chapter's
    # mode where chapter_modes decides it, else the nearest, in within-mode sd)
    interval: Optional[tuple[float, float]] = None  # a ratio of means: Fieller's 95% interval over the seeds
    percentile: Optional[float] = None  # cells with seeds: where the published figure sits among them (%)
    percentile_range: Optional[tuple[float, float]] = None  # ... where the ends of its rounding interval sit
    mode: Optional[int] = None  # cells whose seeds fall into modes: the mode the chapter's run was in (chapter_modes)
    mode_by: str = ""  # ... judged by the chapter's published figure of this metric
    missing_evidence: tuple[str, ...] = ()  # cited metrics that this run does not have
    not_moved: tuple[str, ...] = ()  # cited sensitivity rows that no longer account for it
    matched: Optional[str] = None  # matched tables: our row this cell was judged against
    read: tuple[str, ...] = ()  # predicates: the metric keys it read on the run
    read_values: tuple[float, ...] = ()  # ... and their values
    on_run: Optional[bool] = None  # predicates: whether it holds on the run itself, before its seeds

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def most_seeds(self) -> bool:
        """Conclusions: does it hold on more than half of the seeds (the rule that does not get harder with n)?"""
        return 2 * self.seeds_held > self.seeds_n

    def share_text(self) -> str:
        """On how many seeds a conclusion holds, with the exact (Clopper-Pearson) 95% interval of the share."""
        lo, hi = share_interval(self.seeds_held, self.seeds_n)
        return f"{self.seeds_held} of {self.seeds_n} seeds ({100 * lo:.0f}–{100 * hi:.0f}%)"

    @property
    def gated_failure(self) -> bool:
        return self.claim.gate and self.status in ("fail", "missing")

    @property
    def explanation(self) -> str:
        """For a value outside its band: the evidence cited (which must exist), or 'unexplained'."""
        if self.claim.cls != "value" or self.status != "fail":
            return ""
        if not self.claim.evidence and not self.claim.moved_by:
            return "unexplained"
        if self.missing_evidence:
            return f"unexplained (the cited {', '.join(self.missing_evidence)} is missing)"
        if self.not_moved:
            return (f"unexplained (the cited {', '.join(self.not_moved)} no longer accounts for it: significant "
                    "after Holm, toward the published figure, not past its band)")
        return self.claim.evidence_note


def _variants(metrics: Mapping[str, float], dists: Mapping[str, dict], files: set[str]) -> list[tuple[str, dict]]:
    """The seed runs of `files` (the seeds every one of them has), each as a full metrics mapping."""
    files = [f for f in sorted(files) if dists.get(f, {}).get("runs")]
    if not files:
        return []
    out = []
    for seed in [s for s in dists[files[0]]["runs"] if all(s in dists[f]["runs"] for f in files)]:
        m = {k: v for k, v in metrics.items() if k.split(".", 1)[0] not in files}
        for f in files:
            m.update(flatten(dists[f]["runs"][seed], f"{f}."))
        out.append((f"seed {seed}", m))
    return out


def _call(claim: Claim, view: View) -> tuple[bool, str]:
    """Does the predicate hold on the view's metrics? With the arithmetic error it raised, if it raised
    one (it does not hold then). MissingMetric propagates."""
    try:
        return bool(claim.predicate(view)), ""
    except (ArithmeticError, ValueError) as e:
        return False, f"{type(e).__name__}: {e}"


def _elsewhere(claim: "Claim", keys, metrics: Mapping[str, float], envs: Mapping[str, dict]) -> Optional[ClaimResult]:
    """A claim with `requires: <device>` reading `keys` is skipped, named, where a file of them was made on
    another kind of device, or no machine record is known and a metric is missing; None: it is judged."""
    if claim.requires is None:
        return None
    where = [ran_on(k.split(".", 1)[0], envs) for k in keys]
    if any(w is not None and w != claim.requires for w in where) or (
            all(w is None for w in where) and any(k not in metrics for k in keys)):
        return ClaimResult(claim, "skipped", detail=f"needs a {REQUIRES[claim.requires]} run")
    return None


def printed(c: "Claim") -> str:
    """A published figure as the source prints it, trailing zeros kept (4.00, 1.0000), from half a unit of
    its last printed digit; fmt_number where that is not a plain decimal (3.4e38)."""
    if c.published_half > 0 and math.isfinite(c.published):
        decimals = round(-math.log10(2 * c.published_half))
        if 0 <= decimals <= 8:
            return f"{c.published:,.{decimals}f}" if abs(c.published) >= 1e4 else f"{c.published:.{decimals}f}"
    return fmt_number(c.published)


def evaluate_claim(claim: Claim, metrics: Mapping[str, float], dists: Mapping[str, dict],
                   envs: Mapping[str, dict]) -> ClaimResult:
    if claim.predicate is None:
        return _evaluate_table_cell(claim, metrics, dists, envs)
    view = View(metrics)
    try:
        ok, error = _call(claim, view)
        skipped = _elsewhere(claim, view.read, metrics, envs)
        if skipped:
            return skipped
        res = ClaimResult(claim, "pass" if ok else "fail", detail=error, read=tuple(view.read),
                          read_values=tuple(metrics.get(k, math.nan) for k in view.read), on_run=ok)
        if claim.sides is not None and not error:
            res.value, res.bound = (float(x) for x in claim.sides(View(metrics)))
        if claim.cls == "conclusion":  # on each seed of the files it reads, and on their means
            files, reads, held = set(), view.files(), []
            while not reads <= files:  # what it reads on a seed may bring in another file's seeds
                files |= reads
                others = _variants(metrics, dists, files)
                held = []
                for _, m in others:
                    seen = View(m)
                    held.append(_call(claim, seen)[0])
                    reads |= seen.files()
            if held:
                res.seeds_held, res.seeds_n = sum(held), len(held)
                res.status = "pass" if res.most_seeds else "fail"  # one run is one draw: the seeds decide
                if res.seeds_held < res.seeds_n:
                    res.detail = res.detail or f"holds on {res.share_text()}"
        return res
    except MissingMetric as e:
        return _elsewhere(claim, view.read, metrics, envs) or ClaimResult(claim, "missing",
                                                                           detail=f"metric {e.key} not found")


def _evaluate_table_cell(claim: Claim, metrics, dists, envs) -> ClaimResult:
    skipped = _elsewhere(claim, [claim.metric], metrics, envs)
    if skipped:
        return skipped
    try:
        if claim.match is not None:
            ours = claim.match.assign(claim.row, metrics)
            res = _judge(claim, claim.match.key(ours, claim.col), metrics, dists)
            res.matched = ours
            res.detail = "; ".join(filter(None, (res.detail or f"{fmt_number(res.value)} vs "
                                                 f"{fmt_number(claim.published)}", f"matched with our {ours}")))
            return res
        return _judge(claim, claim.metric, metrics, dists)
    except MissingMetric as e:
        return ClaimResult(claim, "missing", detail=f"metric {e.key} not found")


def _judge(claim: Claim, key: str, metrics, dists) -> ClaimResult:
    """A table cell: the published figure (a value's rounding interval) against our interval, band or tol."""
    m = View(metrics)
    value = m[key]
    h = claim.published_half if claim.cls == "value" else 0.0  # a value stands for its rounding interval
    lo_p, hi_p = claim.published - h, claim.published + h
    rounds_to = lo_p <= value <= hi_p  # ours rounds to the published figure: a match whatever the band
    if claim.fieller:  # a ratio of our mean values: Fieller's interval, the one band a ratio gets here
        lo, hi = fieller_ratio(*paired_seed_values(dists, *claim.fieller))
        return ClaimResult(claim, "pass" if rounds_to or (lo <= hi_p and lo_p <= hi) else "fail", value=value,
                           interval=(lo, hi))
    b = band(dists, key) if claim.cls == "value" else None
    if b is not None:
        seeds = seed_values(dists, key)
        # where the band has modes, which one the chapter's run was in is chapter_modes' (once per variant)
        return ClaimResult(claim, "pass" if rounds_to or _meets(b, lo_p, hi_p) else "fail", value=value, band=b,
                           z=b.z_score(claim.published), percentile=percentile_of(seeds, claim.published),
                           percentile_range=(percentile_of(seeds, lo_p), percentile_of(seeds, hi_p)))
    closest = min(max(value, lo_p), hi_p) if math.isfinite(value) else claim.published
    return ClaimResult(claim, "pass" if (claim.tol or Tol("exact")).ok(value, closest) else "fail", value=value)


def _meets(b: Band, lo: float, hi: float) -> bool:
    """Does [lo, hi] meet the band's prediction interval (one of its modes', where it has modes)? The point of
    [lo, hi] closest to an interval's centre lies in that interval if any point does."""
    centres = [m for _, m in b.modes] or [b.mean]
    return any(b.contains(min(max(math.exp(c) if b.log else c, lo), hi)) for c in centres)


def chapter_modes(results: list[ClaimResult], dists: Mapping[str, dict]) -> None:
    """Where our seeds of a variant fall into modes, which one the chapter's run was in: decided once per
    variant, by the chapter's published figure of the statistic the modes were found on (its diagnostics),
    never by the figure being judged (that would be circular). None where the chapter does not print that
    statistic. A Band's modes follow the statistic's groups, lowest first, for every metric of the variant."""
    published = {r.claim.metric: r.claim.published for r in results
                 if r.claim.is_cell and r.claim.published is not None and r.claim.match is None}
    for r in results:
        if r.band is None or not r.band.modes:
            continue
        file, variant = r.claim.metric.split(".")[:2]
        statistic = ((dists.get(file) or {}).get("modes") or {}).get(variant, {}).get("statistic")
        key = f"{file}.{variant}.{statistic}"
        b = band(dists, key) if statistic else None
        r.mode = b.nearest_mode(published[key]) if key in published and b is not None and b.modes else None
        r.mode_by = key if r.mode is not None else ""
        if r.mode is not None and len(r.band.modes) == len(b.modes):  # z from the chapter's mode, not the nearest
            r.z = r.band.z_score(r.claim.published, mode=r.mode)


def on_published(exp: Expectations) -> list[tuple[Claim, Optional[bool], str]]:
    """Each of the chapter's conclusions on the chapter's own figures (claims.yaml's published table cells, as
    metrics): (claim, holds, ""), or (claim, None, the first metric it reads that the chapter does not print)."""
    figures = {c.metric: float(c.published) for c in exp.claims if c.is_cell}
    out = []
    for c in exp.claims:
        if c.cls == "conclusion" and not c.own:
            try:
                out.append((c, _call(c, View(figures))[0], ""))
            except MissingMetric as e:
                out.append((c, None, e.key))
    return out


def revised(results: list[ClaimResult], metrics, dists, envs) -> list[tuple[ClaimResult, ClaimResult]]:
    """Each conclusion rewritten (`was`): its result under the predicate it replaced, and under its own."""
    return [(evaluate_claim(replace(r.claim, predicate=r.claim.was, sides=None), metrics, dists, envs), r)
            for r in results if r.claim.was is not None]


def evaluate_all(exp: Expectations, metrics, dists, envs) -> list[ClaimResult]:
    results = [evaluate_claim(c, metrics, dists, envs) for c in exp.claims]
    chapter_modes(results, dists)
    for r in results:
        c = r.claim
        # a cited sensitivity row <file>.<variant>.<metric>.<choice>: the choice's band and Holm-adjusted p, and
        # its baseline's band (experiments.sensitivity.ROW_KEYS), judged by experiments.sensitivity.accounts_for
        rows = [(row.rsplit(".", 1)[0] + "." + BASELINE, row) for row in c.moved_by]
        cited = list(c.evidence) + [f"{x}.{k}" for base, row in rows for i, x in enumerate((row, base))
                                    for k in ROW_KEYS if i == 0 or k != "p_holm"]
        r.missing_evidence = tuple(k for k in cited if k not in metrics)
        if rows and not r.missing_evidence and c.published is not None:
            r.not_moved = tuple(row for base, row in rows if accounts_for(
                *({k: metrics[f"{x}.{k}"] for k in ROW_KEYS if f"{x}.{k}" in metrics} for x in (base, row)),
                c.published, c.published_half) != "accounts")
    return results


KINDS = ("conclusion", "finding", "checksum", "value")  # how the verdict counts claims


def kind(claim: Claim) -> str:
    """The verdict's count a claim belongs to: a conclusion of this project's own (`own`) is a finding."""
    return "finding" if claim.cls == "conclusion" and claim.own else claim.cls


def counts(results: list[ClaimResult]) -> dict:
    """Per kind (KINDS): n (judged: the skipped excluded), passed, failed (missing included), skipped; values:
    unexplained deviations."""
    out = {}
    for k in KINDS:
        rs = [r for r in results if kind(r.claim) == k]
        out[k] = {"n": sum(r.status != "skipped" for r in rs), "passed": sum(r.passed for r in rs),
                  "failed": sum(r.status in ("fail", "missing") for r in rs),
                  "skipped": sum(r.status == "skipped" for r in rs)}
    out["value"]["unexplained"] = sum(r.explanation.startswith("unexplained") for r in results)
    return out


def tally_lines(c: dict) -> dict[str, str]:
    """The claims' counts (`counts`) in words, per kind: what `attnrepro check` and the report both print."""

    def skipped(k):
        return f", {c[k]['skipped']} skipped (need a GPU)" if c[k]["skipped"] else ""

    lines = {"conclusion": f"conclusions {c['conclusion']['passed']} of {c['conclusion']['n']} hold (the chapter's; "
                           f"each on most of the reference's seeds where a stage has seeds, else on this run)"
                           f"{skipped('conclusion')}",
             "finding": f"findings    {c['finding']['passed']} of {c['finding']['n']} hold (this project's own, not "
                        f"the chapter's: d_head 32's small gap, QK-norm's, the sensitivity sweep's pre-registered one)"
                        f"{skipped('finding')}",
             "checksum": f"checksums   {c['checksum']['passed']} of {c['checksum']['n']} hold (true by construction)",
             "value": f"published   {c['value']['passed']} of {c['value']['n']} published values inside our band or "
                      f"tolerance; of the others {c['value']['unexplained']} unexplained (informational)"}
    return {k: line for k, line in lines.items() if c[k]["n"] or c[k]["skipped"]}


def claims_json(results: list[ClaimResult]) -> dict:
    """metrics/claims.json (a plain output): per claim its class, verdict and numbers."""
    out: dict = {}
    for r in results:
        c = r.claim
        e: dict = {"class": c.cls, "pass": int(r.passed), "skipped": int(r.status == "skipped")}
        for k, v in (("value", r.value), ("published", c.published), ("bound", r.bound), ("z", r.z),
                     ("percentile", r.percentile), ("mode", r.mode),
                     ("seeds_held", r.seeds_held), ("seeds_n", r.seeds_n), ("matched", r.matched)):
            if v is not None and (not isinstance(v, float) or math.isfinite(v)):
                e[k] = v
        if r.band is not None or r.interval is not None:
            e["band_lo"], e["band_hi"] = r.interval or r.band.prediction_interval()
        if r.explanation:
            e["unexplained"] = int(r.explanation.startswith("unexplained"))
        out[c.id] = e
    return out
