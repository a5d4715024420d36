"""The package's import graph: no cycles (function-level imports included), no importlib in the run path."""

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import dvc_deps  # noqa: E402

sys.path.pop(0)

PKG = REPO / "src" / "attnrepro"
RUN_PATH = ("attention.py", "model.py", "training.py", "runspec.py", "runs.py", "corpus_lm.py", "charlm.py",
            "reversal.py", "measure/weights.py", "measure/debugger.py", "sweep.py", "store.py")


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


def test_the_graph_sees_function_level_imports():
    g = graph()
    assert "src/attnrepro/runspec.py" in g["src/attnrepro/runs.py"]
    assert "src/attnrepro/audit/load.py" in g["src/attnrepro/model.py"]  # imported inside a function


# docs/ARCHITECTURE.md's layers, top to bottom: a module imports only from its own layer and those
# above it (the modules around them, config.py, io.py, stats.py, ..., belong to no layer).
LAYERS = [
    ("data", ["corpus.py", "tokenizer.py"]),
    ("model", ["attention.py", "model.py", "kv_cache.py"]),
    ("measure", ["measure/"]),
    ("run", ["training.py", "runspec.py", "runs.py", "corpus_lm.py", "charlm.py", "reversal.py", "golden.py"]),
    ("sweep", ["sweep.py", "store.py", "migrate.py", "engine.py"]),
    ("experiments", ["experiments/"]),
    ("stage", ["stage.py"]),
    ("check/report", ["claims.py", "conclusions.py", "check.py", "reference.py", "report.py", "report_html.py", "figures.py", "headline.py"]),
]


def layer_of(rel: str):
    name = rel.removeprefix("src/attnrepro/")
    for i, (_, mods) in enumerate(LAYERS):
        if any(name == m or (m.endswith("/") and name.startswith(m)) for m in mods):
            return i
    return None


def test_each_layer_imports_only_the_layers_above_it():
    wrong = []
    for mod, deps in graph().items():
        a = layer_of(mod)
        for d in deps:
            b = layer_of(d)
            if a is not None and b is not None and b > a:
                wrong.append(f"{mod} ({LAYERS[a][0]}) imports {d} ({LAYERS[b][0]})")
    assert wrong == []


def test_every_documented_layer_module_exists():
    for _, mods in LAYERS:
        for m in mods:
            assert (PKG / m).exists(), m
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for name, _ in LAYERS:
        assert name in text, name


def test_no_importlib_in_the_run_path():
    for name in RUN_PATH:
        assert "importlib" not in (PKG / name).read_text(encoding="utf-8"), name
