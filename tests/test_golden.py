"""The golden outputs (attnrepro.run.golden): every task's numbers are those of its numerics version."""

import json

import pytest

from attnrepro.provenance import fingerprint
from attnrepro.run import golden
from attnrepro.run.execute import NUMERICS

CASES = golden.cases()


def test_every_task_has_a_golden_case():
    assert {spec.task for spec in CASES.values()} == set(NUMERICS)
    assert sorted(p.stem for p in golden.GOLDEN.glob("*.json")) == sorted([*CASES, fingerprint.NAME])


def test_the_fingerprint_holds():
    expected = json.loads(golden.path(fingerprint.NAME).read_text(encoding="utf-8"))
    assert fingerprint.differences(expected, fingerprint.compute()) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_numbers_hold(name):
    expected = json.loads(golden.path(name).read_text(encoding="utf-8"))
    problem = golden.verdict(name, expected, golden.run_case(CASES[name]))
    if problem:
        pytest.fail(problem, pytrace=False)


def test_a_moved_number_names_the_task_and_the_way_out():
    expected = json.loads(golden.path("reversal").read_text(encoding="utf-8"))
    moved = json.loads(json.dumps(expected))
    moved["summary"]["test_loss" if "test_loss" in moved["summary"] else "loss_start"] *= 1 + 3 * golden.RTOL
    line = golden.verdict("reversal", expected, moved)
    assert line.startswith("golden reversal: numbers moved (summary.") and "bump NUMERICS['reversal'] and " \
        "regenerate (python scripts/golden.py)" in line and "\n" not in line
    within = json.loads(json.dumps(expected))
    within["history"][3]["loss"] *= 1 + golden.RTOL_MEASURED
    assert golden.verdict("reversal", expected, within) is None
    assert "is for NUMERICS['reversal'] = 0" in golden.verdict("reversal", {**expected, "numerics": 0}, expected)
