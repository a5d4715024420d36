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


def test_no_importlib_in_the_run_path():
    for name in RUN_PATH:
        assert "importlib" not in (PKG / name).read_text(encoding="utf-8"), name
