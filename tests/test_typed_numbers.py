"""No number the code computes is typed into README.md or docs/*.md (issue 63, item 4): a typed figure goes stale
unseen (docs/CRITICAL.md said "between 0.68 and 0.90" long after d_qk 96 had moved to 0.918). Such a figure is
generated (a block of report.readme: BLOCKS, DOCS, a `<!--count:...-->`) or left to the file that is generated
(report/REPORT.md, report/APPENDIX.md, metrics/, benchmarks/results/) with words and a pointer.

The test reads every number typed in the prose, outside generated blocks and counts, code spans and blocks, §
and equation references, and the chapter's own words in quotation marks, and fails when one equals, to its
printed digits, a value in metrics/*.json, metrics/dist/*.json or benchmarks/results/*.json. Compared: every
number with a decimal point or an exponent and at least two significant digits (one digit, "0.02", "1e-4", is a
setting or an order of magnitude, and would equal half the values at that precision), and every whole number of
four digits or more. The chapter's own figures (`published` in metrics/claims.json, copied from claims.yaml) are
not the code's: they are left out of the values, and a typed number that is one exactly (as claims.yaml writes it)
is the chapter's, quoted. A typed number that is exactly a value of params.yaml is a setting, not a result. Neither
is compared. A coincidence stays only in ALLOWED, with its reason."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# generated text, code, references and quotations: not read
SKIP = [
    re.compile(r"<!-- (\w+):begin.*?<!-- \1:end -->", re.S),          # report.readme's generated blocks
    re.compile(r"<!--count:\w+-->.*?<!--/count-->"),                  # report.readme's generated counts
    re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M),           # fenced code blocks
    re.compile(r"`[^`\n]*`"),                                          # code spans
    re.compile(r"§+\s*\d+(?:\.\d+)*"),                                 # the chapter's sections
    re.compile(r"\b[Ee]qs?\.\s*\d+\.\d+(?:\s*(?:,|and|to)\s*\d+\.\d+)*"),  # the chapter's equations
    re.compile(r"\bPython \d+\.\d+"),                                  # a version
    re.compile(r"[\"“][^\"”\n]*[\u3000-\u9fff\uff00-\uffef][^\"”\n]*[\"”]"),  # the chapter's words, quoted
]
NUMBER = re.compile(r"(?<![\w.\-/#^])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?![\w.]*\d|\.\d|\w)")

# (file, the phrase that holds the number, as typed): why it equals a value in metrics/ or benchmarks/results/ by
# coincidence. A number is let through only inside its phrase, so the same digits typed elsewhere are still read.
ALLOWED: dict[tuple[str, str], str] = {
    ("docs/CRITICAL.md", "rejects a true zero slope in\n3.5% to 6.5%"):
        "the rejection rate tests/test_stats.py requires of the trend test (5% ± 1.5 points): a bound, not a result",
    ("docs/debugger.md", "(0.99, near-uniform"): "the debugger's default entropy_high (measure.debugger): a setting",
    ("docs/debugger.md", "lies in (0.01, 0.99)"): "the health check's ENTROPY_BAND (measure.health): a setting",
    ("docs/PROTOCOL.md", "| 1.001 round trip |"):
        "the chapter's input value (§1.17.4, torch.tensor([1.001])), which the round trip keeps to these digits",
    ("docs/USAGE.md", "(1.34 GB at 4096 tokens here)"):
        "the KV formula's arithmetic for the example's shape (2 × 80 × 8 × 128 × 2 bytes × 4096), not measured",
}


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """`text` with what the test does not read blanked, its lines kept (so line numbers still point)."""
    for rx in SKIP:
        text = rx.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return text


def typed_numbers(text: str):
    """(line, number as typed) for every number the test compares."""
    for n, line in enumerate(prose(text).splitlines(), 1):
        for m in NUMBER.finditer(line):
            s = m.group(1)
            mantissa = re.split(r"[eE]", s)[0]
            if "." in mantissa or "e" in s.lower():
                if len(mantissa.replace(".", "").lstrip("0")) >= 2:
                    yield n, s
            elif len(s.replace(",", "")) >= 4:
                yield n, s


def leaves(x, key=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{key}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        yield key, float(x)


def all_values() -> list[tuple[str, float]]:
    paths = sorted([*REPO.glob("metrics/*.json"), *REPO.glob("metrics/dist/*.json"),
                    *REPO.glob("benchmarks/results/*.json")])
    return [(f"{p.relative_to(REPO)}:{k}", v) for p in paths
            for k, v in leaves(json.loads(p.read_text(encoding="utf-8")))]


def computed_values() -> list[tuple[str, float]]:
    return [(k, v) for k, v in all_values() if not k.endswith(".published")]


def not_computed() -> list[float]:
    """The chapter's figures (metrics/claims.json's `published`) and params.yaml's settings."""
    from attnrepro.files import read_params

    return [v for k, v in all_values() if k.endswith(".published")] + \
        [v for _, v in leaves(read_params(REPO / "params.yaml"))]


