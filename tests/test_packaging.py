"""Packaging: environment.yml and pyproject.toml agree; CI entry point; dvc.yaml deps."""

import ast
import os
import re
import subprocess
import sys
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

def test_dvc_stage_deps_are_the_modules_each_stage_imports():
    """CONVENTIONS: deps list the stage script and every library module it imports (the engine aside);
    scripts/dvc_deps.py computes them and rewrites dvc.yaml, --check only compares."""
    p = subprocess.run([sys.executable, "scripts/dvc_deps.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, f"dvc.yaml deps differ from the imports (run python scripts/dvc_deps.py):\n{p.stdout}"


def test_the_deps_check_sees_a_missing_dep():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import dvc_deps
    finally:
        sys.path.pop(0)
    text = (REPO / "dvc.yaml").read_text(encoding="utf-8")
    broken = text.replace("      - src/attnrepro/model.py\n", "", 1)
    fixed, changes = dvc_deps.rewrite(broken, ["train", "failures", "seeds"])
    assert changes and "src/attnrepro/model.py" in changes[0] and fixed.count("src/attnrepro/model.py") == \
        text.count("src/attnrepro/model.py")
    for stage in STAGES:
        assert f"stages/{stage}.py" in yaml.safe_load(text)["stages"][stage].get("deps", [])


STAGES = sorted(yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"])


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


# --- the Python floor: requires-python is what the code and the dependencies need -----------

# standard-library modules newer than 3.8, with the version that added them
NEW_STDLIB = {"graphlib": (3, 9), "zoneinfo": (3, 9), "tomllib": (3, 11)}


def _floor(spec: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*>=\s*(\d+)\.(\d+)\s*", spec)
    assert m, f"requires-python {spec!r}: expected '>=X.Y'"
    return int(m.group(1)), int(m.group(2))


def _python_files() -> list:
    return [p for top in ("src", "stages", "tests", "scripts", "benchmarks") for p in (REPO / top).rglob("*.py")]


def code_needs() -> tuple[int, int]:
    """The newest Python the code needs: the stdlib modules it imports (NEW_STDLIB)."""
    need = (3, 8)
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                need = max(need, NEW_STDLIB.get(name.split(".")[0], need))
    return need


def dependency_needs() -> dict[str, tuple[int, int]]:
    """Each declared dependency's (as installed) lowest supported Python, from its Requires-Python."""
    from importlib.metadata import PackageNotFoundError, metadata

    proj = pyproject()["project"]
    out = {}
    for req in proj["dependencies"] + proj["optional-dependencies"]["test"]:
        try:
            spec = metadata(norm(req)).get("Requires-Python") or ""
        except PackageNotFoundError:
            continue
        m = re.search(r">=\s*(\d+)\.(\d+)", spec)
        out[norm(req)] = (int(m.group(1)), int(m.group(2))) if m else (3, 0)
    return out


def test_python_floor_is_what_the_code_and_the_dependencies_need():
    """requires-python is the real floor: not below what the code (tomllib: 3.11) or the installed
    dependencies (numpy, pandas, matplotlib: 3.11) need, and not above it either."""
    floor = _floor(pyproject()["project"]["requires-python"])
    deps = dependency_needs()
    assert {"torch", "dask", "numpy", "pandas"} <= set(deps), "the dependencies are not installed"
    need = max(code_needs(), *deps.values())
    assert floor == need, f"requires-python >={floor[0]}.{floor[1]}, but the code and dependencies need " \
                          f">={need[0]}.{need[1]} ({ {k: v for k, v in deps.items() if v == need} })"
    for path in _python_files():  # and the code parses with the floor's grammar
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=floor)
    env = yaml.safe_load((REPO / "environment.yml").read_text(encoding="utf-8"))
    (py,) = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert tuple(int(x) for x in py.split("=")[1].split(".")[:2]) >= floor


def test_license_is_an_spdx_expression():
    """`license = {text = ...}` is deprecated (PEP 639): an SPDX string, with a setuptools that reads it."""
    data = pyproject()
    assert isinstance(data["project"]["license"], str) and re.fullmatch(r"[A-Za-z0-9.+-]+", data["project"]["license"])
    (st,) = [r for r in data["build-system"]["requires"] if norm(r) == "setuptools"]
    assert int(re.search(r">=\s*(\d+)", st).group(1)) >= 77


def test_the_run_engine_is_a_dependency():
    """attnrepro.sweep runs sweeps on Dask: dask and distributed are declared, not just installed."""
    deps = {norm(r): r for r in pyproject()["project"]["dependencies"]}
    assert "dask" in deps and "distributed" in deps["dask"].replace(" ", "")
    assert any(norm(r) == "dask" and "distributed" in r for r in conda_pip())
    setup = (REPO / "scripts" / "setup_env.sh").read_text(encoding="utf-8")
    assert '-e ".[test]"' in setup and "3, 11" in setup
