"""docs/PROTOCOL.md against params.yaml: every row that names a params key carries its value.

The doc has one section per stage (`## <stage> ...`), each a table with the columns
COLUMNS. A row whose `params.yaml` column names a key (a dotted path in backticks; `—`
for a setting that is not a params key) must name an existing key and give its value
(YAML, in backticks). The only exemptions are the doc's own "params.yaml still says `X`"
lines: such a line under a table exempts the one row of that table whose params.yaml
value is X and whose documented value differs, so an exemption is visible in the doc,
never hidden here. Every key of the protocol sections must be documented; the sections
that are not protocol are named in the doc ("Sections of params.yaml that are not
protocol: ..."). Fast: no training, no stage runs.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "PROTOCOL.md"
PARAMS = REPO / "params.yaml"

COLUMNS = ["setting", "params.yaml", "value", "source", "the chapter says"]
STAGES = ("corpus", "train", "seeds", "heads", "failures", "init_sweep", "precision", "kv_cache", "latency",
          "critical", "qknorm", "choices", "sensitivity", "charlm", "reversal")
NO_KEY = "—"
STILL_SAYS = re.compile(r"params\.yaml still says `([^`]*)`")
NOT_PROTOCOL = "Sections of params.yaml that are not protocol:"
CELL_SPLIT = re.compile(r"(?<!\\)\|")
CODE = re.compile(r"^`([^`]*)`$")


@dataclass
class Row:
    line: int  # 1-based line number in the doc
    section: str  # the stage name of the `## ` heading above it
    table: int  # index of its table in the doc
    setting: str
    key: str | None  # the params key, or None for `—`
    value: str  # the value column with its backticks removed (YAML for a params row)
    source: str
    says: str


@dataclass
class Parsed:
    rows: list[Row]
    sections: list[str]  # the stage names of the `## ` headings, in order
    still_says: list[tuple[int, int, str]]  # (line, table index, value) of each "still says" line
    problems: list[str]  # structural problems found while parsing
    not_protocol: list[str]  # params sections the doc declares not to be protocol


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip().replace("\\|", "|") for c in CELL_SPLIT.split(inner)]


def parse(text: str) -> Parsed:
    """Tables, headings and "still says" lines of the doc."""
    lines = text.splitlines()
    rows, sections, still, problems, not_protocol = [], [], [], [], []
    section, table, last_table_end = "", -1, None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].split()[0] if line[3:].split() else ""
            sections.append(section)
            last_table_end = None
        elif line.startswith(NOT_PROTOCOL):
            not_protocol = re.findall(r"`([^`]+)`", line[len(NOT_PROTOCOL):])
        m = STILL_SAYS.search(line)
        if m:
            if last_table_end is None or any(s.strip() for s in lines[last_table_end:i]):
                problems.append(f"line {i + 1}: a 'params.yaml still says' line must come right under its table")
                still.append((i + 1, -1, m.group(1)))
            else:
                still.append((i + 1, table, m.group(1)))
        if line.lstrip().startswith("|"):
            table += 1
            header = _cells(line)
            if header != COLUMNS:
                problems.append(f"line {i + 1}: table header {header} is not {COLUMNS}")
            sep = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.fullmatch(r"\s*\|?(\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*\|?\s*", sep):
                problems.append(f"line {i + 2}: the header of the table at line {i + 1} has no separator row")
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = _cells(lines[i])
                if len(cells) != len(COLUMNS):
                    problems.append(f"line {i + 1}: {len(cells)} cells, expected {len(COLUMNS)}")
                else:
                    setting, key_cell, value_cell, source, says = cells
                    key = None
                    if key_cell != NO_KEY:
                        km = CODE.match(key_cell)
                        if not km:
                            problems.append(f"line {i + 1}: params.yaml column {key_cell!r} is neither `—` "
                                            "nor one key in backticks")
                        key = km.group(1) if km else key_cell
                    vm = CODE.match(value_cell)
                    if key is not None and not vm:
                        problems.append(f"line {i + 1}: `{key}`: value {value_cell!r} is not in backticks")
                    rows.append(Row(i + 1, section, table, setting, key, vm.group(1) if vm else value_cell,
                                    source, says))
                i += 1
            last_table_end = i
            continue
        i += 1
    return Parsed(rows, sections, still, problems, not_protocol)


def lookup(params: dict, key: str):
    """params[key] by dots; a key that itself holds dots (a file name) is matched as a whole."""
    def walk(node, parts: list[str], done: str):
        if not parts:
            return node
        if not isinstance(node, dict):
            raise KeyError(f"{done} is not a mapping")
        for n in range(len(parts), 0, -1):
            name = ".".join(parts[:n])
            if name in node:
                try:
                    return walk(node[name], parts[n:], f"{done}.{name}" if done else name)
                except KeyError:
                    if n == 1:
                        raise
        raise KeyError(f"no key {parts[0]!r} under {done or 'the top level'}")
    return walk(params, key.split("."), "")


FLOAT = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def normalize(v):
    """YAML values compared by meaning: PyYAML reads `-1.0e4` (no exponent sign) as a string."""
    if isinstance(v, str) and FLOAT.fullmatch(v.strip()):
        return float(v)
    if isinstance(v, dict):
        return {k: normalize(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [normalize(x) for x in v]
    return v


def same(a, b) -> bool:
    a, b = normalize(a), normalize(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def leaves(node, prefix: str):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}")
    else:
        yield prefix


def check(text: str, params: dict, own: Sequence[str] | None = None) -> list[str]:
    """Every problem of the doc `text` against the params mapping, one line each (empty: all good). The
    sections in `own` (experiments of this project's, not the chapter's; default: claims.yaml's,
    project_own) need not document every key; the rows they have are checked as any other."""
    own = project_own() if own is None else own
    doc = parse(text)
    problems = list(doc.problems)
    if not doc.rows:
        problems.append("no table rows found")
    for stage in STAGES:
        if stage not in doc.sections:
            problems.append(f"no section '## {stage}'")
        elif not any(r.section == stage for r in doc.rows):
            problems.append(f"section '## {stage}' has no table rows")

    values = {}  # row line -> its params value, for the rows that name an existing key
    for r in doc.rows:
        if r.source != "unstated" and not r.source.startswith(("stated §", "inferred §")):
            problems.append(f"line {r.line}: source {r.source!r} is neither 'unstated', 'stated §...' nor "
                            "'inferred §...'")
        if not r.says:
            problems.append(f"line {r.line}: the chapter-says column is empty")
        if r.key is None:
            continue
        try:
            values[r.line] = lookup(params, r.key)
        except KeyError as e:
            problems.append(f"line {r.line}: `{r.key}` is not a key of params.yaml ({e.args[0]})")

    exempt = set()
    for line, table, said in doc.still_says:
        if table < 0:
            continue
        said_value = yaml.safe_load(said)
        hits = [r for r in doc.rows if r.table == table and r.line in values and same(values[r.line], said_value)
                and not same(yaml.safe_load(r.value), values[r.line])]
        if len(hits) != 1:
            what = "no row" if not hits else f"{len(hits)} rows"
            problems.append(f"line {line}: 'params.yaml still says `{said}`' matches {what} of the table above "
                            "(params.yaml must hold that value for exactly one row that documents another; "
                            "if params.yaml now agrees with the doc, remove the line)")
        exempt.update(r.line for r in hits)

    for r in doc.rows:
        if r.line not in values or r.line in exempt:
            continue
        try:
            documented = yaml.safe_load(r.value)
        except yaml.YAMLError as e:
            problems.append(f"line {r.line}: `{r.key}`: value `{r.value}` is not YAML ({type(e).__name__})")
            continue
        if not same(documented, values[r.line]):
            problems.append(f"line {r.line}: `{r.key}`: the doc says {documented!r}, params.yaml has "
                            f"{values[r.line]!r}")

    documented_keys = {r.key for r in doc.rows if r.key is not None}
    for top in params:
        if top in doc.not_protocol or top in own:
            continue
        for leaf in leaves(params[top], top):
            if not any(leaf == k or leaf.startswith(k + ".") for k in documented_keys):
                problems.append(f"`{leaf}` is in params.yaml but no row documents it (or its section)")
    for name in doc.not_protocol:
        if name not in params:
            problems.append(f"'{NOT_PROTOCOL}' names `{name}`, which params.yaml does not have")
    return problems


# ---------------------------------------------------------------- the real doc


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def real_params() -> dict:
    return yaml.safe_load(PARAMS.read_text(encoding="utf-8"))


def project_own() -> list[str]:
    """The experiments whose claims.yaml section cites no § of the chapter: the project's own."""
    experiments = yaml.safe_load((REPO / "claims.yaml").read_text(encoding="utf-8"))["experiments"]
    return [name for name, e in experiments.items() if "§" not in str(e.get("section", ""))]