def printed_as(typed: str):
    """The value's printing to `typed`'s digits, for comparison with `typed`."""
    if re.search(r"[eE]", typed):
        mantissa, _ = re.split(r"[eE]", typed)
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        norm = lambda v: "{:.{}e}".format(v, digits).split("e")  # noqa: E731
        want = norm(float(typed))
        return lambda v: v != 0 and [norm(abs(v))[0], int(norm(abs(v))[1])] == [want[0], int(want[1])]
    plain = typed.replace(",", "")
    digits = len(plain.split(".")[1]) if "." in plain else 0
    return lambda v: "{:.{}f}".format(abs(v), digits) == plain


def lines_of(phrase: str, text: str) -> set[int]:
    """The lines (from 1) that `phrase` covers wherever it occurs in `text`."""
    return {start + i for m in re.finditer(re.escape(phrase), text)
            for start in [text[:m.start()].count("\n") + 1] for i in range(phrase.count("\n") + 1)}


def test_the_reader_finds_what_it_should():
    text = ("gap 0.838 and `0.838` and §1.11.7 and eq. 1.20 and \"约 11.5 个\" and 0.02 and 1e-4 and 8e-5 "
            "and 1.4e-3 and 4,441 s and 1480 steps and 256 and v0.3.1 and f5d8d39 and 3.5%\n<!-- x:begin -->\n0.912\n"
            "<!-- x:end -->\n  ```\n  0.249\n  ```\n<!--count:runs-->1,234<!--/count-->")
    assert [s for _, s in typed_numbers(text)] == ["0.838", "1.4e-3", "4,441", "1480", "3.5"]
    assert printed_as("0.57")(0.5712) and not printed_as("0.57")(0.576) and printed_as("1.4e-3")(0.00142)
    assert printed_as("4,441")(4441.2) and printed_as("8.0e-5")(8.04e-5) and not printed_as("8.0e-5")(8.04e-4)


def test_no_computed_number_is_typed_into_docs_or_the_readme():
    values, given = computed_values(), set(not_computed())
    assert len(values) > 5000 and len(given) > 200
    found, used = [], set()
    for path in documents():
        rel = str(path.relative_to(REPO))
        text = path.read_text(encoding="utf-8")
        for line, s in typed_numbers(text):
            same = printed_as(s)
            if float(s.replace(",", "")) in given:
                continue
            hits = [k for k, v in values if same(v)]
            if not hits:
                continue
            allowed = [(f, phrase) for f, phrase in ALLOWED
                       if f == rel and s in phrase and line in lines_of(phrase, text)]
            if allowed:
                used.update(allowed)
                continue
            found.append(f"{rel}:{line}: {s} (= {hits[0]}{f' and {len(hits) - 1} more' if len(hits) > 1 else ''})")
    assert not found, ("numbers the code computes, typed (generate them through attnrepro.report.readme, or say them "
                       "in words and point to where they are generated; a coincidence goes into ALLOWED with its "
                       "reason):\n" + "\n".join(found))
    assert used == set(ALLOWED), f"ALLOWED entries no longer needed: {sorted(set(ALLOWED) - used)}"
