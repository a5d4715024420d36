"""The pipeline as DVC runs it: every stage command runs the project's Python (scripts/py), so
`.venv/bin/dvc repro` works without activating the venv; every output persists, so a stage that
fails (a params typo) leaves the committed outputs in place; the heads checkpoint dependency
follows its param; `dvc exp run -S` leaves params.yaml as it was but for the changed line."""

from __future__ import annotations

import copy
import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnrepro.files import dvc_stages

from conftest import REPO, copy_repo

DVC = Path(sys.executable).parent / "dvc"
STAGES = dvc_stages(REPO)  # a foreach stage as its copies, name@key
SYSTEM_PATH = "/usr/bin:/bin"  # no venv on it


def _entries(section):
    for e in section:
        yield (e, {}) if isinstance(e, str) else next(iter(e.items()))


# ---------------------------------------------------------------- the project's interpreter

@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_command_uses_the_project_python(name):
    base, _, key = name.partition("@")
    assert STAGES[name]["cmd"] == f"sh scripts/py stages/{base}.py" + (f" {key}" if key else ""), \
        "a bare `python` is whatever comes first on PATH (ModuleNotFoundError without the venv)"


def _fake_python3(bindir: Path) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "python3").write_text('#!/bin/sh\necho "path python3 $*"\n', encoding="utf-8")
    (bindir / "python3").chmod(0o755)


