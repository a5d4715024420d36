"""Packaging: environment.yml and pyproject.toml agree; CI entry point; dvc.yaml deps."""

import ast
import os
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

from attnrepro.files import dvc_stages

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
    return [r for r in pips[0] if not r.strip().startswith("-")]  # options: -c requirements.lock, -e .


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
    broken = text.replace("      - src/attnrepro/model/transformer.py\n", "", 1)
    fixed, changes = dvc_deps.rewrite(broken, ["train", "failures", "seeds"])
    assert changes and "src/attnrepro/model/transformer.py" in changes[0] and fixed.count("src/attnrepro/model/transformer.py") == \
        text.count("src/attnrepro/model/transformer.py")
    for name, stage in dvc_stages(REPO).items():  # a foreach copy (choices@<arm>) runs its base stage's script
        assert f"stages/{name.split('@')[0]}.py" in stage.get("deps", [])


def test_a_new_stage_without_deps_gets_its_own_and_no_other_stage_changes():
    """dvc_deps once wrote a stage without `deps:` into the next stage's deps."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import dvc_deps
    finally:
        sys.path.pop(0)
    text = (REPO / "dvc.yaml").read_text(encoding="utf-8")
    stages = yaml.safe_load(text)["stages"]
    deps_at = text.index("    deps:\n", text.index("  heads:\n"))
    broken = text[:deps_at] + text[text.index("    params:", deps_at):]  # `heads` as a new stage: no deps yet
    fixed, _ = dvc_deps.rewrite(broken, ["heads"])
    got = yaml.safe_load(fixed)["stages"]
    assert got["heads"]["deps"][0] == "stages/heads.py" and "src/attnrepro/experiments/heads.py" in got["heads"]["deps"]
    assert {k: v.get("deps") for k, v in got.items() if k != "heads"} == \
        {k: v.get("deps") for k, v in stages.items() if k != "heads"}


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
    assert {"torch", "dask", "numpy", "scipy", "pandas"} <= set(deps), "the dependencies are not installed"
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
    """attnrepro.run.engine runs sweeps on Dask: dask and distributed are declared, not just installed."""
    deps = {norm(r): r for r in pyproject()["project"]["dependencies"]}
    assert "dask" in deps and "distributed" in deps["dask"].replace(" ", "")
    assert any(norm(r) == "dask" and "distributed" in r for r in conda_pip())
    setup = (REPO / "scripts" / "setup_env.sh").read_text(encoding="utf-8")
    assert '-e ".[$EXTRAS]"' in setup and 'EXTRAS="test"' in setup and "3, 11" in setup


# --- the lock: requirements.lock pins the tested environment (README "Pins and exact verdicts") ---
#
# pyproject.toml's lower bounds are a library install's; requirements.lock holds the exact version of
# every package the project needs, as tested, and scripts/setup_env.sh installs through it (as pip
# constraints). Regenerate it from an installed environment: `python tests/test_packaging.py --write-lock`.

LOCK = REPO / "requirements.lock"
LOCK_PYTHON = (3, 11)  # the lock's Python (the reference machine's): markers drop some packages on others
EXTRAS = ("test", "gpu")


def lock_pins() -> dict[str, tuple[str, str]]:
    """requirements.lock as {normalized name: (name as written, version)}; every line `name==version`."""
    pins: dict[str, tuple[str, str]] = {}
    for n, line in enumerate(LOCK.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.!+-]*)", line)
        assert m, f"requirements.lock:{n}: {line!r} is not an exact pin (name==version; no options, URLs or extras)"
        key = norm(m.group(1))
        assert key not in pins, f"requirements.lock:{n}: {key} is pinned twice"
        pins[key] = (m.group(1), m.group(2))
    return pins


def roots() -> list[tuple[object, bool]]:
    """pyproject.toml's requirements as (Requirement, optional): the dependencies, then the extras'."""
    from packaging.requirements import Requirement

    proj = pyproject()["project"]
    extras = proj.get("optional-dependencies", {})
    assert set(extras) == set(EXTRAS), f"extras {sorted(extras)}: the lock covers {EXTRAS}"
    return [(Requirement(r), False) for r in proj["dependencies"]] + \
        [(Requirement(r), True) for e in EXTRAS for r in extras[e]]


def _exact(req) -> bool:
    return bool(req.specifier) and all(s.operator in ("==", "===") and "*" not in s.version for s in req.specifier)


def needed_installed() -> tuple[dict, set[str]]:
    """The installed distributions the project needs, {normalized name: Distribution}: pyproject.toml's
    dependencies and extras (an extra's package that is not installed, nvidia-ml-py on a machine without
    a GPU say, is left out), then their requirements, transitively, markers evaluated for this Python and
    platform; and the names of needed packages that are not installed. torch's exact pins (a CUDA build's
    CUDA libraries and triton) are left to the torch build."""
    from importlib.metadata import PackageNotFoundError, distribution
    from packaging.requirements import Requirement

    stack = roots()[::-1]
    extras: dict[str, set[str]] = {}
    dists, missing = {}, set()
    while stack:
        req, optional = stack.pop()
        key = norm(req.name)
        if key in extras and set(req.extras) <= extras[key]:
            continue
        try:
            dist = dists.get(key) or distribution(req.name)
        except PackageNotFoundError:
            if not optional:
                missing.add(key)
            continue
        extras.setdefault(key, set()).update(req.extras)
        dists[key] = dist
        for r in dist.requires or []:
            sub = Requirement(r)
            if sub.marker is not None and not any(sub.marker.evaluate({"extra": e}) for e in {""} | extras[key]):
                continue
            if key == "torch" and _exact(sub):
                continue
            stack.append((sub, False))
    return dists, missing


def lock_text() -> str:
    """requirements.lock for the installed environment: its header kept, a pin per needed package
    (torch without its build's local label, "+cpu": the pin matches CPU and CUDA builds); an extra's
    package that is not installed here (nvidia-ml-py without a GPU) keeps the lock's pin."""
    from packaging.version import Version

    dists, missing = needed_installed()
    assert not missing, f"needed but not installed: {sorted(missing)}"
    old = lock_pins() if LOCK.exists() else {}
    pins = {k: (d.metadata["Name"], Version(d.version).public if k == "torch" else d.version) for k, d in dists.items()}
    for key in {norm(r.name) for r, optional in roots() if optional} - set(pins):
        assert key in old, f"{key} (an extra's) is neither installed nor in the lock: install it to lock it"
        pins[key] = old[key]
    header = []
    for line in LOCK.read_text(encoding="utf-8").splitlines() if LOCK.exists() else []:
        if line.strip() and not line.startswith("#"):
            break
        header.append(line)
    return "\n".join(header + [f"{name}=={v}" for _, (name, v) in sorted(pins.items())]) + "\n"


def test_the_lock_pins_every_dependency_within_its_bounds():
    """Every requirement of pyproject.toml (dependencies and extras) is pinned in requirements.lock, at a
    version its bounds allow; the project itself is not in it (setup_env.sh installs it editable)."""
    from packaging.version import Version

    pins = lock_pins()
    for req, _ in roots():
        key = norm(req.name)
        assert key in pins, f"requirements.lock does not pin {req.name} ({req}): regenerate it (see its header)"
        assert req.specifier.contains(Version(pins[key][1]), prereleases=True), \
            f"requirements.lock pins {key}=={pins[key][1]}, outside pyproject.toml's {req}"
    assert norm(pyproject()["project"]["name"]) not in pins


def test_the_lock_says_what_it_is():
    text = LOCK.read_text(encoding="utf-8")
    head = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    for words in ("pyproject.toml", "scripts/setup_env.sh", "torch==", "--write-lock", "-c requirements.lock"):
        assert words in head, f"requirements.lock's header does not mention {words!r}"
    assert "://" not in text and "--index" not in text and "--hash" not in text


def test_one_torch_pin_everywhere():
    """torch==X in the lock (no local label: 2.13.0 matches 2.13.0+cpu and a CUDA build alike), and the
    same X wherever setup_env.sh, environment.yml and the README name a torch pin."""
    (_, version), = [v for k, v in lock_pins().items() if k == "torch"]
    assert "+" not in version, f"requirements.lock pins torch=={version}: a local label matches one build only"
    setup = (REPO / "scripts" / "setup_env.sh").read_text(encoding="utf-8")
    assert "^torch==" in setup and "requirements.lock" in setup, "setup_env.sh reads torch's pin from the lock"
    for name in ("scripts/setup_env.sh", "environment.yml", "README.md"):
        found = set(re.findall(r"torch==([0-9][0-9A-Za-z.+]*[0-9A-Za-z])", (REPO / name).read_text(encoding="utf-8")))
        assert found <= {version}, f"{name} names torch=={sorted(found)}, the lock torch=={version}"


def test_setup_installs_through_the_lock():
    """The README's setup command installs the lock's versions (as pip constraints, so an extra's pin
    applies only when the extra is installed), the lower-bound install only when asked for, and the
    gpu extra where nvidia-smi lists a GPU."""
    setup = (REPO / "scripts" / "setup_env.sh").read_text(encoding="utf-8")
    code = "\n".join(ln for ln in setup.splitlines() if not ln.lstrip().startswith("#"))
    assert 'LOCK=requirements.lock' in code and '-c "$CONSTRAINTS"' in code
    assert "ATTNREPRO_LOCK" in code and "ATTNREPRO_GPU" in code and "nvidia-smi -L" in code
    assert 'EXTRAS="test,gpu"' in code
    p = subprocess.run(["bash", "-n", str(REPO / "scripts" / "setup_env.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_environment_yml_installs_through_the_lock():
    """conda's pip section takes the same constraints, and its bounds admit the lock's versions."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    env = yaml.safe_load((REPO / "environment.yml").read_text(encoding="utf-8"))
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert "-c requirements.lock" in [r.strip() for r in pip]
    pins = lock_pins()
    for r in conda_pip():
        req = Requirement(r)
        assert req.specifier.contains(Version(pins[norm(req.name)][1]), prereleases=True), (r, pins[norm(req.name)])


def test_the_lock_is_the_installed_environment():
    """requirements.lock is this environment: each pin is the installed version (skipped, naming the
    differences, where another environment is installed: a developer's, or another Python), and it pins
    exactly the packages the project needs (pyproject.toml's requirements and theirs, transitively)."""
    from importlib.metadata import PackageNotFoundError, version
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if sys.version_info[:2] != LOCK_PYTHON:
        pytest.skip(f"the lock is for Python {LOCK_PYTHON[0]}.{LOCK_PYTHON[1]} (its markers); this is "
                    f"{sys.version_info[0]}.{sys.version_info[1]}")
    pins = lock_pins()
    optional = {norm(r.name) for r, opt in roots() if opt}
    differ = []
    for key, (name, pin) in sorted(pins.items()):
        try:
            installed = version(name)
        except PackageNotFoundError:
            if key not in optional:
                differ.append(f"{name} not installed (lock {pin})")
            continue
        if not SpecifierSet(f"=={pin}").contains(Version(installed), prereleases=True):
            differ.append(f"{name} {installed} (lock {pin})")
    if differ:
        pytest.skip(f"this environment is not the locked one ({len(differ)} differ: {', '.join(differ[:4])}"
                    f"{', ...' if len(differ) > 4 else ''}); `bash scripts/setup_env.sh` installs the lock")
    dists, missing = needed_installed()
    assert not missing, f"needed, not installed and not in the lock: {sorted(missing)}"
    unpinned = sorted(set(dists) - set(pins))
    assert not unpinned, f"requirements.lock does not pin {unpinned}, which the project needs: " \
                         "`python tests/test_packaging.py --write-lock`"
    stale = sorted(set(pins) - set(dists) - optional)
    assert not stale, f"requirements.lock pins {stale}, which nothing the project needs requires"
    assert LOCK.read_text(encoding="utf-8") == lock_text()  # sorted, as the generator writes it


# --- dvc's upper bound and the optional NVML -------------------------------------------------

def test_dvc_has_the_vendored_templates_major_as_upper_bound():
    """vendor/vega/dvc_plots.html is DVC 3's plots page (.dvc/config points at it): dvc <4, in both files."""
    from packaging.requirements import Requirement

    assert "vendor/vega/dvc_plots.html" in (REPO / ".dvc" / "config").read_text(encoding="utf-8")
    assert (REPO / "vendor" / "vega" / "dvc_plots.html").is_file()
    specs = [Requirement(r).specifier for r in pyproject()["project"]["dependencies"] + conda_pip()
             if norm(r) == "dvc"]
    assert len(specs) == 2
    for spec in specs:
        assert spec.contains("3.99") and not spec.contains("4.0") and not spec.contains("4.0.0rc1", prereleases=True), spec
        assert not spec.contains("3.49"), f"dvc {spec}: the floor 3.50 went missing"


def test_nvml_is_an_optional_extra():
    """nvidia-ml-py (pynvml) is no dependency of a CPU-only install: the gpu extra, a comment in
    environment.yml, and every import of pynvml in src/ sits in a try that catches its absence."""
    proj = pyproject()["project"]
    assert "nvidia-ml-py" not in {norm(r) for r in proj["dependencies"]}
    assert [norm(r) for r in proj["optional-dependencies"]["gpu"]] == ["nvidia-ml-py"]
    assert "nvidia-ml-py" not in {norm(r) for r in conda_pip()}
    assert "nvidia-ml-py" in (REPO / "environment.yml").read_text(encoding="utf-8")  # named, as optional
    imports = 0
    for path in (REPO / "src").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        guarded = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                    h.type is None or (isinstance(h.type, ast.Name) and h.type.id in ("Exception", "ImportError",
                                                                                      "ModuleNotFoundError"))
                    for h in node.handlers):
                guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "pynvml" for n in names):
                imports += 1
                assert id(node) in guarded, f"{path.relative_to(REPO)}:{node.lineno}: an unguarded import of pynvml"
    assert imports >= 1  # envinfo.gpu_info


# --- CI: the README's test command, no global state, "no tests" is a failure -------------------

def _stub_tree(tmp_path, pytest_rc: int):
    """scripts/test.sh and .ci/run in a folder of their own, with setup_env.sh and the venv's python
    replaced by stubs that record what they were given (python exits with pytest_rc)."""
    for rel in ("scripts/test.sh", ".ci/run"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / ".ci" / "run").chmod(0o755)
    (tmp_path / "scripts" / "setup_env.sh").write_text("echo setup >> calls.txt\n", encoding="utf-8")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text(
        "#!/usr/bin/env bash\n"
        'echo "python $* | safe.directory=$(git config --get-all safe.directory)'
        ' | DVC_NO_ANALYTICS=${DVC_NO_ANALYTICS:-}" >> calls.txt\n'
        f"exit {pytest_rc}\n", encoding="utf-8")
    (tmp_path / "bin" / "python").chmod(0o755)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text(f'PATH="{tmp_path / "bin"}:$PATH"\n', encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "XDG_"))}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1")
    return env, home


@pytest.mark.parametrize("pytest_rc,expected", [(0, 0), (1, 1), (2, 2), (5, 1)])
def test_test_sh_fails_when_pytest_collects_nothing(tmp_path, pytest_rc, expected):
    """pytest's exit status 5 (no tests collected) is a failure of scripts/test.sh, not a pass."""
    env, _ = _stub_tree(tmp_path, pytest_rc)
    p = subprocess.run(["bash", "scripts/test.sh", "-k", "x"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == expected, (p.stdout, p.stderr)
    calls = (tmp_path / "calls.txt").read_text(encoding="utf-8").splitlines()
    assert calls[0] == "setup" and calls[1].startswith("python -m pytest -n auto --dist loadfile -k x |")
    if pytest_rc == 5:
        assert "no tests" in p.stderr


def test_ci_run_installs_from_scratch_and_leaves_global_config_alone(tmp_path):
    """.ci/run runs the README's test command (setup, then pytest) with git's safe.directory set for
    its own processes only: no ~/.gitconfig or ~/.config written, and DVC's telemetry off."""
    env, home = _stub_tree(tmp_path, 0)
    p = subprocess.run([str(tmp_path / ".ci" / "run")], cwd=home, env=env, capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout, p.stderr)
    calls = (tmp_path / "calls.txt").read_text(encoding="utf-8").splitlines()
    assert calls == ["setup", f"python -m pytest -n auto --dist loadfile -q | safe.directory={tmp_path} | DVC_NO_ANALYTICS=1"]
    assert list(home.iterdir()) == [], "the CI entry point wrote into $HOME"


if __name__ == "__main__":  # python tests/test_packaging.py --write-lock: requirements.lock from this environment
    if sys.argv[1:] != ["--write-lock"]:
        sys.exit("usage: python tests/test_packaging.py --write-lock   (run in the environment to lock)")
    LOCK.write_text(lock_text(), encoding="utf-8")
    print(f"wrote {LOCK.relative_to(REPO)}: {len(lock_pins())} pins")