def test_protocol_doc_matches_params():
    problems = check(doc_text(), real_params())
    assert not problems, f"{len(problems)} problem(s) in docs/PROTOCOL.md:\n" + "\n".join(problems)


def test_every_stage_has_rows_and_every_row_a_source():
    doc = parse(doc_text())
    for stage in STAGES:
        assert any(r.section == stage for r in doc.rows), stage
    assert all(r.source == "unstated" or r.source.startswith(("stated §", "inferred §")) for r in doc.rows)


def test_decay_row_is_the_chapters_all_and_visibly_exempt():
    """§1.18.3 builds AdamW(model.parameters(), ...): the doc says `all`; params.yaml may still say 2d
    only through the doc's own "still says" line."""
    doc = parse(doc_text())
    (row,) = [r for r in doc.rows if r.key == "train.decay"]
    assert row.value == "all" and row.source == "stated §1.18.3"
    if real_params()["train"]["decay"] != "all":
        assert any(t == row.table for _, t, _ in doc.still_says)


# ---------------------------------------------------------------- the checker catches what it must


def edited(text: str, key: str, new_value: str) -> str:
    """`text` with the value cell of the row documenting `key` replaced by `new_value`."""
    pattern = re.compile(r"^(\|[^|\n]*\|\s*`" + re.escape(key) + r"`\s*\|\s*)`[^`]*`", re.M)
    out, n = pattern.subn(lambda m: m.group(1) + f"`{new_value}`", text)
    assert n == 1, f"expected one row for {key}, found {n}"
    return out


