"""The failures stage end to end on a tiny model and a synthetic token stream:
the metrics contract, the seed spread, determinism and bad input."""

import copy
import csv
import json

import numpy as np
import pytest
import yaml
from conftest import REPO, call_stage

from attnrepro.model.attention import BUGS
from attnrepro.experiments.failures import SYMPTOMS

VOCAB = 40


@pytest.fixture()
def workdir(tmp_path):
    corpus = tmp_path / "data" / "corpus"
    corpus.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(corpus / "train.npy", rng.integers(2, VOCAB, 3000).astype(np.uint16))
    np.save(corpus / "val.npy", rng.integers(2, VOCAB, 600).astype(np.uint16))
    (corpus / "vocab.json").write_text(json.dumps(["<pad>", "<unk>"] + [f"c{i}" for i in range(VOCAB - 2)]))
    return tmp_path


PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
REF_SEED = PARAMS["failures"]["seed"]


def write_params(workdir, **overrides) -> None:
    params = copy.deepcopy(PARAMS)
    params["failures"].update(steps=4, batch_size=4, warmup=2, val_batches=2, loss_window=2, threads=1,
                              device="cpu", model={**PARAMS["failures"]["model"], "block_size": 16, "d_model": 16, "n_head": 2,
                                     "n_layer": 2},
                              spread_seeds=[1])
    params["failures"].update(overrides)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")


def run(workdir):
    return call_stage("failures", "--params", "params.yaml", cwd=workdir)


def test_symptom_table_with_seed_spread_and_deterministic(workdir):
    write_params(workdir)
    code, out, err = run(workdir)
    assert code == 0, err
    metrics_path = workdir / "metrics" / "failures.json"
    m = json.loads(metrics_path.read_text())
    assert set(m) == set(BUGS)
    dist = json.loads((workdir / "metrics" / "dist" / "failures.json").read_text())
    assert dist["seeds"] == [REF_SEED, 1] and set(dist["runs"]) == {str(REF_SEED), "1"}
    for v in BUGS:
        assert 0 < m[v]["diag_weight_all_rows_half_block"] <= 1
        for k in SYMPTOMS:
            st = dist["stats"][f"{v}.{k}"]
            assert st["n"] == 2 and st["min"] <= m[v][k] <= st["max"]
            assert dist["runs"][str(REF_SEED)][v][k] == m[v][k]  # the table's run is the reference seed's
    with open(workdir / "plots" / "failures" / "seeds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * len(BUGS)
    assert {int(r["seed"]) for r in rows} == {REF_SEED, 1}
    by_seed = {int(r["seed"]): float(r["loss_final"]) for r in rows if r["variant"] == "correct"}
    assert by_seed[REF_SEED] == m["correct"]["loss_final"]  # the table's run is the reference seed's
    assert by_seed[1] != by_seed[REF_SEED]  # the extra seed really trained another model

    first = metrics_path.read_bytes()
    code, _, err = run(workdir)
    assert code == 0, err
    assert metrics_path.read_bytes() == first


@pytest.mark.parametrize("seeds", [[REF_SEED], [1, 1]])
def test_bad_spread_seeds_stop_before_any_output(workdir, seeds):
    write_params(workdir, spread_seeds=seeds)
    code, _, err = run(workdir)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "failures.spread_seeds" in err
    assert not (workdir / "metrics").exists() and not (workdir / "plots").exists()