def test_wrapper_prefers_the_venv_beside_the_repo(tmp_path):
    """Without the venv on PATH (as `.venv/bin/dvc repro` runs stage commands) scripts/py still
    finds .venv/bin/python beside the repository; without a .venv it takes python3 from PATH;
    $ATTNREPRO_PYTHON overrides both."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "py", repo / "scripts" / "py")
    _fake_python3(tmp_path / "bin")
    env = {"PATH": f"{tmp_path / 'bin'}:{SYSTEM_PATH}"}
    run = lambda extra=None: subprocess.run(["sh", str(repo / "scripts" / "py"), "-c", "x"], cwd=tmp_path,  # noqa: E731
                                            env={**env, **(extra or {})}, capture_output=True, text=True)
    assert run().stdout.strip() == "path python3 -c x"  # no .venv here: python3 from PATH
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text('#!/bin/sh\necho "venv python $*"\n', encoding="utf-8")
    (venv_bin / "python").chmod(0o755)
    assert run().stdout.strip() == "venv python -c x"
    assert run({"ATTNREPRO_PYTHON": str(tmp_path / "bin" / "python3")}).stdout.strip() == "path python3 -c x"
    shutil.rmtree(repo / ".venv")
    none = subprocess.run(["/bin/sh", str(repo / "scripts" / "py"), "-c", "x"], env={"PATH": str(tmp_path / "empty")},
                          capture_output=True, text=True)
    assert none.returncode == 127 and none.stderr.startswith("error: no Python found")


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="needs the project's .venv")
def test_wrapper_runs_this_checkout_without_activation():
    proc = subprocess.run(["sh", str(REPO / "scripts" / "py"), "-c", "import attnrepro, sys; print(sys.prefix)"],
                          cwd="/", env={"PATH": SYSTEM_PATH}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (REPO / ".venv").resolve()


# ---------------------------------------------------------------- persist, and a failed stage

@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_output_persists(name):
    """DVC deletes a stage's outputs before running its command unless they persist: a stage that then
    fails (even a params typo) would leave the committed metrics/ and plots/ files deleted."""
    for key in ("outs", "metrics", "plots"):
        for path, opts in _entries(STAGES[name].get(key, [])):
            assert (opts or {}).get("persist") is True, f"{name}: {key} {path} lacks persist: true"


def _small_precision(params: dict) -> dict:
    p = copy.deepcopy(params)
    p["precision"].update(d_heads=[32], sigma_d_heads=[32], seq=16, accum_n=256, qk_stds_published={"iid": 1.0},
                          dtypes=["fp32", "fp16"])
    return p


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(), reason="needs the project's .venv")
def test_dvc_repro_without_activation_and_a_failed_stage_keeps_outputs(tmp_path):
    """`.venv/bin/dvc repro precision` with a PATH that lacks the venv (a clone whose .venv sits
    beside it) runs; then a bad param: exit != 0, the stage's one error line, the committed
    outputs byte for byte as they were."""
    repo = copy_repo(tmp_path / "repo")
    (repo / ".venv").symlink_to(REPO / ".venv")
    params = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    (repo / "params.yaml").write_text(yaml.safe_dump(_small_precision(params), allow_unicode=True, sort_keys=False),
                                      encoding="utf-8")
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path), "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(repo / "src")}
    dvc = lambda *a: subprocess.run([str(DVC), *a], cwd=repo, env=env, capture_output=True, text=True,  # noqa: E731
                                    timeout=300)
    assert dvc("init", "--no-scm", "-q").returncode == 0
    ok = dvc("repro", "precision")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    outs = ["metrics/precision.json", "metrics/env/precision.json", "plots/precision/forward.csv"]
    before = {f: (repo / f).read_bytes() for f in outs}

    bad = _small_precision(params)
    bad["precision"]["seq"] = 0
    (repo / "params.yaml").write_text(yaml.safe_dump(bad, allow_unicode=True, sort_keys=False), encoding="utf-8")
    failed = dvc("repro", "precision")
    assert failed.returncode != 0
    err = failed.stdout + failed.stderr
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("error: ")] == \
        ["error: precision.seq: got 0, expected a positive integer"], err
    assert {f: (repo / f).read_bytes() for f in outs} == before, "the committed outputs changed"
    assert not (repo / ".attnrepro-staging").exists()


# ---------------------------------------------------------------- heads.checkpoint is the dependency

def _stage_deps(repo: Path, stage: str) -> list[str]:
    from dvc.repo import Repo

    old = os.getcwd()
    os.chdir(repo)  # DVC resolves stage targets from the working directory
    try:
        with Repo(str(repo)) as r:
            (st,) = r.stage.collect(stage)
            return [str(d.def_path) for d in st.deps]
    finally:
        os.chdir(old)


def test_heads_dependency_follows_its_param(tmp_path):
    """dvc.yaml depends on ${heads.checkpoint}: point the param at another run, the dependency moves."""
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    for i, ckpt in enumerate((params["heads"]["checkpoint"], "data/train/d256_scaled/model.pt")):
        repo = tmp_path / f"repo{i}"
        repo.mkdir()
        shutil.copy(REPO / "dvc.yaml", repo / "dvc.yaml")
        subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=repo, check=True,
                       env={**os.environ, "DVC_NO_ANALYTICS": "1"})
        params["heads"]["checkpoint"] = ckpt
        (repo / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
        deps = _stage_deps(repo, "heads")
        assert ckpt in deps and not any(d.startswith("data/train/") and d != ckpt for d in deps), deps


# ---------------------------------------------------------------- dvc exp run -S keeps params.yaml

def dvc_set_params(text: str, overrides: list[str]) -> str:
    """What `dvc exp run -S <override> ...` does to params.yaml: DVC's own function for it,
    dvc.utils.hydra.apply_overrides (OmegaConf merge, then DVC's ruamel round trip)."""
    import tempfile

    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "params.yaml"
        path.write_text(text, encoding="utf-8")
        apply_overrides(str(path), overrides)
        return path.read_text(encoding="utf-8")


def _changed_lines(a: str, b: str) -> list[str]:
    return [ln for ln in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def test_params_yaml_is_a_fixed_point_of_dvcs_writer():
    """Written in DVC's writer's style (block lists, folded long strings, nothing after a list),
    so rewriting it changes nothing; a flow list or a comment after a list makes this fail."""
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    workers = yaml.safe_load(text)["engine"]["workers"]
    assert _changed_lines(text, dvc_set_params(text, [f"engine.workers={workers}"])) == []


@pytest.mark.parametrize("override,old,new", [
    ("train.lr=0.001", "  lr: 3.0e-3", "  lr: 0.001"),
    ("failures.steps=600", "  steps: 300", "  steps: 600"),
    ("corpus.vocab_size=1000", "  vocab_size: 1200", "  vocab_size: 1000"),
    ("precision.seq=32", "  seq: 64", "  seq: 32"),
    ("attention.impl=examples.attention.chunked:chunked_attention", "  impl: ''",
     "  impl: examples.attention.chunked:chunked_attention"),
])
def test_dvc_exp_set_param_changes_one_line(override, old, new):
    """`dvc exp run -S` rewrites params.yaml through DVC's YAML writer: the file comes back
    identical but for the line it sets (issue 13: it used to reformat every flow list)."""
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    diff = _changed_lines(text, dvc_set_params(text, [override]))
    assert len(diff) == 2, "\n".join(diff[:40])
    assert diff[0].startswith("-" + old) and diff[1].startswith("+" + new), diff


SECTIONS = [(name, section) for name, st in sorted(STAGES.items())
            for section in [p for p, _ in _entries(st.get("params", [])) if p == name]]


def _config_class(stage: str):
    import ast

    from conftest import load_stage_module

    tree = ast.parse((REPO / "stages" / f"{stage}.py").read_text(encoding="utf-8"))
    exprs = {ast.unparse(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) == "from_dict" or getattr(n.func, "attr", None) == "section")
             and n.args and ast.unparse(n.args[0]).endswith("Config")}
    return [eval(e, vars(load_stage_module(stage))) for e in sorted(exprs)]


@pytest.mark.parametrize("stage,section", SECTIONS, ids=[s for s, _ in SECTIONS])
def test_typo_in_set_param_is_rejected(stage, section, tmp_path):
    """`dvc exp run -S +<section>.typo=1` adds a key to params.yaml. The stage lists its whole section
    as params, so DVC reruns it, and its validation stops it: one line naming the key."""
    from attnrepro.config import ConfigError, from_dict

    text = dvc_set_params((REPO / "params.yaml").read_text(encoding="utf-8"), [f"+{section}.typo=1"])
    data = yaml.safe_load(text)
    assert data[section]["typo"] == 1
    classes = [c for c in _config_class(stage) if set(f for f in c.__dataclass_fields__) <= set(data[section])
               | {"typo"}]
    assert classes, f"{stage}: no config class reads section {section}"
    with pytest.raises(ConfigError, match=rf"^{section}\.typo: unknown key"):
        from_dict(classes[0], data[section], prefix=section)
