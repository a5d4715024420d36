"""benchmarks/gate_power.py: every mutant still applies to the code, and its params edits are what DVC's writer would write."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml

from attnrepro.stats import holm_adjusted
from conftest import REPO

spec = importlib.util.spec_from_file_location("gate_power", REPO / "benchmarks" / "gate_power.py")
gp = importlib.util.module_from_spec(spec)
sys.modules["gate_power"] = gp  # dataclasses look their module up
spec.loader.exec_module(gp)


@pytest.mark.parametrize("case", gp.MUTANTS, ids=lambda c: c.name)
def test_every_mutant_matches_the_code_exactly_once_and_changes_it(case, tmp_path):
    src = REPO / case.path
    assert src.read_text(encoding="utf-8").count(case.old) == 1, f"{case.name}: update the mutant to the code"
    (tmp_path / case.path).parent.mkdir(parents=True)
    (tmp_path / case.path).write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    gp.apply(case, tmp_path)
    assert (tmp_path / case.path).read_text(encoding="utf-8") != src.read_text(encoding="utf-8")
    assert case.expect in ("harmful", "harmless") and set(case.stages) <= set(yaml.safe_load(
        (REPO / "dvc.yaml").read_text())["stages"])


def test_enough_cases_of_each_kind():
    assert len(gp.MUTANTS) >= 12 and len(gp.FAITHFUL) >= 3
    assert {c.area for c in gp.MUTANTS} >= {"attention", "model", "init", "optimizer", "schedule", "data split",
                                            "tokenizer"}
    assert any(c.expect == "harmless" for c in gp.MUTANTS)


def test_every_case_declares_both_answers_before_it_runs():
    """Issue 62: each case's answer to both questions is written in the file before its run: the first question
    changed / unchanged (a faithful case unchanged), the second DIFFERENT / not DIFFERENT with its reason (a
    faithful case never DIFFERENT)."""
    for c in gp.CASES.values():
        assert c.first in ("changed", "unchanged") and c.second[0] in ("DIFFERENT", "not DIFFERENT") and c.second[1]
        if c.expect == "faithful":
            assert (c.first, c.second[0]) == ("unchanged", "not DIFFERENT"), c.name
    assert sum(c.second[0] == "DIFFERENT" for c in gp.CASES.values()) >= 4


def test_params_are_set_line_by_line_lists_included(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    before = (tmp_path / "params.yaml").read_text(encoding="utf-8").splitlines()
    gp.set_params(tmp_path, {"train.threads": 3, "engine.store": "/tmp/x", "seeds.seeds": [20261014, 1]})
    after = (tmp_path / "params.yaml").read_text(encoding="utf-8")
    p = yaml.safe_load(after)
    assert (p["train"]["threads"], p["engine"]["store"], p["seeds"]["seeds"]) == (3, "/tmp/x", [20261014, 1])
    changed = [ln for ln in after.splitlines() if ln not in before]
    assert len(changed) == 3, changed  # one line each; the list's old items are gone, comments kept
    with pytest.raises(KeyError):
        gp.set_params(tmp_path, {"train.no_such_key": 1})


def test_holm_adjusted_p_values():
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_adjusted([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm_adjusted([]) == []


def test_results_of_another_reference_are_not_mixed_in(tmp_path, monkeypatch, capsys):
    """A results file judged against another revision starts afresh; --seeds findings survive a case run."""
    results = tmp_path / "gate_power.json"
    monkeypatch.setattr(gp, "RESULTS", results)
    rev = gp.sh(["git", "rev-parse", "HEAD"], gp.ROOT).stdout.strip()
    results.write_text(json.dumps({"reference": "0" * 40, "results": [{"case": "avx2", "expect": "faithful"}]}))
    monkeypatch.setattr(gp, "run_case", lambda case, r, keep, decide=0: {
        "case": case.name, "area": case.area, "expect": case.expect, "verdict": "PASS", "golden_test": "PASS",
        "seconds": 1.0, "caught_by": []})
    assert gp.main(["--cases", "no_simd"]) == 0
    out = json.loads(results.read_text())
    assert out["reference"] == rev and [r["case"] for r in out["results"]] == ["no_simd"]
    assert "starting afresh" in capsys.readouterr().out

    out["seeds"] = {"gelu_tanh": {"harmless": True}}
    results.write_text(json.dumps(out))
    assert gp.main(["--cases", "avx2"]) == 0
    out = json.loads(results.read_text())
    assert [r["case"] for r in out["results"]] == ["no_simd", "avx2"] and out["seeds"] == {"gelu_tanh": {"harmless": True}}


def test_resume_skips_the_cases_already_judged_and_reruns_an_error(tmp_path, monkeypatch, capsys):
    results = tmp_path / "gate_power.json"
    monkeypatch.setattr(gp, "RESULTS", results)
    rev = gp.sh(["git", "rev-parse", "HEAD"], gp.ROOT).stdout.strip()
    def record(case, verdict="PASS"):
        return {"case": case.name, "area": case.area, "expect": case.expect, "verdict": verdict,
                "golden_test": "PASS", "seconds": 1.0, "caught_by": []}
    results.write_text(json.dumps({"reference": rev, "results": [
        record(gp.CASES["avx2"]), record(gp.CASES["no_simd"], "ERROR")]}))
    ran = []

    def run_case(case, r, keep, decide=0):
        ran.append(case.name)
        return record(case)
    monkeypatch.setattr(gp, "run_case", run_case)
    assert gp.main(["--cases", "avx2,no_simd,avx2_serial", "--resume"]) == 0
    assert ran == ["no_simd", "avx2_serial"] and "already judged" in capsys.readouterr().out
    assert [r["case"] for r in json.loads(results.read_text())["results"]] == ["avx2", "no_simd", "avx2_serial"]


def test_a_crash_that_is_not_the_changes_is_an_error_never_a_catch():
    assert gp.stage_failure("train", "train: 1 of 4 runs did not finish: d32: diverged (diverged at step 9)")["verdict"] == "FAIL"
    assert gp.stage_failure("corpus", "ERROR: failed to reproduce 'corpus': npm pack exited 1")["verdict"] == "ERROR"
    results = [{"expect": "faithful", "verdict": "ERROR", "golden_test": "PASS", "seconds": 60},
               {"expect": "harmful", "verdict": "FAIL", "golden_test": "PASS", "seconds": 60}]
    lines = gp.confusion(results).splitlines()
    faithful = next(x for x in lines if x.startswith("faithful")).split()
    assert faithful[1:4] == ["0", "0", "1"]  # FAIL 0, PASS 0, ERROR 1


def test_the_matrix_counts_the_five_seed_failures_of_the_cases_that_ran_there():
    results = [{"case": c, "expect": "harmful", "verdict": "PASS", "golden_test": "FAIL", "seconds": 60} for c in "abcde"]
    seeds = {"a": {"check": {"verdict": "FAIL"}}, "b": {"check": {"verdict": "PASS"}}, "c": {"check": {"verdict": "FAIL"}},
             "d": {"check": {"verdict": "ERROR"}}}
    harmful = next(x for x in gp.confusion(results, seeds).splitlines() if x.startswith("harmful"))
    assert harmful.endswith("2 of 4")
    assert next(x for x in gp.confusion(results).splitlines() if x.startswith("harmful")).endswith("0 of 0")


def test_a_trial_writes_its_own_file_and_another_references_results_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(gp, "RESULTS", tmp_path / "gate_power.json")
    gp.RESULTS.write_text(json.dumps({"reference": "a" * 40, "results": [{"case": "x"}]}))
    assert gp.load_results("b" * 40) == {"results": []}
    assert json.loads((tmp_path / f"gate_power.{'a' * 10}.json").read_text())["results"] == [{"case": "x"}]


def test_two_runs_at_once_each_keep_the_others_cases(tmp_path, monkeypatch):
    monkeypatch.setattr(gp, "RESULTS", tmp_path / "gate_power.json")
    rev = "a" * 40
    gp.save(rev, lambda d: gp._put(d["results"], {"case": "x", "verdict": "ERROR"}))
    gp.save(rev, lambda d: gp._put(d["results"], {"case": "y", "verdict": "PASS"}))  # another run, read afresh
    gp.save(rev, lambda d: d.setdefault("seeds", {}).__setitem__("y", {"verdict": "harmless"}))
    gp.save(rev, lambda d: gp._put(d["results"], {"case": "x", "verdict": "FAIL"}))  # a rerun replaces in place
    saved = json.loads(gp.RESULTS.read_text())
    assert saved["reference"] == rev
    assert saved["results"] == [{"case": "x", "verdict": "FAIL"}, {"case": "y", "verdict": "PASS"}]
    assert saved["seeds"] == {"y": {"verdict": "harmless"}}


def test_seed_effects_call_a_mutant_harmless_only_when_every_interval_is_inside_one_seed_sd():
    seeds = [1, 2, 3, 4, 5]
    theirs = {s: {"loss_final": 4.0 + 0.1 * (s % 3), "entropy_final": 0.5 + 0.01 * s} for s in seeds}
    ref = {"loss_final": {"sd": 0.1}, "entropy_final": {"sd": 0.03, "log_sd": 0.06}}
    keys = ["entropy_final", "loss_final"]
    tiny = {s: {"loss_final": v["loss_final"] + 0.001 * (-1) ** s, "entropy_final": v["entropy_final"]}
            for s, v in theirs.items()}
    assert gp.seed_effects(tiny, theirs, ref, keys)["verdict"] == "harmless"
    shifted = {s: {**v, "loss_final": v["loss_final"] + 0.5 + 0.001 * s} for s, v in theirs.items()}
    assert gp.seed_effects(shifted, theirs, ref, keys)["verdict"] == "moved"
    # noisy paired differences with no consistent sign: nothing found, nothing shown either
    noisy = {s: {**v, "loss_final": v["loss_final"] + 0.15 * (-1) ** s} for s, v in theirs.items()}
    r = gp.seed_effects(noisy, theirs, ref, keys)
    assert r["verdict"] == "inconclusive" and r["not_within_noise"] == ["loss_final"]
    assert not r["moved"]


def test_the_table_shows_a_cases_verdicts_at_more_seeds_where_they_ran():
    r = {"case": "x", "area": "model", "expect": "harmless", "verdict": "PASS", "golden_test": "FAIL", "seconds": 60,
         "caught_by": ["golden test"]}
    seeds = {"x": {"seeds": [1, 2, 3, 4, 5], "verdict": "inconclusive", "check": {"verdict": "PASS"}},
             "z": {"seeds": list(range(10)), "verdict": "moved", "check": {"verdict": "PASS"},
                   "vs_control": {"verdict": "inconclusive"}}}
    lines = gp.table([r, {**r, "case": "y"}, {**r, "case": "z"}], seeds).splitlines()
    assert "5: PASS, inconclusive " in lines[1] and "golden test" in lines[1]
    assert "PASS, inconclusive" not in lines[2] and " — " in lines[2]
    assert "10: PASS, moved / inconclusive" in lines[3]


def test_a_resumed_seed_comparison_adds_up_its_wall_time_within_one_store():
    seeds = {}
    gp.put_seeds(seeds, "x", {"verdict": "moved", "seconds": 3600.0, "store": "a"})
    gp.put_seeds(seeds, "x", {"verdict": "moved", "seconds": 20.0, "store": "a"})  # resumed: served the runs
    assert seeds["x"]["seconds_total"] == 3620.0
    gp.put_seeds(seeds, "x", {"verdict": "moved", "seconds": 50.0, "store": "b"})  # another case definition
    assert seeds["x"]["seconds_total"] == 50.0 and "earlier" not in seeds["x"]


def test_a_comparison_at_more_seeds_keeps_the_earlier_verdicts():
    seeds = {}
    gp.put_seeds(seeds, "x", {"seeds": [1, 2], "verdict": "inconclusive", "seconds": 100.0, "store": "a"})
    gp.put_seeds(seeds, "x", {"seeds": [1, 2, 3], "verdict": "moved", "seconds": 60.0, "store": "a"})
    gp.put_seeds(seeds, "x", {"seeds": [1, 2, 3, 4], "verdict": "moved", "seconds": 30.0, "store": "a"})
    assert seeds["x"]["seconds_total"] == 190.0
    assert [e["seeds"] for e in seeds["x"]["earlier"]] == [[1, 2], [1, 2, 3]]
    assert all("earlier" not in e for e in seeds["x"]["earlier"])
    gp.put_seeds(seeds, "x", {"seeds": [1], "verdict": "moved", "seconds": 5.0, "store": "b"})  # another definition
    assert "earlier" not in seeds["x"]


def test_harmless_is_an_intersection_union_test_whatever_the_number_of_metrics():
    """Within noise on every metric needs every metric's 90% interval inside the margin, no more: adding
    metrics makes it harder only by adding metrics that must each pass (Berger 1982)."""
    seeds = [1, 2, 3, 4, 5]
    wiggle = [0.04, -0.03, 0.05, -0.02, 0.0]  # paired differences: sd 0.036 of a seed sd of 0.1
    keys = [f"m{i}" for i in range(100)]
    theirs = {s: {k: 4.0 + 0.1 * (s % 3) for k in keys} for s in seeds}
    mine = {s: {k: v + wiggle[i] for k, v in theirs[s].items()} for i, s in enumerate(seeds)}
    ref = {k: {"sd": 0.1} for k in keys}
    r = gp.seed_effects(mine, theirs, ref, keys)
    assert r["verdict"] == "harmless" and r["widest_bound_sd"] < 1  # Bonferroni over 100 would reach ~5 sd
    assert gp.seed_effects(mine, theirs, ref, keys[:1])["widest_bound_sd"] == r["widest_bound_sd"]


def test_a_traceback_in_a_mutants_stage_is_a_catch_and_a_count_must_not_move():
    tb = "Traceback (most recent call last):\n  ...\nIndexError: index 230954 is out of bounds"
    assert gp.stage_failure("train", tb)["verdict"] == "FAIL"
    assert gp.stage_failure("train", tb, mutant=False)["verdict"] == "ERROR"
    seeds = [1, 2, 3]
    theirs = {s: {"params": 1000.0, "loss_final": 4.0 + 0.1 * s} for s in seeds}
    ref = {"params": {"sd": 0.0}, "loss_final": {"sd": 0.1}}
    same = {s: dict(v) for s, v in theirs.items()}
    assert gp.seed_effects(same, theirs, ref, ["loss_final", "params"])["verdict"] == "harmless"
    moved = {s: {**v, "params": 1001.0} for s, v in theirs.items()}
    assert "params" in gp.seed_effects(moved, theirs, ref, ["loss_final", "params"])["not_within_noise"]


def test_seed_runs_keep_a_store_per_reference_and_case_definition(tmp_path, monkeypatch):
    """--seeds trains for hours: its runs go to a store that outlives the worktree, so a stopped comparison
    resumes; never one shared by two case definitions (a mutant keeps the reference's run keys)."""
    case = gp.CASES["cosine_to_zero"]
    head = gp.sh(["git", "rev-parse", "HEAD"], REPO).stdout.strip()
    store = gp.case_store(case, head)
    assert store == gp.case_store(case, head[:7]) and store.parent == gp.CASE_STORES
    assert gp.case_store(gp.dataclasses.replace(case, new=case.new + " "), head) != store
    assert gp.case_store(gp.CASES["gelu_tanh"], head) != store
    assert store.name.startswith(head[:12])  # the full revision, however --rev spelled it
    assert gp.case_store(case, head, "decide") not in (store, gp.case_store(gp.CASES["gelu_tanh"], head, "decide"))

    monkeypatch.setattr(gp, "DATA_DIR", tmp_path / "data")
    (tmp_path / "data").mkdir()
    with gp.CaseTree(case, head, keep=False, store=tmp_path / "kept") as t:
        assert yaml.safe_load((t.tree / "params.yaml").read_text())["engine"]["store"] == str(tmp_path / "kept")
        tree = t.tree
    assert not tree.exists()
    with gp.CaseTree(case, head, keep=False) as t:
        assert yaml.safe_load((t.tree / "params.yaml").read_text())["engine"]["store"] == str(t.tmp / "store")


def test_seeds_needed_to_show_no_effect_within_noise_grow_with_the_paired_spread():
    from scipy.stats import norm, t

    assert gp.seeds_to_show_within_noise(0.01) == 2
    n = gp.seeds_to_show_within_noise(2 ** 0.5)  # a scrambled metric: paired differences as wide as two seeds
    for m, ok in ((n, True), (n - 1, False)):
        assert (m ** 0.5 - t.ppf(0.95, m - 1) * 2 ** 0.5 >= norm.ppf(0.75) * 2 ** 0.5) == ok
    assert gp.seeds_to_show_within_noise(3.0) > n
    assert gp.seeds_to_show_within_noise(2 * 2 ** 0.5, margin=2.0) == n  # only the ratio to the margin counts
    seeds = [1, 2, 3, 4, 5]
    theirs = {s: {"a": 4.0 + 0.1 * (s % 3), "b": 1.0 + 0.1 * s, "c": 2.0} for s in seeds}
    mine = {s: {"a": v["a"] + 0.002 * (-1) ** s, "b": v["b"] + 0.15 * (-1) ** s, "c": 2.0} for s, v in theirs.items()}
    ref = {"a": {"sd": 0.1}, "b": {"sd": 0.1}, "c": {"sd": 0.0}}
    need = gp.seed_effects(mine, theirs, ref, ["a", "b", "c"])["seeds_needed"]
    b_sd = (sum((0.15 * (-1) ** s + 0.03) ** 2 for s in seeds) / 4) ** 0.5 / 0.1  # 1.64 seed sd; a's 0.02
    assert need == {"metrics": 2, "median": gp.seeds_to_show_within_noise(b_sd), "max": gp.seeds_to_show_within_noise(b_sd),
                    "max_metric": "b", "metrics_over": {"5": 1, "10": 1, "20": 0}}  # c: the same on every seed
    # by hand: 4 - t(0.95, 15) 1.643 = 1.120 >= z(0.75) 1.643 = 1.108, and at 15: 0.980 < 1.108
    assert need["max"] == 16 and gp.seeds_to_show_within_noise(0.02) == 2


def test_seeds_needed_hold_up_in_a_simulation():
    """At the n returned, a case with no effect lands its 90% interval inside +/- 1 sd about half the time."""
    import numpy as np
    from scipy.stats import t

    rng = np.random.default_rng(0)
    for sd in (1.0, 2.0):
        n = gp.seeds_to_show_within_noise(sd)
        d = rng.normal(0.0, sd, size=(20000, n))
        half = t.ppf(0.95, n - 1) * d.std(axis=1, ddof=1) / n ** 0.5
        inside = np.mean(np.abs(d.mean(axis=1)) + half < 1.0)
        assert 0.45 < inside < 0.7, (sd, n, inside)


def test_a_mutant_is_compared_with_the_faithful_control_made_under_the_same_float_order(monkeypatch):
    """Against the reference a mutant's effect carries the float order's; the control differs by the code alone.
    Only a mutant made as the control was (float order, workers) gets one; a faithful case never does."""
    control = gp.CASES[gp.CONTROL]
    assert control.expect == "faithful" and all((c.isa, c.workers) == (control.isa, control.workers)
                                                 for c in gp.MUTANTS)
    monkeypatch.setattr(gp, "CaseTree", lambda *a, **k: pytest.fail("no tree for a case without a control"))
    assert gp.control_runs(gp.CASES[gp.CONTROL], "HEAD", [1, 2]) == {}
    assert gp.control_runs(gp.dataclasses.replace(gp.CASES["avx2_serial"], workers=2), "HEAD", [1, 2]) == {}
    assert gp.control_runs(gp.dataclasses.replace(gp.CASES["gelu_tanh"], isa="DEFAULT"), "HEAD", [1, 2]) == {}


def test_the_control_runs_come_from_the_controls_own_store_and_only_shared_metrics_are_compared(tmp_path, monkeypatch):
    made = []

    class Tree:  # what CaseTree gives: the control's seeds stage rerun in a tree of its own
        def __init__(self, case, rev, keep, extra, store):
            made.append((case.name, extra, store))
            self.tree, self.error = tmp_path, ""

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def repro(self, stages):
            runs = {str(s): {"d32": {"loss_final": 4.0 + 0.1 * s}} for s in (1, 2, 3)}
            (tmp_path / "metrics/dist").mkdir(parents=True, exist_ok=True)
            (tmp_path / "metrics/dist/train.json").write_text(json.dumps({"runs": runs}))
            return {stage: 1.0 for stage in stages}, ""

    monkeypatch.setattr(gp, "CaseTree", Tree)
    case = gp.CASES["gelu_tanh"]
    control = gp.control_runs(case, "HEAD", [1, 2, 3])
    assert made == [(gp.CONTROL, {"seeds.seeds": [1, 2, 3]}, gp.case_store(gp.CASES[gp.CONTROL], "HEAD"))]
    assert control == {s: {"d32.loss_final": 4.0 + 0.1 * s} for s in (1, 2, 3)}
    mine = {s: {"d32.loss_final": 4.0 + 0.1 * s + 0.5, "d32.only_here": 1.0} for s in (1, 2, 3)}
    ref = {"d32.loss_final": {"sd": 0.1}, "d32.only_here": {"sd": 0.1}}
    vc = gp.against_control(case, "HEAD", mine, ref, ["d32.loss_final", "d32.only_here"])
    assert vc["control"] == gp.CONTROL and vc["metrics"] == 1 and vc["verdict"] == "moved"

    def failing(self, stages):
        self.error = "boom"
        return {}, "seeds"

    monkeypatch.setattr(Tree, "repro", failing)
    vc = gp.against_control(case, "HEAD", mine, ref, ["d32.loss_final"])
    assert "boom" in vc["error"] and "verdict" not in vc


def test_a_conclusion_the_reference_does_not_reproduce_starting_to_hold_is_a_catch():
    verdict = {"verdict": "FAIL", "problems": ["conclusion train.d32_no_effect holds on this run, but not on the "
                                               "reference's run (abc), which reports it not reproduced: ..."]}
    assert gp.caught_by(verdict, False) == ["conclusion"]
    assert gp.caught_by({"verdict": "PASS", "problems": []}, False) == []


def test_a_catch_through_initialisation_statistics_alone_is_named_as_such():
    """Issue 42: no case may be caught by the statistical verdict only through statistics of the untrained model
    (the golden tests' business), so the matrix names such a catch apart."""
    init = {"verdict": "FAIL", "failed_metrics": [{"key": "init_sweep.d64.logit_std"},
                                                  {"key": "train.d32_scaled.init_q_std_l0"}]}
    assert gp.caught_by(init, True) == ["golden test", "failed metrics: init statistics only"]
    init["failed_metrics"].append({"key": "train.d32_scaled.loss_final"})
    assert gp.caught_by(init, False) == ["train metric", "other metric"]


def test_decide_findings_follow_what_each_case_expects():
    """--decide (issue 42): faithful and harmless cases must never be DIFFERENT; a harmful one is caught when an
    endpoint is DIFFERENT at some look, "SAME at the margins" when every endpoint is shown within its margin."""
    def look(n, same=0, different=0, inconclusive=0):
        return {"seeds": list(range(n)), "SAME": same, "DIFFERENT": different, "INCONCLUSIVE": inconclusive,
                "runs": 4 * n, "trained": 4, "cpu_seconds": 500.0 * n}

    def ends(*answers):
        return [{"metric": f"train.m{i}", "answer": a, "shift": 0.1, "shift_sd": 1.0, "seeds": 3}
                for i, a in enumerate(answers)]

    harmful, harmless, faithful = gp.CASES["scale_by_d"], gp.CASES["gelu_tanh"], gp.CASES["avx2"]
    caught = {"verdict": "FAIL", "looks": [look(1, inconclusive=2), look(3, different=1, inconclusive=1)],
              "endpoints": ends("DIFFERENT", "INCONCLUSIVE")}
    d = gp.decided(harmful, caught)
    assert (d["finding"], d["seeds"], d["cpu_seconds"]) == ("caught", 3, 1500.0)  # the last look holds the others
    assert gp.decided(harmless, caught)["finding"] == gp.decided(faithful, caught)["finding"] == "wrongly DIFFERENT"
    same = {"verdict": "PASS", "looks": [look(1, inconclusive=2), look(3, same=2)], "endpoints": ends("SAME", "SAME")}
    assert gp.decided(harmful, same)["finding"] == "SAME at the margins"
    assert gp.decided(harmless, same)["finding"] == gp.decided(faithful, same)["finding"] == "ok"
    open_ = {"verdict": "PASS", "looks": [look(n, same=1, inconclusive=1) for n in (1, 3, 5, 10)],
             "endpoints": ends("SAME", "INCONCLUSIVE")}
    assert gp.decided(harmful, open_)["finding"] == "not decided" and gp.decided(harmful, open_)["seeds"] == 10
    nan = {"verdict": "FAIL", "looks": [look(1, inconclusive=1)], "endpoints": ends("NOT A NUMBER", "INCONCLUSIVE")}
    assert gp.decided(harmful, nan)["finding"] == "caught" and gp.decided(faithful, nan)["finding"] == "wrongly DIFFERENT"
    missing = {"verdict": "FAIL", "looks": [look(1, inconclusive=1)], "endpoints": ends("MISSING", "INCONCLUSIVE")}
    assert gp.decided(harmful, missing)["finding"] == gp.decided(faithful, missing)["finding"] == "error"
    broken = gp.decided(faithful, {"verdict": "ERROR", "problems": ["boom"]})
    assert broken["looks"] == [] and broken["problems"] == ["boom"] and broken["finding"] == "error"
    # targets_two_ahead's loader reads past the stream at seed 1: the reruns did not finish under the change
    crashed = {"verdict": "ERROR", "problems": ["error: check --decide (train): 4 of 12 runs did not finish: "
                                                "d32_scaled seed 1: failed (IndexError: index 9 is out of bounds)"]}
    assert gp.decided(harmful, crashed)["finding"] == "caught"
    assert gp.decided(harmless, crashed)["finding"] == gp.decided(faithful, crashed)["finding"] == "wrongly failed"
    # seed 1 is the reference's second seed: the look that failed is the one at 3 seeds; its CPU time is unknown
    order = [20261014, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert (gp.decided(harmful, crashed, order)["seeds"], gp.decided(harmful, crashed, order)["cpu_seconds"]) == (3, None)
    late = {"verdict": "ERROR", "problems": ["2 of 40 runs did not finish: d32_scaled seed 7: failed (IndexError); "
                                             "d256_scaled seed 4: failed (IndexError)"]}
    assert gp.decided(harmful, late, order)["seeds"] == 10
    assert gp._cpu_min(gp.decided(harmful, crashed, order)) == "CPU time not recorded (a look did not finish)"
    assert gp._cpu_min({"cpu_seconds": 1500.0}) == "25 CPU-min"
    assert gp.decided(harmful, {"verdict": "ERROR", "problems": ["error: git: no such revision"]})["finding"] == "error"


def test_the_summary_names_the_machines_the_cases_ran_on():
    """The matrix spans sessions on machines that differ: each case records its CPU, and the cost line names them."""
    rows = [{"case": c, "expect": "harmful", "verdict": "FAIL", "golden_test": "FAIL", "seconds": 1800, **cpu}
            for c, cpu in (("a", {"cpu": "AMD EPYC"}), ("b", {"cpu": "Intel(R) Xeon(R) Processor"}), ("c", {}))]
    last = gp.confusion(rows).splitlines()[-1]
    assert last == ("cost: 1.5 h of wall time (3 cases, on AMD EPYC, Intel(R) Xeon(R) Processor, a machine not "
                    "recorded)")


@pytest.mark.parametrize("failing, decides", [("charlm", True), ("failures", False), ("train", False)])
def test_decide_runs_unless_a_stage_it_reruns_failed(monkeypatch, failing, decides):
    """targets_two_ahead passed the check after train, then crashed charlm (its loader reads past the end): the
    primary endpoints' stages finished, so --decide still judges them; one whose own stage failed is not."""
    checks = []

    class Tree:
        env, tree, seeds, error = {}, None, [1], "error: sweep x: run x cannot read its data: index 9 is out of bounds"

        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def repro(self, stages):
            ran = stages[:stages.index(failing) + 1] if failing in stages else stages
            return {s: 1.0 for s in ran}, failing if failing in stages else ""

        def check(self, extra=()):
            checks.append(extra)
            return {"verdict": "PASS", "looks": [{"seeds": [1], "cpu_seconds": 5.0}], "endpoints": []}

    monkeypatch.setattr(gp, "CaseTree", Tree)
    monkeypatch.setattr(gp, "case_store", lambda *a, **k: None)
    monkeypatch.setattr(gp, "sh", lambda *a, **k: type("P", (), {"returncode": 1})())
    case = gp.Case("t", "data", "harmful", "why", stages=("init_sweep", "train", "heads", "failures", "charlm"))
    r = gp.run_case(case, "HEAD", keep=False, decide=10)
    assert (r["verdict"], r["stage_failed"]) == ("ERROR", failing)
    assert ("decide" in r) == decides and (("--decide", "10") in checks) == decides
    assert r.get("check_after_train") == ("PASS" if failing == "charlm" else None)
