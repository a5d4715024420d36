"""Shared test helpers for attnrepro.

Small, documented API (others reuse it):

- ``REPO``: Path of the repository under test.
- ``make_fake_corpus(dest, n_files=4, poems_per_file=12, seed=0) -> dict[name, sha256]``:
  writes chinese-poetry-style JSON files (``poet.tang.<k>.json``, each a list of
  ``{"title", "author", "paragraphs"}``) into ``dest`` and returns the file names
  with their SHA-256, ready for ``corpus.files`` in params.
- ``copy_repo(dest, exclude=DEFAULT_EXCLUDE) -> Path``: copies the tracked and the
  untracked-but-not-ignored files of the repository (never .venv, data/,
  metrics/, plots/, dvc.lock by default) into ``dest``; returns ``dest``.
- ``run_script(script, *args, cwd, env=None, path=None, timeout=300)``: runs
  ``python <script> *args`` (script relative to ``cwd``) with this interpreter,
  importing ``attnrepro`` from ``cwd/src`` when it exists; returns the
  CompletedProcess (text mode, output captured).
- ``call_stage(name, *args, cwd) -> (exit_code, stdout, stderr)``: the same as
  running ``python stages/<name>.py *args`` in ``cwd`` (through ``run_stage``), but
  in this process: no second torch import, so a config check costs milliseconds.
- ``tiny_train_section(base)``: a copy of a params ``train`` section scaled down
  to seconds (keeps the variant names and the model keys).
- ``load_stage_module(name)``: imports ``stages/<name>.py`` by path (stages/ is not
  a package) and returns the module.
- ``output_files(root)``: the files a stage may have written under root
  (data/, metrics/, plots/), as sorted relative paths.
- ``optim(**overrides)``: an OptimConfig with the chapter's protocol (AdamW, decay on every
  parameter as §1.18.3, warm-up then cosine, clip 1.0), fields replaced by ``overrides``.
- ``unpad(text)``: ``text`` with every Markdown table line's column padding removed
  (``| a | b |``, separators ``| --- | --- |``), so a test can name a row by its cells.

Fixtures: ``fake_corpus`` (a directory and its hashes, as a namespace with
``.dir`` and ``.files``), ``repo_copy`` (a fresh copy of the repository) and
``one_thread`` (autouse, whole session: torch runs single-threaded, then the old
count is restored; tiny tensors on a shared 2-core machine are several times faster so).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_EXCLUDE = (".venv", "data", "metrics", "plots", "dvc.lock", ".dvc", ".git")

# 48 characters: more than a tiny vocabulary keeps, so coverage < 1 and <unk> occurs
_CHARS = "秦川雄帝宅函谷壯皇居綺殿千尋起離宮百雉餘連甍遙接漢飛觀迥凌虛雲日隱層闕風煙出綺疎春江花月夜"


def unpad(text: str) -> str:
    """Markdown tables in `text` without their column padding (formatting.md_table pads to align): each
    table line as ``| a | b |``, a separator as ``| --- | --- |``; escaped pipes stay inside their cell."""
    out = []
    for line in text.split("\n"):
        if len(line.rstrip()) > 1 and line.startswith("|") and line.rstrip().endswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.rstrip())[1:-1]]
            if cells and all(c and set(c) <= set("-:") for c in cells):
                cells = ["---"] * len(cells)
            line = "| " + " | ".join(cells) + " |"
        out.append(line)
    return "\n".join(out)


def make_fake_corpus(dest, n_files: int = 4, poems_per_file: int = 12, seed: int = 0) -> dict[str, str]:
    """Write fake Tang-poem JSON files into `dest`; return {file name: sha256}.

    Deterministic for a given seed. Character frequencies are skewed (a Zipf-like
    draw) so the tokenizer's ranking is non-trivial.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(_CHARS))]
    hashes = {}
    for f in range(n_files):
        poems = []
        for p in range(poems_per_file):
            lines = []
            for _ in range(4):
                half = lambda: "".join(rng.choices(_CHARS, weights, k=5))  # noqa: E731
                lines.append(f"{half()}，{half()}。")
            poems.append({"title": f"詩{f}-{p}", "author": "無名", "paragraphs": lines})
        name = f"poet.tang.{f * 1000}.json"
        path = dest / name
        path.write_text(json.dumps(poems, ensure_ascii=False, indent=1), encoding="utf-8")
        hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _repo_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()
    return sorted({f for f in out.split("\0") if f})


