"""A small, safe expression language over metrics (never Python's eval).

  metric references   train.d32_scaled.loss_final   (metrics/<file>.json, then the key path)
  globs               precision.forward_*.*_stable_*_nonfinite  (every matching metric; only
                      as arguments of min/max/sum/count)
  numbers             3, 0.01, 1e-4
  arithmetic          + - * / and unary minus, parentheses
  comparisons         < <= > >= == !=  (chainable: 0.01 < x < 0.99)
  logic               and, or, not
  functions           abs, min, max, sum, count, log, sqrt

Parsing is a recursive-descent parser into tuples; `evaluate` walks them with a
lookup function. IEEE arithmetic (x/0 is inf or nan); a comparison with nan is false.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Callable, Mapping

from .config import UserError


class ExprError(UserError):
    """A malformed expression; the message shows it."""


class MissingMetric(Exception):
    """An expression referred to a metric that is not in the metrics."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


FUNCTIONS: dict[str, Callable[..., float]] = {
    "abs": abs, "min": min, "max": max, "sum": lambda *a: math.fsum(a), "count": lambda *a: float(len(a)),
    "log": math.log, "sqrt": math.sqrt,
}
KEYWORDS = {"and", "or", "not"}
COMPARISONS = {"<", "<=", ">", ">=", "==", "!="}
ID_RE = re.compile(r"^[a-z0-9_]+$")


# ---------------------------------------------------------------- tokenizer

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_*]*(?:\.[A-Za-z0-9_*]+)*)
  | (?P<op><=|>=|==|!=|[<>+\-*/(),])
""", re.VERBOSE)


def tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExprError(f"unexpected character {text[pos]!r} at position {pos} in {text!r}")
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
            raise ExprError(f"expected {value!r} but found {tok[1] or 'end'!r} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self):
        node = self.or_()
        if self.peek()[0] != "end":
            raise ExprError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
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
                    raise ExprError(f"unknown function {text!r} in {self.text!r} "
                                     f"(known: {', '.join(sorted(FUNCTIONS))})")
                self.take("(")
                args = [self.or_()]
                while self.peek() == ("op", ","):
                    self.take()
                    args.append(self.or_())
                self.take(")")
                return ("call", text, args)
            if "." not in text:
                raise ExprError(f"{text!r} in {self.text!r} is not a metric reference "
                                 "(write <file>.<key>, e.g. corpus.poems)")
            return ("glob", text) if "*" in text else ("ref", text)
        raise ExprError(f"unexpected {text or 'end'!r} in {self.text!r}")


def parse(text: str):
    """Parse an expression into an AST (tuples); raises ExprError on bad syntax."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"empty expression: {text!r}")
    return _Parser(text).parse()


def references(node) -> list[str]:
    """Every metric key an AST refers to, in order of appearance, without repeats."""
    out: list[str] = []

    def walk(n):
        if n[0] in ("ref", "glob"):
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


def evaluate(node, lookup: Callable[[str], float], expand: Callable[[str], list[str]] = lambda g: []):
    """Evaluate an AST. `lookup(key)` returns a number or raises MissingMetric; `expand(glob)`
    lists the metric keys a glob matches (none: MissingMetric).

    Arithmetic follows IEEE rules (x/0 is inf or nan); a comparison involving nan is
    false. Booleans come back as Python bools, numbers as floats.
    """
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "ref":
        return lookup(node[1])
    if kind == "glob":
        raise ExprError(f"the glob {node[1]!r} can only be an argument of {', '.join(sorted(FUNCTIONS))}")
    if kind == "neg":
        return -_num(evaluate(node[1], lookup, expand))
    if kind == "bin":
        a, b = _num(evaluate(node[2], lookup, expand)), _num(evaluate(node[3], lookup, expand))
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
        vals = [_num(evaluate(x, lookup, expand)) for x in node[1]]
        return all(_compare(vals[i], op, vals[i + 1]) for i, op in enumerate(node[2]))
    if kind == "and":
        return bool(evaluate(node[1], lookup, expand)) and bool(evaluate(node[2], lookup, expand))
    if kind == "or":
        return bool(evaluate(node[1], lookup, expand)) or bool(evaluate(node[2], lookup, expand))
    if kind == "not":
        return not bool(evaluate(node[1], lookup, expand))
    if kind == "call":
        args = []
        for x in node[2]:
            if x[0] == "glob":
                keys = expand(x[1])
                if not keys:
                    raise MissingMetric(x[1])
                args += [_num(lookup(k)) for k in keys]
            else:
                args.append(_num(evaluate(x, lookup, expand)))
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
    return evaluate(parse(text), *lookups(metrics))


def lookups(metrics: Mapping[str, float]):
    """(lookup, expand) over a flat {key: number} mapping; None values read as nan."""
    def lookup(key):
        if key not in metrics:
            raise MissingMetric(key)
        v = metrics[key]
        return math.nan if v is None else float(v)

    def expand(pattern):
        return sorted(k for k in metrics if fnmatch.fnmatchcase(k, pattern))

    return lookup, expand


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
