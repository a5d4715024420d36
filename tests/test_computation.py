"""The check's first question, same computation? (provenance.computation, run.fingerprint): what it
compares, against which revision's files, and that a change of the computation is seen."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from attnrepro.provenance import computation
from attnrepro.provenance.lock import out_md5
from attnrepro.provenance import fingerprint
from attnrepro.run import golden
from conftest import REPO, copy_repo

spec = importlib.util.spec_from_file_location("gate_power", REPO / "benchmarks" / "gate_power.py")
gp = importlib.util.module_from_spec(spec)
sys.modules["gate_power"] = gp
spec.loader.exec_module(gp)

NAMES = [*sorted(golden.cases()), fingerprint.NAME]


@pytest.fixture(scope="module")
def values():
    return computation.current_values()


def committed(name: str) -> dict:
    return json.loads(golden.path(name).read_text(encoding="utf-8"))


def reader(files: dict):
    return lambda path: files.get(path)


def reference_files(**changed) -> dict:
    out = {f"tests/golden/{n}.json": golden.path(n).read_text(encoding="utf-8") for n in NAMES}
    out.update({f"tests/golden/{n}.json": json.dumps(v) for n, v in changed.items()})
    return out


def tree(tmp_path, **changed):
    """A tree holding tests/golden/ as committed, with `changed` files rewritten."""
    (tmp_path / "tests").mkdir(exist_ok=True)
    folder = tmp_path / "tests" / "golden"
    if not folder.exists():
        import shutil
        shutil.copytree(golden.GOLDEN, folder)
    for n, v in changed.items():
        (folder / f"{n}.json").write_text(json.dumps(v), encoding="utf-8")
    return tmp_path


def test_the_code_as_committed_is_the_same_computation(tmp_path, values):
    c = computation.same_computation(reader(reference_files()), tree(tmp_path), {}, values=values)
    assert (c.answer, c.moved, c.declared, c.runs, c.probes) == ("unchanged", [], [], len(NAMES) - 1,
                                                                 len(fingerprint.PROBES))
    assert c.line("HEAD").startswith(f"same computation: yes ({len(NAMES) - 1} golden runs, {len(fingerprint.PROBES)} "
                                     "fingerprint probes and the corpus checksums against HEAD)")
    assert c.problems("HEAD") == []


def test_a_moved_value_is_an_undeclared_change_named_by_its_probe(tmp_path, values):
    moved = json.loads(json.dumps(values))
    moved["fingerprint"]["training"]["history"][2]["loss"] *= 1 + 1e-7  # far below golden's 1e-4, above 1e-9
    c = computation.same_computation(reader(reference_files()), tree(tmp_path), {}, values=moved)
    assert c.answer == "changed" and c.moved == [c.own[0]]
    assert c.moved[0].startswith("fingerprint training: history[2].loss: ")
    (line,) = c.problems("abc123")
    assert "an undeclared change" in line and "bump NUMERICS and regenerate" in line


def test_regenerated_golden_files_are_a_declared_change_judged_against_the_reference(tmp_path, values):
    """The tree's golden files (regenerated, NUMERICS bumped) agree with its code; the reference's are older."""
    new = json.loads(json.dumps(values))
    new["corpus_lm"]["numerics"] += 1
    new["corpus_lm"]["summary"]["loss_final"] *= 1.01
    c = computation.same_computation(reader(reference_files()), tree(tmp_path, corpus_lm=new["corpus_lm"]), {},
                                     values=new)
    assert c.answer == "changed, declared" and c.own == [] and c.declared == ["tests/golden/corpus_lm.json"]
    assert c.moved and all(m.startswith("golden corpus_lm: ") for m in c.moved)
    assert "a declared change" in c.line("HEAD") and "tests/golden/corpus_lm.json" in c.line("HEAD")
    assert c.problems("HEAD") == []  # the second question judges it
    # golden files regenerated but the code moved on again: its own golden files disagree, a problem
    c = computation.same_computation(reader(reference_files()), tree(tmp_path, corpus_lm=new["corpus_lm"]), {},
                                     values=values)
    assert c.answer == "unchanged" and c.problems("HEAD")[0].endswith("(against this tree's own tests/golden)")


def test_a_reference_without_golden_files_is_not_judged(tmp_path, values):
    c = computation.same_computation(reader({}), tree(tmp_path), {}, values=values)
    assert c.runs + c.probes == 0 and c.answer == "unchanged" and c.line("v0") == ""


def test_an_unreadable_reference_file_is_named(tmp_path, values):
    files = reference_files()
    files["tests/golden/reversal.json"] = "{\udcff"
    with pytest.raises(computation.UserError, match="the reference's tests/golden/reversal.json cannot be read"):
        computation.same_computation(reader(files), tree(tmp_path), {}, values=values)


def test_the_corpus_checksum_is_gated_against_the_reference_lock(tmp_path, values):
    corpus = tmp_path / "data" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "val.npy").write_bytes(b"123")
    lock = {"stages": {"corpus": {"outs": [{"path": "data/corpus", "md5": out_md5(corpus)}]}}}
    args = (reader(reference_files()), tree(tmp_path))
    assert computation.same_computation(*args, lock, values=values).answer == "unchanged"
    (corpus / "val.npy").write_bytes(b"124")
    c = computation.same_computation(*args, lock, values=values)
    assert c.answer == "changed" and c.moved[0].startswith("checksum data/corpus: md5 ")
    # the corpus stage ran with other params: a declared change, listed by the check apart
    assert computation.same_computation(*args, lock, {"corpus"}, values=values).answer == "unchanged"


def test_the_training_probe_engages_clipping_and_generation_agrees_with_its_cache():
    f = json.loads(golden.path(fingerprint.NAME).read_text(encoding="utf-8"))
    assert all(row["grad_norm"] > 1.0 for row in f["training"]["history"])  # clipping at 1.0 acts on every step
    assert f["generation"]["plain"] == f["generation"]["kv_cache"]
    assert f["softmax"] == {**f["softmax"], "finite": True, "logits_absmax_over_100": True, "close_to_float64": True}
    assert "\n" not in f["corpus"]["itos"]  # the chapter's rule: newline is not counted into the vocabulary


@pytest.mark.parametrize("name", ["val_first", "newline_counted", "softmax_no_max", "val_half_batches"])
def test_the_golden_tests_fail_on_a_change_of_the_computation(name, tmp_path):
    """The mutant of the gate matrix applied to a copy of the repository: its golden tests fail."""
    copy = copy_repo(tmp_path / "repo")
    gp.apply(gp.CASES[name], copy)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_golden.py"],
                       cwd=copy, env={**__import__("os").environ, "PYTHONPATH": str(copy / "src")},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:]
    assert "failed" in p.stdout.splitlines()[-1]
