"""Numbers and table cells as the report, each experiment's report section and the verdict print them."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import tabulate


def dig(d, path: str):
    """d['a']['b'] for path 'a.b', or None."""
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def fmt(x, digits: int = 3) -> str:
    """A number to `digits` significant digits; "—" for None."""
    return "—" if x is None else f"{x:.{digits}g}"


def table_cell(text) -> str:
    """Text as one cell of a Markdown table: on one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def md_table(header: Sequence[str], rows: Iterable[Sequence], width: int = 160) -> list[str]:
    """A Markdown table's lines (header, separator, one per row), cells as given: columns padded to align
    while the table fits `width` characters; past it (a long text cell would pad every row to itself)
    unpadded."""
    cells, header = [[str(c) for c in row] for row in rows], [str(h) for h in header]
    lines = tabulate.tabulate(cells, headers=header, tablefmt="github", disable_numparse=True).split("\n")
    if max(map(len, lines)) <= width:
        return lines
    lines = tabulate.tabulate(cells, headers=header, tablefmt="github", disable_numparse=True,
                              stralign=None).split("\n")
    return [lines[0], "|" + " --- |" * len(header), *lines[2:]]


def number_text(x) -> str:
    """A number to 4 significant digits; "not a number" for None (a value dropped as not finite)."""
    return "not a number" if x is None else f"{x:.4g}"


def zero_note(lo: float, hi: float) -> str:
    """Every interval that includes zero says so (issue 17)."""
    return " (includes 0)" if lo <= 0 <= hi else ""


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
