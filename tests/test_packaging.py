"""Packaging: environment.yml and pyproject.toml agree; CI entry point; dvc.yaml deps."""

import ast
import os
import re
import subprocess
import tomllib

import pytest
import yaml

from conftest import REPO


def norm(requirement: str) -> str:
    """Package name of a requirement, PEP 503-normalized."""
    name = re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def conda_pip():
    env = yaml.safe_load((REPO / "environment.yml").read_text(encoding="utf-8"))
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, "environment.yml needs exactly one pip: section"
    return [r for r in pips[0] if not r.strip().startswith("-e")]


def test_norm():
    assert norm("nvidia_ml.py >=12") == "nvidia-ml-py"
    assert norm("torch==2.13.0") == "torch" and norm("PyYAML") == "pyyaml"


def test_environment_and_pyproject_list_the_same_packages():
    proj = pyproject()["project"]
    deps = {norm(r) for r in proj["dependencies"]}
    test_extra = {norm(r) for r in proj.get("optional-dependencies", {}).get("test", [])}
    env = {norm(r) for r in conda_pip()}
    assert env - deps - test_extra == set(), "in environment.yml only"
    assert deps - env == set(), "in pyproject.toml only"
    assert "pytest" in env | deps | test_extra


def test_environment_installs_the_project():
    env = yaml.safe_load((REPO / "environment.yml").read_text(encoding="utf-8"))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert any(r.replace(" ", "") in ("-e.", "-e.[test]") for r in pip)


def test_pyproject_files_exist():
    """Every file pyproject.toml points at must exist, or `pip install -e .` fails."""
    proj = pyproject()["project"]
    readme = proj.get("readme")
    if isinstance(readme, str):
        assert (REPO / readme).is_file(), f"pyproject readme {readme} is missing"
    for name, target in proj.get("scripts", {}).items():
        module, _, func = target.partition(":")
        path = REPO / "src" / (module.replace(".", "/") + ".py")
        assert path.is_file(), f"console script {name} -> {module} is missing"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), target


def test_ci_entry_point():
    ci = REPO / ".ci" / "run"
    if not ci.exists():
        pytest.skip(".ci/run not written yet")
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    # it runs pytest itself or through a script of the repo (followed one level)
    text = ci.read_text(encoding="utf-8")
    texts = [text] + [(REPO / s).read_text(encoding="utf-8")
                      for s in re.findall(r"[\w./-]+\.sh", text) if (REPO / s).is_file()]
    assert any("pytest" in t for t in texts), ".ci/run does not run pytest"


# --- dvc.yaml deps: every library module a stage imports (transitively) ------------------

def attnrepro_imports(path, seen=None) -> set[str]:
    """src/attnrepro/*.py files imported by `path`, transitively."""
    seen = set() if seen is None else seen
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = REPO / "src" / "attnrepro"
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.ImportFrom):
            if node.level and path.parent == pkg:  # from .x import y / from . import x
                base = [node.module] if node.module else [a.name for a in node.names]
                mods = [f"attnrepro.{m}" for m in base]
            elif node.module == "attnrepro":
                mods = [f"attnrepro.{a.name}" for a in node.names]
            elif node.module and node.module.startswith("attnrepro."):
                mods = [node.module]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names if a.name.startswith("attnrepro.")]
        for m in mods:
            f = pkg / (m.split(".", 1)[1].replace(".", "/") + ".py")
            rel = str(f.relative_to(REPO))
            if f.is_file() and rel not in seen:
                seen.add(rel)
                attnrepro_imports(f, seen)
    return seen


STAGES = sorted(yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
# The run engine never changes a result (tests/test_sweep.py holds serial, local and cluster
# runs byte-identical), so stages do not depend on it; a change to it reruns nothing.
ENGINE = {"src/attnrepro/sweep.py", "src/attnrepro/store.py"}


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_stage_deps_cover_imported_modules(stage):
    """CONVENTIONS: deps list the stage script and every library module it imports (the engine aside)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    spec = stages[stage]
    spec = spec.get("do", spec)
    deps = {d if isinstance(d, str) else next(iter(d)) for d in spec["deps"]}
    script = f"stages/{stage}.py"
    assert script in deps
    needed = attnrepro_imports(REPO / script) - {"src/attnrepro/__init__.py"} - ENGINE
    assert needed - deps == set(), f"{stage}: imported but not a dep"


def cached_outs(stage_name: str) -> list[str]:
    """Cached (DVC-managed) outputs of a spine stage, foreach expanded from params.yaml."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    spec = stages[stage_name]
    keys = [None]
    if "foreach" in spec:
        ref = re.fullmatch(r"\$\{(.+)\}", spec["foreach"].strip()).group(1)
        node = params
        for k in ref.split("."):
            node = node[k]
        keys = list(node)
        spec = spec["do"]
    outs = []
    for o in spec.get("outs", []):
        path, opts = (o, {}) if isinstance(o, str) else next(iter(o.items()))
        if opts.get("cache", True):
            outs += [path.replace("${key}", k) if k else path for k in keys]
    return outs


@pytest.mark.parametrize("stage", ["corpus", "train"])
def test_dvc_outputs_not_tracked_by_git(stage):
    """`dvc repro` refuses to save an output that git tracks ('already tracked by SCM')."""
    outs = cached_outs(stage)
    assert outs
    tracked = subprocess.run(["git", "ls-files", "--", *outs], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked == [], f"DVC outputs committed to git: {tracked[:5]}"
