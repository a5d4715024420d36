"""Published claims: a safe expression language, the claims file, and their evaluation.

A claim compares reproduced metrics with the source. Expressions are parsed by a
small recursive-descent parser (never Python's eval) and may contain:

  metric references   train.d32_scaled.loss_final   (metrics/<file>.json, then the key path)
  numbers             3, 0.01, 1e-4
  arithmetic          + - * / and unary minus, parentheses
  comparisons         < <= > >= == !=  (chainable: 0.01 < x < 0.99)
  logic               and, or, not
  functions           abs, min, max, log, sqrt

Two kinds of claim (see the header of claims.yaml for the gating rule):

  value      `value:` a numeric expression, `published:` the source's figure and a
             `tolerance:` (abs, rel, or factor) with a one-line `reason:`
  direction  `expr:` a boolean expression that must hold on any machine
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from .config import UserError, read_yaml_mapping

FUNCTIONS: dict[str, Callable[..., float]] = {
    "abs": abs, "min": min, "max": max, "log": math.log, "sqrt": math.sqrt,
}
KEYWORDS = {"and", "or", "not"}
COMPARISONS = {"<", "<=", ">", ">=", "==", "!="}
ID_RE = re.compile(r"^[a-z0-9_]+$")


class ClaimError(UserError):
    """A malformed claim or expression; the message names the claim."""


class MissingMetric(Exception):
    """An expression referred to a metric that is not in the metrics."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


# ---------------------------------------------------------------- tokenizer

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
  | (?P<op><=|>=|==|!=|[<>+\-*/(),])