def copy_repo(dest, exclude=DEFAULT_EXCLUDE) -> Path:
    """Copy the repository's source files (see module doc) into `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for rel in _repo_files():
        top = rel.split("/", 1)[0]
        if top in exclude or rel in exclude or "__pycache__" in rel:
            continue
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree but still tracked
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    return dest


def _env(cwd: Path, env: dict | None, path: str | None) -> dict:
    e = dict(os.environ if env is None else env)
    src = Path(cwd) / "src"
    if src.is_dir():
        e["PYTHONPATH"] = str(src) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    if path is not None:
        e["PATH"] = path
    e.setdefault("DVC_NO_ANALYTICS", "1")
    e["PYTHONHASHSEED"] = "0"
    return e


def run_script(script, *args, cwd, env: dict | None = None, path: str | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python script args...` in `cwd` with this interpreter (see module doc)."""
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=cwd, env=_env(Path(cwd), env, path), capture_output=True, text=True, timeout=timeout,
    )



def tinygpt(**fields):
    """A ModelConfig: params.yaml's train.models.small (the chapter's TinyGPT) with `fields` changed
    (ModelConfig has no defaults: params.yaml states every model)."""
    import yaml

    from attnrepro.model.transformer import ModelConfig

    small = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["train"]["models"]["small"]
    return ModelConfig(**{"vocab_size": 1200, **small, **fields})

def call_stage(name: str, *args, cwd) -> tuple[int, str, str]:
    """Run stages/<name>.py as its own __main__ in-process (see module doc)."""
    import contextlib
    import io
    import runpy

    out, err = io.StringIO(), io.StringIO()
    old_cwd, old_argv = os.getcwd(), sys.argv
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = [f"stages/{name}.py", *map(str, args)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(REPO / "stages" / f"{name}.py"), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
    return code, out.getvalue(), err.getvalue()


def tiny_train_section(base: dict) -> dict:
    """Scale a params `train` section down to a few seconds per variant."""
    t = copy.deepcopy(base)
    t.update(
        steps=6, batch_size=4, warmup=2, diag_every=2, diag_steps=[0, 3], val_every=2,
        val_batches=2, loss_window=3, sample_tokens=5, threads=1, device="cpu",
    )
    for name, m in t["models"].items():  # d_head 8 (multi-head presets) or 16 (one head)
        heads = 1 if m.get("n_head", 1) == 1 else 2
        t["models"][name] = {**m, "block_size": 16, "d_model": 16, "n_head": heads, "n_layer": 2}
    return t


def load_stage_module(name: str, root: Path = REPO) -> types.ModuleType:
    """Import stages/<name>.py by path, registered in sys.modules (dataclass hints need it)."""
    modname = f"_attnrepro_stage_{name}"
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, Path(root) / "stages" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[modname]
        raise
    return mod


CHAPTER_OPTIM = dict(steps=1500, batch_size=32, optimizer="adamw", lr=3e-3, betas=[0.9, 0.95], weight_decay=0.1,
                     decay="all", schedule="cosine", warmup=100, min_lr_ratio=0.1, grad_clip=1.0)


def optim(**overrides):
    from attnrepro.run.loop import OptimConfig

    return OptimConfig(**{**CHAPTER_OPTIM, **overrides})


def output_files(root) -> list[str]:
    """Files under root/{data,metrics,plots}, relative to root, sorted."""
    root = Path(root)
    found = []
    for top in ("data", "metrics", "plots"):
        d = root / top
        if d.exists():
            found += [str(p.relative_to(root)) for p in d.rglob("*") if p.is_file()]
    return sorted(found)


@pytest.fixture
def fake_corpus(tmp_path):
    d = tmp_path / "fake_corpus"
    files = make_fake_corpus(d)
    return types.SimpleNamespace(dir=d, files=files)


@pytest.fixture
def repo_copy(tmp_path):
    return copy_repo(tmp_path / "repo")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def store_entry(name: str, files: dict[str, bytes]) -> tuple[str, dict[str, bytes]]:
    """A store entry as a run writes one: `files` plus a spec.json whose key document (here a stand-in
    naming `name`) hashes to the key it is filed under."""
    from attnrepro.store.run_store import key_of, spec_record

    document = {"spec": {"name": name}, "inputs": {}, "numerics": 1, "torch": "test"}
    key = key_of(document)
    return key, {**files, "spec.json": spec_record(document, key, name)}
