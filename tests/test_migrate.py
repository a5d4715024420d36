"""`attnrepro store migrate`: entries made under the code-digest key move to the numerics-version key."""

import json

import pytest

from attnrepro.files import dumps_json
from attnrepro.run.store_migrate import VERSION_OF_CODE, migrate
from attnrepro.run.execute import execute_to_bytes, key_document, run_key
from attnrepro.store.run_store import RunStore
from attnrepro.run.engine import run_sweep
from test_sweep import engine, tiny_inputs, tiny_spec

pytestmark = pytest.mark.slow
OLD_DIGEST = next(iter(VERSION_OF_CODE["corpus_lm"]))


def old_entry(spec, inputs) -> dict[str, bytes]:
    """A result as the code of 372ac46 stored it: spec.json keyed by the code digest, written through the
    metrics rounding (booleans as 0/1), its measurement naming only what it switched on."""
    files = execute_to_bytes(spec, inputs)
    doc = key_document(spec, inputs)
    material = doc["spec"]
    material["measure"] = {k: v for k, v in material["measure"].items() if v not in (False, None, [])}
    record = {"spec": material, "inputs": doc["inputs"], "code": OLD_DIGEST, "torch": doc["torch"],
              "label": spec.label}
    return {**files, "spec.json": dumps_json(record).encode()}


def test_migrate_rekeys_old_entries_and_the_sweep_then_trains_nothing(tmp_path):
    spec, inputs = tiny_spec(), tiny_inputs()
    store = RunStore(tmp_path / "store")
    store.put("0" * 64, old_entry(spec, inputs))
    foreign = old_entry(tiny_spec(seed=1), inputs)
    record = json.loads(foreign["spec.json"])
    foreign["spec.json"] = dumps_json({**record, "code": "f" * 64}).encode()  # code no version names
    store.put("1" * 64, foreign)

    result = migrate(store)
    assert (result.moved, result.current, result.other_version, result.damaged) == (1, 0, 1, [])
    assert store.get(run_key(spec, inputs), full=True) is not None and store.get("0" * 64) is None
    assert store.path("1" * 64).is_dir()  # left where it was: no key of this code names it, so never served
    assert [k for k, _ in store.verify().legacy] == ["1" * 64]
    again = migrate(store)
    assert (again.moved, again.current, again.other_version) == (0, 1, 1)

    (rec,) = run_sweep("t", [spec], inputs, engine(tmp_path, workers=1))
    assert rec.cached and rec.status == "ok"
    stored = json.loads((rec.path / "spec.json").read_text(encoding="utf-8"))
    assert stored["numerics"] == 1 and stored["key"] == rec.key and "code" not in stored


def test_the_command_prints_one_line_and_exits_0(tmp_path):
    import subprocess
    import sys

    (tmp_path / "store").mkdir()
    p = subprocess.run([sys.executable, "-m", "attnrepro.commands.main", "store", "migrate", "--store", str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == ("store migrate: 0 re-keyed, 0 already current, 0 of another "
                                                 "numerics version left as they are, 0 damaged or legacy skipped")
