"""The sweep stages end to end on a tiny configuration: `dvc repro` of seeds, failures, critical,
qknorm, sensitivity and the choices arms in a copy of the repository (fake corpus, tiny models, a few steps)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import copy_repo, make_fake_corpus, tiny_train_section

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def dvc(*args, cwd):
    env = dict(os.environ, DVC_NO_ANALYTICS="1", PYTHONHASHSEED="0",
               PATH=str(BIN) + os.pathsep + os.environ.get("PATH", ""), PYTHONPATH=str(Path(cwd) / "src"))
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"dvc {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    repo = copy_repo(root / "repo")
    files = make_fake_corpus(root / "corpus")
    p = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    p["corpus"].update(source="local", local_dir=str(root / "corpus"), files=files, vocab_size=40)
    p["train"] = tiny_train_section(p["train"])
    p["failures"].update(steps=4, batch_size=4, warmup=2, val_batches=2, loss_window=2, spread_seeds=[1, 2],
                         model={**p["failures"]["model"], "block_size": 16, "d_model": 16, "n_head": 2, "n_layer": 2})
    p["seeds"]["seeds"] = [11, 12, 13]
    p["seeds"]["mode_statistic"] = "entropy_step3"  # a step the tiny runs record
    p["critical"].update(d_heads=[8, 16, 32], min_d_model=16, seeds=[11, 12, 13],
                         one_variable={"model": "large", "mode_statistic": "entropy_step3", "d_qks": [4, 8, 12, 16],
                                       "seeds": [11, 12, 13, 14]})
    p["qknorm"]["seeds"] = [11, 12, 13]
    p["choices"] = {"seeds": [11, 12, 13], "arms": {"no_breaks": {"newline": "drop"},
                                                    "no_decay": {"optim": {"weight_decay": 0.0}}}}
    p["sensitivity"].update(seeds=[11, 12, 13, 14, 15], combinations={},
                            choices={k: p["sensitivity"]["choices"][k]
                                     for k in ("no_weight_decay", "block_32", "val_first_10pct")})
    p["sensitivity"]["choices"]["block_32"] = {"model": {"block_size": 8}, "scope": "failures"}
    p["sensitivity"]["metrics"] = {"d256_scaled": ["loss_final", "entropy_final", "entropy_step3"],
                                   "d32_scaled": ["loss_final", "trained_w_qkv_fro_l0"],
                                   "failures_correct": ["entropy", "diag_weight"],
                                   "failures_mask_zero": ["loss_final"]}
    (repo / "params.yaml").write_text(yaml.safe_dump(p, allow_unicode=True, sort_keys=False), encoding="utf-8")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tiny"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True)
    dvc("init", "-q", cwd=repo)
    dvc("repro", "seeds", "sensitivity", "critical", "qknorm", "choices", cwd=repo)
    return repo


def load(repo, name):
    return json.loads((repo / "metrics" / f"{name}.json").read_text(encoding="utf-8"))


def test_seed_distribution(repo):
    dist = load(repo, "dist/train")
    assert dist["seeds"] == [11, 12, 13] and set(dist["runs"]) == {"11", "12", "13"}
    s = dist["stats"]["d32_scaled.loss_final"]
    assert s["n"] == 3 and s["min"] <= s["mean"] <= s["max"] and s["ci95_lo"] <= s["mean"] <= s["ci95_hi"]
    assert "log_sd" in dist["stats"]["d256_unscaled.entropy_final"]  # attention statistics: log scale
    head = load(repo, "seeds")
    assert head["n_seeds"] == 3 and "ci95_lo" in head["gap_ratio_of_means_loss_final"]
    for f in ("gaps.csv", "curves.csv", "bands.png", "gaps.png"):
        assert (repo / "plots/seeds" / f).stat().st_size > 0


def test_critical_curve(repo):
    m = load(repo, "critical")
    assert {"d8", "d16", "d32", "onset", "seeds"} <= set(m)
    assert m["d8"]["d_model"] == 16 and m["d32"]["d_model"] == 32
    from attnrepro.experiments.critical import CriticalConfig, planned_runs
    from attnrepro.experiments.protocol import TrainConfig
    from attnrepro.config import from_dict
    p = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    assert m["runs"] == planned_runs(from_dict(TrainConfig, p["train"], prefix="train"),
                                     from_dict(CriticalConfig, p["critical"], prefix="critical"))
    o = m["onset"]
    assert o["reached"] in (0, 1) and ("by_d_head" in o) == bool(o["reached"])
    if o["reached"]:  # a grid interval, never finer
        assert [o["after_d_head"], o["by_d_head"]] in ([8, 16], [16, 32])
    assert (repo / "plots/critical/gap_vs_logit_std.png").stat().st_size > 0
    # d_head 16 vs 8 at d_model 16: the unscaled logit std at init grows as sqrt(d_head), about 1.41x
    assert 1.15 < m["exercise1"]["logit_std_ratio_step0"]["mean"] < 1.75
    rows = (repo / "plots/critical/curve.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("d_head,") and len(rows) == 4
    # the onset is the rule (its own tests: test_stats) applied to the stage's own per-seed gaps
    import pandas as pd

    from attnrepro.stats import onset_interval
    per_seed = pd.read_csv(repo / "plots/critical/per_seed.csv").pivot(index="seed", columns="d_head",
                                                                      values="gap_loss_final")
    where = onset_interval([8, 16, 32], per_seed[[8, 16, 32]].to_numpy())
    assert (where is None) == (not o["reached"])
    if where:
        assert (o["after_d_head"], o["by_d_head"]) == where


def test_critical_one_variable_curve(repo):
    q = load(repo, "critical")["d_qk"]
    # only the q/k width moves: the tiny large preset (d_model 16, 1 head) at d_qk 4, 8, 12, 16
    assert (q["model"], q["d_model"], q["n_head"], q["d_head"], q["seeds"]) == ("large", 16, 1, 16, 4)
    assert {f"dqk{d}" for d in (4, 8, 12, 16)} <= set(q)
    o = q["onset"]
    assert o["reached"] in (0, 1) and ("by_d_qk" in o) == bool(o["reached"]) and o["baseline_gap_above_zero"] in (0, 1)
    if o["reached"]:  # a grid interval, never finer
        assert [o["after_d_qk"], o["by_d_qk"]] in ([4, 8], [8, 12], [12, 16])
    # the onset is the rule (its own tests: test_stats) applied to the stage's own per-seed gaps
    import pandas as pd

    from attnrepro.stats import onset_interval
    per_seed = pd.read_csv(repo / "plots/critical/qk_per_seed.csv").pivot(index="seed", columns="d_qk",
                                                                         values="gap_loss_final")
    where = onset_interval([4, 8, 12, 16], per_seed[[4, 8, 12, 16]].to_numpy())
    assert (where is None) == (not o["reached"])
    if where:
        assert (o["after_d_qk"], o["by_d_qk"]) == where
    for d in (4, 8, 12, 16):
        e = q[f"dqk{d}"]
        assert set(e["modes"]) == {"scaled", "unscaled"} and e["modes"]["scaled"]["statistic"] == "entropy_step3"
        assert e["gap_loss_final"]["ci95_lo"] <= e["gap_loss_final"]["mean"] <= e["gap_loss_final"]["ci95_hi"]
    # the logit std at init grows with d_qk alone (sqrt(d_qk) at init, same weights' scale)
    s = [q[f"dqk{d}"]["unscaled_logit_std_step0"]["mean"] for d in (4, 16)]
    assert 1.3 < s[1] / s[0] < 3.0
    rows = (repo / "plots/critical/qk_curve.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("d_qk,") and len(rows) == 5
    refs = (repo / "plots/critical/references.csv").read_text(encoding="utf-8").splitlines()
    assert len(refs) == 1 + 2 * 4  # the chapter's two models at each one-variable seed
    # the curve read as it is: the paired onset, the shape and the trends are the rules applied to these seeds
    from attnrepro.stats import curve_shape, paired_onset, trend
    r = q["reading"]
    where, p_holm = paired_onset([4, 8, 12, 16], per_seed[[4, 8, 12, 16]].to_numpy())
    assert r["paired_onset"]["reached"] == int(where is not None)
    assert list(r["paired_onset"]["p_holm"].values()) == pytest.approx(p_holm)
    at = None if where is None else [4, 8, 12, 16].index(int(where[1]))
    assert r["shape"]["shape"] == curve_shape([4, 8, 12, 16], per_seed[[4, 8, 12, 16]].to_numpy(), at)["shape"]
    assert r["trend"]["gap_loss_final_all"]["slope"] == pytest.approx(
        trend([4, 8, 12, 16], per_seed[[4, 8, 12, 16]].to_numpy())["slope"], rel=1e-6)
    for t in r["trend"].values():
        assert t["ci_lo"] <= t["slope"] <= t["ci_hi"] and t["p"] <= t["p_holm"] <= 1
    assert "unscaled_entropy_final_l1" in q["dqk4"]  # layer 1 is measured too
    m = load(repo, "critical")
    assert "paired_onset" in m["reading"]
    from attnrepro.report import critical_curve
    fits = critical_curve.fits(repo / "plots")
    text = critical_curve.report_markdown(m, fits)
    assert "the paired one" in text and "**Mixed width**" in text and "Both arms" in critical_curve.answer(m, fits)


def test_qknorm_forms(repo):
    m = load(repo, "qknorm")
    p = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))["qknorm"]
    assert set(m) == set(p["references"]) | set(p["forms"])
    for form in m.values():
        assert form["seeds"] == 3 and math.isfinite(form["loss_final"]["mean"])


def test_sensitivity_effects(repo):
    m = load(repo, "sensitivity")
    p = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))["sensitivity"]
    design = m.pop("design")
    assert {v: sorted(ms) for v, ms in m.items()} == {v: sorted(ms) for v, ms in p["metrics"].items()}
    assert design["seeds"] == 5 and design["correction"] == "holm"
    # block_32 is failures-only: 2 train variants x 2 choices + 2 failures variants x 3 choices, per metric
    assert design["cells"] == 3 * 2 + 2 * 2 + 2 * 3 + 1 * 3
    assert design["runs"] == 5 * (4 + 4 + 4 + 2)  # baseline 4 variants, 2 choices x 4, block_32 x 2
    for v, metrics in m.items():
        for rows in metrics.values():
            want = {"baseline", "no_weight_decay", "val_first_10pct"} | ({"block_32"} if v.startswith("failures_")
                                                                         else set())
            assert set(rows) == want
            assert rows["baseline"]["n"] == 5 and rows["baseline"]["pi_lo"] <= rows["baseline"]["pi_hi"]
            for c in want - {"baseline"}:
                r = rows[c]
                assert r["ci_lo"] <= r["diff"] <= r["ci_hi"] and r["p"] <= r["p_holm"] <= 1 and r["se"] >= 0


def test_a_second_repro_trains_nothing(repo):
    out = dvc("repro", "-f", "-s", "critical", cwd=repo).stdout
    # mixed width 3 x 2 x 3 = 18, one variable 4 x 2 x 4 = 32, the chapter's variants 4 x 4 = 16, less the runs
    # they share (one spec, one run): the tiny large preset (d_model 16, 1 head) is the d_qk-16 point and the mixed
    # d_head-16 point (8 + 6 runs), the tiny small preset the mixed d_head-8 point (6 runs)
    assert "46 runs, 46 in the store" in out, out


@pytest.mark.parametrize("change, message", [
    ({"choices": {"typo": {"optim": {"wd": 0.0}}}}, "sensitivity.choices.typo.optim"),
    ({"choices": {"baseline": {"optim": {"weight_decay": 0.0}}}}, "none named 'baseline'"),
    ({"seeds": [1, 2]}, "at least 5 different seeds"),
    ({"metrics": {"d256_scaled": ["loss_finale"]}}, "sensitivity.metrics.d256_scaled: loss_finale"),
    ({"metrics": {"failures_correct": ["diag_weight_all_rows_half_block"]}}, "diag_weight_all_rows_half_block"),
    ({"metrics": {"d32_scaled": ["entropy_step222"]}}, "sensitivity.metrics.d32_scaled: entropy_step222"),
    ({"metrics": {"failures_typo": ["entropy"]}}, "sensitivity.metrics: got 'failures_typo'"),
])
def test_a_bad_sensitivity_param_stops_it_before_any_run(repo, tmp_path, change, message):
    p = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    p["sensitivity"].update(change)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(p, allow_unicode=True, sort_keys=False), encoding="utf-8")
    runs = sorted((repo / "runs").rglob("summary.json"))
    env = dict(os.environ, PYTHONPATH=str(repo / "src"))
    proc = subprocess.run([sys.executable, "stages/sensitivity.py", "--params", str(params)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert sorted((repo / "runs").rglob("summary.json")) == runs  # nothing trained


def test_check_makes_each_sweep_again_from_the_store(repo, tmp_path):
    """Issue 39: a sweep's metrics are aggregates over runs, so attnrepro check makes each sweep again
    from the run store (--store-only, nothing trained) and compares: the remade outputs equal the
    committed ones; an edited aggregate and an edited CSV are named, one line each; with the runs gone
    from the store each sweep is a note, and nothing trains."""
    from attnrepro.envinfo import environment
    from attnrepro.files import read_params
    from attnrepro.judge.claims import load_json_dir
    from attnrepro.provenance.records import sweep_findings

    params, envs = read_params(repo / "params.yaml"), load_json_dir(repo / "metrics" / "env")
    seen: list[str] = []
    here = Path.cwd()
    os.chdir(repo)
    try:  # as attnrepro check calls it: the checkout as a relative path
        assert sweep_findings(Path("."), params, envs, environment, seen.append) == ([], [])
    finally:
        os.chdir(here)
    assert sorted(line.split()[1] for line in seen) == ["choices@no_breaks", "choices@no_decay", "critical", "qknorm",
                                                        "seeds", "sensitivity"]

    crit, gaps = repo / "metrics/critical.json", repo / "plots/seeds/gaps.csv"
    saved = crit.read_bytes(), gaps.read_bytes()
    try:
        m = json.loads(saved[0])
        m["d_qk"]["dqk8"]["gap_loss_final"]["mean"] += 0.25
        crit.write_text(json.dumps(m), encoding="utf-8")
        gaps.write_bytes(saved[1].replace(b"\n", b"\n ", 1))
        problems, _ = sweep_findings(repo, params, envs, environment)
    finally:
        crit.write_bytes(saved[0])
        gaps.write_bytes(saved[1])
    assert len(problems) == 2, problems
    crit_line = next(p for p in problems if p.startswith("metrics/critical.json: d_qk.dqk8.gap_loss_final.mean = "))
    assert "made again from the run store's records it is" in crit_line
    assert "plots/seeds/gaps.csv differs from the one made again from the run store's records" in problems

    empty = tmp_path / "store"
    empty.mkdir()
    seen.clear()
    problems, notes = sweep_findings(repo, {**params, "engine": {**params["engine"], "store": str(empty)}}, envs,
                                     environment, seen.append)
    assert problems == [] and len(notes) == 6 and all("runs are not in the store" in n for n in notes), notes
    assert seen == []  # nothing said "made again" that was not (issue 66: three such lines, then "not made again")
    assert not list(empty.rglob("summary.json"))


def test_choices_arms_each_a_stage(repo):
    """Each arm of choices.arms is its own stage (choices@<arm>): its runs (4 variants x 3 seeds), its cells
    against the seeds stage's runs at the same seeds, one Holm family per arm; the text arm trains on
    another token stream, the decay arm on the protocol's."""
    for arm in ("no_breaks", "no_decay"):
        m = load(repo, f"choices_{arm}")
        assert m["design"] == {"seeds": 3, "alpha": 0.05, "tests": 11, "runs": 12,
                               "correction": "Holm over the arm's cells"}
        assert set(m["arm"]) == set(m["baseline"]) and "d256_unscaled.entropy_step3" in m["arm"]
        assert all(0 <= e["p"] <= e["p_holm"] <= 1 for c, e in m["arm"].items() if c != "gap_ratio")
        assert sorted(c for c in m["arm"] if c.startswith("gap_d")) == ["gap_d16", "gap_d8"]  # the tiny presets
        assert "p" not in m["baseline"]["gap_d16"] and set(m["arm"]["gap_ratio"]) >= {"value", "bounded"}
        rows = (repo / "plots" / "choices" / f"{arm}.csv").read_text(encoding="utf-8").splitlines()
        assert len(rows) == 1 + 2 * 3 and rows[1].startswith("baseline,11,") and rows[4].startswith(f"{arm},11,")
    runs = load(repo, "dist/train")["runs"]  # the baseline is the seeds stage's runs
    assert load(repo, "choices_no_decay")["baseline"]["d32_scaled.loss_final"]["mean"] == pytest.approx(
        sum(runs[s]["d32_scaled"]["loss_final"] for s in ("11", "12", "13")) / 3)


@pytest.mark.parametrize("name, pngs", [("seeds", ("bands", "gaps", "points", "runs")), ("qknorm", ("forms",))])
def test_figures_only_redraws_the_sweeps_figures_from_its_tables(repo, name, pngs):
    """A sweep draws its PNGs from its tables as written, so --figures-only (no runs, no store) draws
    the same bytes from the files alone, and writes nothing else."""
    drawn = {p: (repo / "plots" / name / f"{p}.png").read_bytes() for p in pngs}
    others = {f: f.read_bytes() for f in (repo / "plots" / name).glob("*.csv")}
    env = dict(os.environ, PYTHONPATH=str(repo / "src"))
    proc = subprocess.run([sys.executable, f"stages/{name}.py", "--figures-only", "--store", str(repo / "no_store")],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {p: (repo / "plots" / name / f"{p}.png").read_bytes() for p in pngs} == drawn
    assert {f: f.read_bytes() for f in others} == others and not (repo / "no_store").exists()
