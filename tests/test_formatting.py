"""Markdown tables through tabulate (formatting.md_table): cells as given, columns aligned."""

from __future__ import annotations

import re

from attnrepro.formatting import md_table, table_cell


def cells(line: str) -> list[str]:
    """A table line's cells, split on unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_header_separator_and_rows_aligned():
    lines = md_table(["metric", "this run", "verdict"],
                     [["train.loss_final", "4.01", "SAME"], ["x", 5, table_cell("a | b\nc")]])
    assert len(lines) == 4
    assert cells(lines[0]) == ["metric", "this run", "verdict"]
    assert re.fullmatch(r"\|(-+\|){3}", lines[1])
    assert cells(lines[2]) == ["train.loss_final", "4.01", "SAME"]
    assert cells(lines[3]) == ["x", "5", "a \\| b c"]  # the escaped pipe stays inside its cell
    assert len({len(line) for line in lines}) == 1  # every column padded to one width
    assert [m.start() for m in re.finditer(r"(?<!\\)\|", lines[0])] == \
        [m.start() for m in re.finditer(r"(?<!\\)\|", lines[3])]


def test_cells_are_text_not_numbers():
    """No number parsing: "1.50" and "007" stay as written, not reformatted or right-aligned."""
    lines = md_table(["a", "b"], [["1.50", "007"], ["10", "x"]])
    assert cells(lines[2]) == ["1.50", "007"] and lines[2].startswith("| 1.50 ")


def test_no_rows_is_header_and_separator():
    assert md_table(["check", "status"], []) == ["| check   | status   |", "|---------|----------|"]


def test_a_table_wider_than_its_width_is_left_unpadded():
    """One long cell would pad every row of its column to itself: past `width` the cells are as given."""
    lines = md_table(["claim", "verdict"], [["x" * 200, "held"], ["short", "failed"]])
    assert lines == ["| claim | verdict |", "| --- | --- |", f"| {'x' * 200} | held |", "| short | failed |"]
    assert md_table(["a"], [["b" * 150]], width=160)[2] == f"| {'b' * 150} |"  # within the width: aligned
