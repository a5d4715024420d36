"""Keep each dvc.yaml stage's library deps equal to the modules its script imports.

A stage depends on its script and on every src/attnrepro module the script imports,
transitively (function-level imports too); the run engine (run/engine.py, store/run_store.py, run/engine_settings.py) is left
out: it never changes a result. This rewrites the `src/attnrepro/*.py` entries of each
stage's deps in place (comments and other deps stay, and DATA: conclusions.py, which the report
reads beside claims.yaml, never imports); `--check` changes nothing and exits 1 when a stage's
list differs (tests/test_packaging.py runs it).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "attnrepro"
ENGINE = {"src/attnrepro/run/engine.py", "src/attnrepro/store/run_store.py", "src/attnrepro/run/engine_settings.py"}
DATA = {"src/attnrepro/judge/conclusions.py"}  # read as data beside claims.yaml (attnrepro.judge.claims.load), never imported


def _module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    for f in (PKG.joinpath(*parts).with_suffix(".py"), PKG.joinpath(*parts, "__init__.py")):
        if parts and f.is_file():
            return f
    return None


def direct_imports(path: Path) -> set[str]:
    """The src/attnrepro files `path` imports itself (module-level and inside functions), repo-relative."""
    here = "attnrepro." + ".".join(path.relative_to(PKG).with_suffix("").parts) if PKG in path.parents else ""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                keep = len(parts) - node.level + (1 if path.name == "__init__.py" else 0)
                base_name = ".".join(parts[:keep] + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "attnrepro":
                base_name = node.module
            else:
                continue
            names = [base_name] + [f"{base_name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "attnrepro"]
        for name in names:
            f = _module_file(name)
            if f is not None and f != path:
                out.add(str(f.relative_to(REPO)))
    return out


def imported_modules(path: Path, seen: set[str] | None = None) -> set[str]:
    """The src/attnrepro files `path` imports, transitively, as repo-relative paths."""
    seen = set() if seen is None else seen
    for rel in direct_imports(path):
        if rel not in seen:
            seen.add(rel)
            imported_modules(REPO / rel, seen)
    return seen


def needed(stage: str) -> list[str]:
    return sorted(imported_modules(REPO / "stages" / f"{stage}.py") - {"src/attnrepro/__init__.py"} - ENGINE)


def rewrite(text: str, stages: list[str]) -> tuple[str, list[str]]:
    """dvc.yaml text with each stage's src/attnrepro/*.py deps replaced; and what changed."""
    lines, changes = text.splitlines(keepends=True), []
    for stage in stages:
        start = next(i for i, ln in enumerate(lines) if ln.rstrip() == f"  {stage}:")
        end_of_stage = next((i for i in range(start + 1, len(lines)) if re.match(r"  \S", lines[i])), len(lines))
        deps = next((i for i in range(start, end_of_stage) if lines[i].strip() == "deps:"), None)
        if deps is None:  # a new stage: its script first, then the modules it imports
            cmd = next(i for i in range(start, end_of_stage) if lines[i].strip().startswith("cmd:"))
            indent = re.match(r"\s*", lines[cmd]).group(0)
            lines[cmd + 1:cmd + 1] = [f"{indent}deps:\n", f"{indent}  - stages/{stage}.py\n"]
            deps = cmd + 1
        indent = re.match(r"\s*", lines[deps + 1]).group(0)
        end = deps + 1
        while end < len(lines) and lines[end].startswith(indent + "- "):
            end += 1
        items = [ln.strip()[2:] for ln in lines[deps + 1:end]]
        old = [d for d in items if d.startswith("src/attnrepro/") and d.endswith(".py") and d.split()[0] not in DATA]
        new = needed(stage)
        if old != new:
            changes.append(f"{stage}: +{sorted(set(new) - set(old))} -{sorted(set(old) - set(new))}")
            first = next((i for i, d in enumerate(items) if d in old), 1)
            rest = [d for d in items if d not in old]
            items = rest[:first] + new + rest[first:]
            lines[deps + 1:end] = [f"{indent}- {d}\n" for d in items]
    return "".join(lines), changes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a stage's deps differ")
    args = ap.parse_args()
    path = REPO / "dvc.yaml"
    text = path.read_text(encoding="utf-8")
    stages = sorted(yaml.safe_load(text)["stages"])
    new, changes = rewrite(text, stages)
    for c in changes:
        print(c)
    if args.check:
        return 1 if changes else 0
    path.write_text(new, encoding="utf-8")
    print(f"dvc.yaml: {len(changes)} stage(s) updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
