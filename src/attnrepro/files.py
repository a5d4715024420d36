"""Reading and writing the project's files: deterministic JSON and CSV (rounded floats, sorted
keys), text, and the one reader for JSON and YAML whose errors are one line naming the file.
Every writer goes through staging.atomic_path, so inside a stage its outputs move in together."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import yaml

from attnrepro.config import ConfigError, UserError
from attnrepro.staging import atomic_path


def round_sig(x: float, digits: int = 6) -> float:
    """Round to significant digits so metrics files are short and readable."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def json_ready(obj):
    if isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None if math.isnan(obj) else (1e308 if obj > 0 else -1e308)
        return round_sig(obj)
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def dumps_json(obj, sort_keys: bool = True) -> str:
    """Deterministic JSON: sorted keys (unless told to keep their order), rounded floats, non-ASCII readable."""
    return json.dumps(json_ready(obj), indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n"


def write_json(path, obj) -> None:
    write_text(path, dumps_json(obj))


def read_json(path):
    """A JSON file's content; a file that is not UTF-8 or not JSON is one UserError line naming it."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    return parse_json(text, str(path))


def write_csv(path, rows: Sequence[Mapping], columns: Iterable[str] | None = None) -> None:
    """Write dict rows as CSV; missing values become empty cells."""
    columns = list(columns) if columns is not None else _columns(rows)
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            for row in rows:
                w.writerow({k: csv_cell(row.get(k)) for k in columns})


def _columns(rows: Sequence[Mapping]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        for k in row:
            if k not in cols:
                cols.append(k)
    return cols


def csv_cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(round_sig(v)) if math.isfinite(v) else str(v)
    return v


def read_csv(path) -> list[dict]:
    """CSV rows as write_csv wrote them: numbers parsed, empty cells left out."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: _parsed(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def as_written(rows: Sequence[Mapping]) -> list[dict]:
    """`rows` as read_csv reads them back once write_csv wrote them (floats to 6 significant digits):
    a figure drawn from these is the figure drawn from the file."""
    return [{k: _parsed(str(csv_cell(v))) for k, v in r.items() if v is not None} for r in rows]


def _parsed(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_yaml_or_none(path: Path):
    """A YAML file's data, None if it cannot be read or parsed (libyaml's parser where PyYAML has it:
    dvc.lock is large). For files whose absence or damage the caller reports in its own words."""
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def parse_json(text: str, name: str):
    """JSON text's content; text that is not JSON is one UserError line naming `name`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{name}: not valid JSON ({e.msg}, line {e.lineno})") from None


def parse_yaml(text: str, name: str, error: type[UserError] = UserError) -> dict:
    """YAML text whose top level is a mapping (empty: {}); anything else is one `error` line naming `name`."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{name}: not valid YAML{where} ({e.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise error(f"{name}: expected a mapping at the top level")
    return data


def read_yaml_mapping(path: str | Path, missing: str, error: type[UserError] = ConfigError) -> dict:
    """Read a YAML file whose top level is a mapping (empty file: {}); a one-line `error` otherwise."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: {missing}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from None
    return parse_yaml(text, str(path), error)


def dvc_stages(root: str | Path, required: bool = True) -> dict:
    """dvc.yaml's stages under `root`, a `foreach` stage as DVC names its copies (`<name>@<key>`, `${key}`
    filled in; the keys of the params.yaml mapping it names): a missing or broken dvc.yaml is one
    UserError line, or ({}) with `required` False, for callers that merely have less to say without one."""
    path = Path(root) / "dvc.yaml"
    data = read_yaml_mapping(path, "no dvc.yaml here", UserError) if required else read_yaml_or_none(path)
    stages = (data.get("stages") or {}) if isinstance(data, dict) else {}
    out = {}
    for name, st in stages.items():
        if isinstance(st, dict) and "foreach" in st:
            for key in foreach_keys(root, st["foreach"]):
                out[f"{name}@{key}"] = _fill(st.get("do") or {}, key)
        else:
            out[name] = st
    return out


def foreach_keys(root: str | Path, foreach) -> list[str]:
    """The keys a dvc.yaml `foreach: ${a.b}` runs over: those of params.yaml's mapping a.b (none if absent)."""
    value = read_yaml_or_none(Path(root) / "params.yaml") or {}
    for part in str(foreach).strip().removeprefix("${").removesuffix("}").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return [str(k) for k in value] if isinstance(value, dict) else []


def _fill(x, key: str):
    if isinstance(x, str):
        return x.replace("${key}", key)
    if isinstance(x, dict):
        return {_fill(k, key): _fill(v, key) for k, v in x.items()}
    if isinstance(x, list):
        return [_fill(v, key) for v in x]
    return x


def dvc_entry(entry) -> tuple[str, dict]:
    """A dvc.yaml list entry (deps, outs, metrics, plots): a path, or {path: its options}."""
    if isinstance(entry, dict):
        path, opts = next(iter(entry.items()))
        return str(path), opts or {}
    return str(entry), {}


def read_params(path: str | Path = "params.yaml") -> dict:
    return read_yaml_mapping(path, "params file not found")
