"""The package's import graph against docs/ARCHITECTURE.md: the layers the document lists are the
packages in the tree, imports go down, no cycle, no function-local import, no importlib on the
path of a training run or of `attnrepro check`."""

import ast
import re
import subprocess
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import dvc_deps  # noqa: E402

sys.path.pop(0)

from test_sweep import tiny_inputs, tiny_spec  # noqa: E402

from attnrepro.model import attention_impl  # noqa: E402
from attnrepro.run.execute import execute  # noqa: E402

PKG = REPO / "src" / "attnrepro"


def graph() -> dict[str, set[str]]:
    return {str(f.relative_to(REPO)): dvc_deps.direct_imports(f) - {str(f.relative_to(REPO))}
            for f in sorted(PKG.rglob("*.py"))}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


ARCH = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _table(heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after `heading`, cells stripped of backticks."""
    section = ARCH.split(heading, 1)[1]
    rows = [ln for ln in section.split("\n\n")[1].splitlines() if ln.startswith("|")]
    return [[c.strip().strip("`") for c in r.strip("|").split("|")] for r in rows[2:]]


TOP = [row[0] for row in _table("## The top")]
LAYERS = [(row[0], row[1].rstrip("/")) for row in _table("## The layers, bottom to top")]


def layer_of(rel: str):
    name = rel.removeprefix("src/attnrepro/")
    for i, (_, package) in enumerate(LAYERS):
        if name.startswith(package + "/"):
            return i
    return None


def test_the_document_names_every_package_and_top_module_and_nothing_else():
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
    assert sorted(pkg for _, pkg in LAYERS) == packages
    top = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert sorted(TOP) == top
    sizes = {pkg: len(list((PKG / pkg).glob("*.py"))) - 1 for _, pkg in LAYERS}
    # experiments/ holds one module per experiment and grows with each (docs/ADDING_AN_EXPERIMENT.md)
    assert len(top) <= 10 and all(n <= 11 for pkg, n in sizes.items() if pkg != "experiments"), sizes


def test_the_document_names_each_module_of_its_layers():
    """Every module of a layer is named in its row (so the map is the territory)."""
    rows = {pkg: text for (_, pkg), text in zip(LAYERS, (r[2] for r in _table("## The layers, bottom to top")))}
    missing = [f"{pkg}/{f.name}" for pkg, text in rows.items() for f in (PKG / pkg).glob("*.py")
               if f.name != "__init__.py" and pkg not in ("experiments",) and f.stem not in text]
    assert missing == []


def test_each_package_says_what_it_owns():
    for _, pkg in LAYERS:
        doc = ast.get_docstring(ast.parse((PKG / pkg / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 80, pkg


def test_each_layer_imports_only_its_own_and_the_layers_below():
    wrong = []
    for mod, deps in graph().items():
        a = layer_of(mod)
        for d in deps:
            b = layer_of(d)
            if b is not None and (a is None or b > a):
                wrong.append(f"{mod} ({LAYERS[a][0] if a is not None else 'top'}) imports {d} ({LAYERS[b][0]})")
    assert wrong == []


def test_the_layer_finder_finds_a_wrong_import():
    assert layer_of("src/attnrepro/judge/check.py") > layer_of("src/attnrepro/run/engine.py")
    assert layer_of("src/attnrepro/stats.py") is None


def test_no_two_modules_share_a_name():
    stems = [f.stem for f in PKG.rglob("*.py") if f.name != "__init__.py"]
    assert sorted({s for s in stems if stems.count(s) > 1}) == []


def function_local_imports(path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [f"{path.name}:{sub.lineno}" for sub in ast.walk(node)
                    if isinstance(sub, (ast.Import, ast.ImportFrom))]
    return out


# the two exceptions, each for a reason: the command line (commands/) imports what a command needs when
# it runs, so that --version and every --help answer without importing torch; NVML is an optional extra,
# imported where it is used
DEFERRED = ("envinfo.py",)


def test_no_function_local_import_outside_the_command_line():
    assert [loc for f in sorted(PKG.rglob("*.py")) if not str(f).endswith(DEFERRED) and "commands" not in f.parts
            for loc in function_local_imports(f)] == []


def test_every_help_answers_without_importing_torch():
    """`attnrepro kv`, `audit`, `store`, `keep` --help took 2.2 to 2.8 s, torch imported first (issue 40)."""
    from attnrepro.commands.main import COMMANDS

    for name in ["check", "claims", *COMMANDS]:
        code = (f"import sys\nfrom attnrepro.commands.main import main\ntry:\n    main([{name!r}, '--help'])\n"
                "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout
        assert out.strip().splitlines()[-1] == "False", name


def test_the_local_import_finder_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    import json\n    return json\n")
    assert len(function_local_imports(f)) == 1


def _closure(start: str) -> set[str]:
    g, seen, todo = graph(), set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += g.get(m, ())
    return seen


def test_no_importlib_on_the_path_of_a_training_run_or_of_check():
    """The one module that loads a user's attention (model/attention_impl.py) is the only one on
    these paths that may name importlib; the builtin attention never calls it (test below)."""
    paths = _closure("src/attnrepro/run/engine.py") | _closure("src/attnrepro/judge/check.py")
    named = sorted(m for m in paths if re.search(r"\bimport_module\b|^import importlib|__import__",
                                                (REPO / m).read_text(encoding="utf-8"), re.M))
    assert named == ["src/attnrepro/model/attention_impl.py"]


def test_a_training_run_with_the_builtin_attention_loads_no_module(monkeypatch, tmp_path):
    def refuse(*a, **k):
        raise AssertionError("a module loaded on the run path")

    monkeypatch.setattr(attention_impl, "_import", refuse)
    assert execute(tiny_spec(steps=3), tiny_inputs(), tmp_path / "run")["status"] == "ok"