""", re.VERBOSE)


def tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ClaimError(f"unexpected character {text[pos]!r} at position {pos} in {text!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind != "ws":
            out.append((kind, m.group()))
    out.append(("end", ""))
    return out


# ---------------------------------------------------------------- parser -> AST
# AST nodes are tuples: ("num", x) ("ref", key) ("neg", a) ("bin", op, a, b)
# ("cmp", [a, b, ...], [op, ...]) ("and", a, b) ("or", a, b) ("not", a) ("call", f, [args])

class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i]

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            raise ClaimError(f"expected {value!r} but found {tok[1] or 'end'!r} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self):
        node = self.or_()
        if self.peek()[0] != "end":
            raise ClaimError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return node

    def or_(self):
        node = self.and_()
        while self.peek() == ("name", "or"):
            self.take()
            node = ("or", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.peek() == ("name", "and"):
            self.take()
            node = ("and", node, self.not_())
        return node

    def not_(self):
        if self.peek() == ("name", "not"):
            self.take()
            return ("not", self.not_())
        return self.cmp()

    def cmp(self):
        items, ops = [self.add()], []
        while self.peek()[0] == "op" and self.peek()[1] in COMPARISONS:
            ops.append(self.take()[1])
            items.append(self.add())
        return ("cmp", items, ops) if ops else items[0]

    def add(self):
        node = self.mul()
        while self.peek()[1] in ("+", "-") and self.peek()[0] == "op":
            op = self.take()[1]
            node = ("bin", op, node, self.mul())
        return node

    def mul(self):
        node = self.unary()
        while self.peek()[1] in ("*", "/") and self.peek()[0] == "op":
            op = self.take()[1]
            node = ("bin", op, node, self.unary())
        return node

    def unary(self):
        if self.peek() == ("op", "-"):
            self.take()
            return ("neg", self.unary())
        if self.peek() == ("op", "+"):
            self.take()
            return self.unary()
        return self.atom()

    def atom(self):
        kind, text = self.take()
        if kind == "num":
            return ("num", float(text))
        if kind == "op" and text == "(":
            node = self.or_()
            self.take(")")
            return node
        if kind == "name" and text not in KEYWORDS:
            if self.peek() == ("op", "("):
                if text not in FUNCTIONS:
                    raise ClaimError(f"unknown function {text!r} in {self.text!r} "
                                     f"(known: {', '.join(sorted(FUNCTIONS))})")
                self.take("(")
                args = [self.or_()]
                while self.peek() == ("op", ","):
                    self.take()
                    args.append(self.or_())
                self.take(")")
                return ("call", text, args)
            if "." not in text:
                raise ClaimError(f"{text!r} in {self.text!r} is not a metric reference "
                                 "(write <file>.<key>, e.g. corpus.poems)")
            return ("ref", text)
        raise ClaimError(f"unexpected {text or 'end'!r} in {self.text!r}")


def parse(text: str):
    """Parse an expression into an AST (tuples); raises ClaimError on bad syntax."""
    if not isinstance(text, str) or not text.strip():
        raise ClaimError(f"empty expression: {text!r}")
    return _Parser(text).parse()


def references(node) -> list[str]:
    """Every metric key an AST refers to, in order of appearance, without repeats."""
    out: list[str] = []

    def walk(n):
        if n[0] == "ref":
            if n[1] not in out:
                out.append(n[1])
        elif n[0] in ("neg", "not"):
            walk(n[1])
        elif n[0] in ("bin",):
            walk(n[2]), walk(n[3])
        elif n[0] in ("and", "or"):
            walk(n[1]), walk(n[2])
        elif n[0] == "cmp":
            for x in n[1]:
                walk(x)
        elif n[0] == "call":
            for x in n[2]:
                walk(x)

    walk(node)
    return out


def evaluate(node, lookup: Callable[[str], float]):
    """Evaluate an AST. `lookup(key)` returns a number or raises MissingMetric.

    Arithmetic follows IEEE rules (x/0 is inf or nan); a comparison involving nan is
    false. Booleans come back as Python bools, numbers as floats.
    """
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "ref":
        return lookup(node[1])
    if kind == "neg":
        return -_num(evaluate(node[1], lookup))
    if kind == "bin":
        a, b = _num(evaluate(node[2], lookup)), _num(evaluate(node[3], lookup))
        op = node[1]
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
        return a / b
    if kind == "cmp":
        vals = [_num(evaluate(x, lookup)) for x in node[1]]
        return all(_compare(vals[i], op, vals[i + 1]) for i, op in enumerate(node[2]))
    if kind == "and":
        return bool(evaluate(node[1], lookup)) and bool(evaluate(node[2], lookup))
    if kind == "or":
        return bool(evaluate(node[1], lookup)) or bool(evaluate(node[2], lookup))
    if kind == "not":
        return not bool(evaluate(node[1], lookup))
    if kind == "call":
        args = [_num(evaluate(x, lookup)) for x in node[2]]
        try:
            return float(FUNCTIONS[node[1]](*args))
        except (ValueError, TypeError):
            return math.nan
    raise ValueError(f"bad AST node {node!r}")


def _num(x) -> float:
    return float(x)


def _compare(a: float, op: str, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return False
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]


def eval_expr(text: str, metrics: Mapping[str, float]):
    """Parse and evaluate `text` against a flat {key: number} mapping."""
    def lookup(key):
        if key not in metrics:
            raise MissingMetric(key)
        v = metrics[key]
        return math.nan if v is None else float(v)
    return evaluate(parse(text), lookup)


# ---------------------------------------------------------------- metrics

def flatten(obj, prefix: str = "") -> dict[str, float | None]:
    """{'a': {'b': 1}} -> {'a.b': 1}; booleans become 0/1; strings are dropped."""
    out: dict[str, float | None] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    key = prefix[:-1]
    if isinstance(obj, bool):
        out[key] = int(obj)
    elif isinstance(obj, (int, float)) or obj is None:
        out[key] = obj
    return out


def load_metrics_dir(path: str | Path = "metrics", exclude: tuple[str, ...] = ("claims",)) -> dict:
    """Every metrics/<file>.json (not env/) flattened to {'<file>.<key>': number}."""
    out: dict = {}
    for f in sorted(Path(path).glob("*.json")):
        if f.stem in exclude:
            continue
        out.update(flatten(_read(f), f"{f.stem}."))
    return out


def load_envs(path: str | Path = "metrics/env") -> dict[str, dict]:
    """{stage: environment dict} from metrics/env/*.json."""
    return {f.stem: _read(f) for f in sorted(Path(path).glob("*.json"))}


def _read(f: Path):
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{f}: not valid JSON ({e.msg}, line {e.lineno})") from None


def cuda_run(stage: str, envs: Mapping[str, dict]) -> bool | None:
    """Was `stage` produced on a machine with CUDA? From metrics/env/<stage>.json,
    else from any other stage's env (one pipeline runs on one machine); None if unknown."""
    env = envs.get(stage)
    if env is None:
        known = [bool(e.get("cuda_available")) for e in envs.values() if "cuda_available" in e]
        return any(known) if known else None
    return bool(env.get("cuda_available")) or str(env.get("device", "")).startswith("cuda")


# ---------------------------------------------------------------- claims file

@dataclass
class Claim:
    id: str
    section: str
    kind: str                      # value | direction
    text: str                      # what the source says, in words
    gate: bool
    expr: str                      # value: numeric expression; direction: boolean expression
    published: float | None = None
    tolerance: dict = field(default_factory=dict)   # {abs: x} | {rel: x} | {factor: x}
    reason: str = ""
    requires: str | None = None    # "cuda" for GPU-only claims
    note: str = ""

    @property
    def stages(self) -> list[str]:
        return sorted({k.split(".", 1)[0] for k in references(parse(self.expr))})

    def tolerance_text(self) -> str:
        if self.kind == "direction":
            return ""
        (k, v), = self.tolerance.items()
        return {"abs": f"±{_fmt(v)}", "rel": f"±{_fmt(100 * v)}%", "factor": f"×/÷{_fmt(v)}"}[k]

    def tolerance_value(self) -> float:
        """The tolerance as an absolute half-width around `published`."""
        if self.kind == "direction":
            return 0.0
        (k, v), = self.tolerance.items()
        if k == "abs":
            return float(v)
        if k == "rel":
            return float(v) * abs(self.published)
        return abs(self.published) * (float(v) - 1)  # factor: upper half-width


_CLAIM_KEYS = {"id", "section", "kind", "text", "gate", "value", "expr", "published",
               "tolerance", "reason", "requires", "note"}


def load_claims(path: str | Path = "claims.yaml") -> list[Claim]:
    """Read and validate the claims file; every problem is one line naming the claim."""
    path = Path(path)
    data = read_yaml_mapping(path, "claims file not found", ClaimError)
    if not isinstance(data.get("claims"), list):
        raise ClaimError(f"{path}: expected a mapping with a `claims:` list")
    claims, seen = [], set()
    for i, raw in enumerate(data["claims"]):
        claims.append(_claim(raw, f"{path}: claims[{i}]"))
        if claims[-1].id in seen:
            raise ClaimError(f"{path}: claim id {claims[-1].id!r} appears twice")
        seen.add(claims[-1].id)
    return claims


def _claim(raw, where: str) -> Claim:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where}: expected a mapping")
    cid = raw.get("id")
    if not isinstance(cid, str) or not ID_RE.match(cid) or cid == "totals":
        raise ClaimError(f"{where}: id {cid!r} must be lower_snake_case (and not 'totals')")
    where = f"{where.split(':')[0]}: claim {cid}"
    unknown = sorted(set(raw) - _CLAIM_KEYS)
    if unknown:
        raise ClaimError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_CLAIM_KEYS))})")
    kind = raw.get("kind")
    if kind not in ("value", "direction"):
        raise ClaimError(f"{where}: kind {kind!r}, expected 'value' or 'direction'")
    for key in ("section", "text"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ClaimError(f"{where}: `{key}` (a string) is required")
    if not isinstance(raw.get("gate"), bool):
        raise ClaimError(f"{where}: `gate` must be true or false")
    if raw.get("requires") not in (None, "cuda"):
        raise ClaimError(f"{where}: requires {raw['requires']!r}, expected 'cuda' or nothing")
    if kind == "value":
        expr = raw.get("value")
        raw = {**raw, "published": _number(raw.get("published"))}
        if isinstance(raw.get("tolerance"), dict):
            raw["tolerance"] = {k: _number(v) for k, v in raw["tolerance"].items()}
        if "expr" in raw:
            raise ClaimError(f"{where}: a value claim takes `value:` (a numeric expression), not `expr:`")
        pub = raw.get("published")
        if isinstance(pub, bool) or not isinstance(pub, (int, float)):
            raise ClaimError(f"{where}: `published` must be a number")
        tol = raw.get("tolerance")
        if (not isinstance(tol, dict) or len(tol) != 1 or next(iter(tol)) not in ("abs", "rel", "factor")
                or isinstance(next(iter(tol.values())), bool)
                or not isinstance(next(iter(tol.values())), (int, float))
                or next(iter(tol.values())) < 0):
            raise ClaimError(f"{where}: `tolerance` must be one of {{abs: x}}, {{rel: x}}, {{factor: x}} "
                             "with x >= 0")
        if "factor" in tol and (tol["factor"] < 1 or pub <= 0):
            raise ClaimError(f"{where}: a factor tolerance needs factor >= 1 and a positive published value")
        if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
            raise ClaimError(f"{where}: a value claim needs a one-line `reason:` for its tolerance")
    else:
        expr = raw.get("expr")
        if "value" in raw or "published" in raw or "tolerance" in raw:
            raise ClaimError(f"{where}: a direction claim takes only `expr:` (no value/published/tolerance)")
        pub, tol = None, {}
    try:
        node = parse(expr)
    except ClaimError as e:
        raise ClaimError(f"{where}: {e}") from None
    if not references(node):
        raise ClaimError(f"{where}: the expression refers to no metric")
    is_bool = node[0] in ("cmp", "and", "or", "not")
    if kind == "direction" and not is_bool:
        raise ClaimError(f"{where}: a direction claim needs a comparison (e.g. a < b)")
    if kind == "value" and is_bool:
        raise ClaimError(f"{where}: a value claim's `value:` must be numeric, not a comparison")
    return Claim(id=cid, section=raw["section"], kind=kind, text=raw["text"].strip(), gate=raw["gate"],
                 expr=expr, published=None if pub is None else float(pub), tolerance=dict(tol),
                 reason=str(raw.get("reason", "")).strip(), requires=raw.get("requires"),
                 note=str(raw.get("note", "") or "").strip())


def _number(x):
    """YAML 1.1 reads 3.4e38 (no exponent sign) as a string; accept it as a number."""
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return x
    return x


# ---------------------------------------------------------------- evaluation

@dataclass
class Result:
    claim: Claim
    status: str                    # pass | fail | missing | skipped
    value: float | None = None     # value claims: the reproduced number; direction: left side
    bound: float | None = None     # direction: right side of the top comparison
    detail: str = ""
    inputs: dict = field(default_factory=dict)   # referenced metric -> value (those present)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def gated_failure(self) -> bool:
        return self.claim.gate and self.status in ("fail", "missing")


def within(value: float, published: float, tolerance: Mapping[str, float]) -> bool:
    if value is None or math.isnan(value):
        return False
    (k, t), = tolerance.items()
    if k == "abs":
        return abs(value - published) <= t * (1 + 1e-12) + 1e-15
    if k == "rel":
        return abs(value - published) <= t * abs(published) * (1 + 1e-12) + 1e-15
    return value > 0 and published / t <= value * (1 + 1e-12) and value <= published * t * (1 + 1e-12)


def evaluate_claim(claim: Claim, metrics: Mapping[str, float], envs: Mapping[str, dict]) -> Result:
    node = parse(claim.expr)
    refs = references(node)
    if claim.requires == "cuda":
        cuda = [cuda_run(k.split(".", 1)[0], envs) for k in refs]
        absent = [k for k in refs if k not in metrics]
        if any(c is False for c in cuda):
            return Result(claim, "skipped", detail="needs CUDA; these metrics were produced without it")
        if absent and all(c is None for c in cuda):
            return Result(claim, "skipped", detail=f"needs CUDA; {absent[0]} absent and the machine is unknown")

    def lookup(key):
        if key not in metrics:
            raise MissingMetric(key)
        v = metrics[key]
        return math.nan if v is None else float(v)

    inputs = {k: metrics[k] for k in refs if k in metrics}
    try:
        if claim.kind == "value":
            value = float(evaluate(node, lookup))
            ok = within(value, claim.published, claim.tolerance)
            return Result(claim, "pass" if ok else "fail", value=value, inputs=inputs)
        ok = bool(evaluate(node, lookup))
        left = right = None
        if node[0] == "cmp" and len(node[2]) == 1:
            left = float(evaluate(node[1][0], lookup))
            right = float(evaluate(node[1][1], lookup))
        return Result(claim, "pass" if ok else "fail", value=left, bound=right, inputs=inputs)
    except MissingMetric as e:
        return Result(claim, "missing", detail=f"metric {e.key} not found", inputs=inputs)


def evaluate_all(claims: list[Claim], metrics: Mapping[str, float], envs: Mapping[str, dict]) -> list[Result]:
    return [evaluate_claim(c, metrics, envs) for c in claims]


def totals(results: list[Result]) -> dict[str, int]:
    return {
        "n": len(results),
        "passed": sum(r.status == "pass" for r in results),
        "failed": sum(r.status in ("fail", "missing") for r in results),
        "missing": sum(r.status == "missing" for r in results),
        "skipped": sum(r.status == "skipped" for r in results),
        "gated": sum(r.claim.gate for r in results),
        "gated_passed": sum(r.claim.gate and r.status == "pass" for r in results),
        "gated_failed": sum(r.gated_failure for r in results),
    }


def claims_metrics(results: list[Result]) -> dict:
    """metrics/claims.json: numbers only, one level of nesting, no timestamps."""
    out: dict = {}
    for r in results:
        c = r.claim
        entry = {"pass": int(r.passed), "gate": int(c.gate), "skipped": int(r.status == "skipped")}
        if c.kind == "value":
            entry.update(published=c.published, tolerance=c.tolerance_value())
            if r.value is not None:
                entry["value"] = r.value
        else:
            entry["tolerance"] = 0
            if r.value is not None:
                entry["value"] = r.value
            if r.bound is not None:
                entry["published"] = r.bound
        out[c.id] = entry
    out["totals"] = totals(results)
    return out


def select(claims: list[Claim], patterns: list[str]) -> list[Claim]:
    """Claims whose id matches any glob pattern."""
    return [c for c in claims if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def _fmt(x: float) -> str:
    return fmt_number(x)


def fmt_number(x) -> str:
    """Short, stable text for a number in tables (up to 7 significant digits)."""
    if x is None:
        return "—"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x) or abs(x) >= 1e300:
        return "inf" if x > 0 else "-inf"
    if abs(x) >= 1e7:
        return f"{x:.6g}"
    if x == int(x):
        return f"{int(x):,}" if abs(x) >= 10000 else str(int(x))
    return f"{x:.7g}"