def test_a_wrong_value_in_the_doc_is_reported(tmp_path):
    copy_path = tmp_path / "PROTOCOL.md"
    copy_path.write_text(edited(doc_text(), "train.lr", "4.0e-3"), encoding="utf-8")
    problems = check(copy_path.read_text(encoding="utf-8"), real_params())
    assert len(problems) == 1, problems
    assert "`train.lr`" in problems[0] and "0.004" in problems[0] and "0.003" in problems[0]


def test_a_changed_params_value_is_reported():
    params = copy.deepcopy(real_params())
    params["charlm"]["dropout"] = 0.2
    problems = check(doc_text(), params)
    assert len(problems) == 1 and "`charlm.dropout`" in problems[0], problems


def test_a_wrong_list_or_mapping_is_reported(tmp_path):
    text = edited(doc_text(), "train.betas", "[0.9, 0.999]")
    text = edited(text, "train.variants.d32_scaled", "{model: small, scaled: false}")
    problems = check(text, real_params())
    assert len(problems) == 2, problems
    assert any("`train.betas`" in p for p in problems) and any("`train.variants.d32_scaled`" in p for p in problems)


def test_an_unknown_key_and_a_bad_source_are_reported():
    row = next(r for r in parse(doc_text()).rows if r.key == "train.lr")
    lines = doc_text().splitlines()
    lines[row.line - 1] = lines[row.line - 1].replace("`train.lr`", "`train.learning_rate`")
    problems = check("\n".join(lines), real_params())
    assert len(problems) == 2, problems
    assert any("`train.learning_rate` is not a key" in p for p in problems), problems
    assert any("`train.lr` is in params.yaml but no row documents it" in p for p in problems), problems
    row = next(r for r in parse(doc_text()).rows if r.key == "train.steps")
    lines = doc_text().splitlines()
    lines[row.line - 1] = lines[row.line - 1].replace(f"| {row.source} |", "| stated 1.18.4 |")
    problems = check("\n".join(lines), real_params())
    assert len(problems) == 1 and "'stated 1.18.4'" in problems[0], problems


def test_the_exemption_comes_only_from_the_still_says_line():
    doc = doc_text()
    row = next(r for r in parse(doc).rows if r.key == "train.decay")
    end = max(r.line for r in parse(doc).rows if r.table == row.table)  # the table's last row
    lines = doc.splitlines()
    with_line = "\n".join(lines[:end] + ["", "params.yaml still says `2d` until the rerun."] + lines[end:])
    behind = copy.deepcopy(real_params())
    behind["train"]["decay"] = "2d"  # params not yet on the protocol the doc states
    problems = check(doc, behind)
    assert len(problems) == 1 and "`train.decay`" in problems[0], problems
    assert check(with_line, behind) == []
    # once params.yaml agrees with the doc, the line is stale and must go
    problems = check(with_line, real_params())
    assert len(problems) == 1 and "still says `2d`" in problems[0], problems


def test_a_key_with_dots_and_yaml_numbers():
    params = {"corpus": {"files": {"poet.tang.0.json": "abc"}}, "p": {"m": ["-1.0e4", "-1.0e9"], "b": True}}
    assert lookup(params, "corpus.files.poet.tang.0.json") == "abc"
    with pytest.raises(KeyError):
        lookup(params, "corpus.files.poet.tang.9.json")
    assert same(yaml.safe_load("[-1.0e4, -1.0e9]"), params["p"]["m"])
    assert same(yaml.safe_load("[-1e4, -1e9]"), params["p"]["m"])
    assert not same(yaml.safe_load("1"), params["p"]["b"])
    assert same(yaml.safe_load("3.0e-3"), 0.003) and not same(yaml.safe_load("''"), None)


def test_every_choices_arm_changes_an_inferred_or_unstated_row():
    """The choices stage varies only what the chapter does not state (issue 38, rule 1)."""
    doc = parse(doc_text())
    by_key = {r.key: r.source for r in doc.rows if r.key}
    newline = next(r.source for r in doc.rows if r.setting == "vocabulary: how newline encodes")
    assert newline.startswith("inferred §")
    for name, arm in real_params()["choices"]["arms"].items():
        sources = ([newline] if "newline" in arm else []) + [by_key[f"train.{k}"] for k in arm.get("optim", {})]
        assert sources and all(x == "unstated" or x.startswith("inferred §") for x in sources), (name, sources)


def test_a_project_own_section_may_leave_keys_undocumented():
    """A key no row documents is a problem in a chapter experiment's section, not in a project-own one's
    (its settings are all the project's choices, said in params.yaml's comments)."""
    params = copy.deepcopy(real_params())
    params["toy"] = {"steps": 3}
    assert any("`toy.steps`" in p for p in check(doc_text(), params))
    assert not check(doc_text(), params, [*project_own(), "toy"])
    assert "seeds" in project_own() and "train" not in project_own()
