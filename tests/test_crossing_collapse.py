"""The report's machine crossing (report/crossing.py) and collapse count (report/collapse.py), on small
synthetic inputs whose answers are worked out by hand."""

import math

import pytest

from conftest import unpad
from attnrepro.report import collapse, crossing

PAIRS = {32: {True: "s32", False: "u32"}, 256: {True: "s256", False: "u256"}}


def env(cpu, runs_on="this machine"):
    return {"cpu": cpu, "torch": "2.0", "python": "3.11", "device": "cpu", "torch_threads": 1, "runs_on": runs_on}


def test_a_sweep_whose_baseline_ran_on_another_cpu_is_not_one_kind():
    envs = {"seeds": env("EPYC"), "choices_a": env("Xeon"), "choices_b": env("Xeon"), "critical": env("Xeon"),
            "qknorm": env("EPYC", runs_on="Xeon, torch 2.0, 1 thread(s)")}
    rows = {r["sweep"]: r for r in crossing.sweep_machines(envs)}
    assert not rows["choices"]["one_kind"] and rows["choices"]["arms"] == ["choices_a", "choices_b"]
    assert rows["choices"]["arm_kinds"] == ["Xeon, torch 2.0, 1 thread(s)"]
    assert rows["critical"]["one_kind"]
    assert not rows["qknorm"]["one_kind"]  # its runs came from elsewhere
    assert "sensitivity" not in rows  # no record: not listed
    envs["choices_a"]["torch_threads"] = 2  # same CPU, another thread count: another float order
    assert not crossing.sweep_machines({"seeds": env("Xeon"), "choices_a": envs["choices_a"]})[0]["one_kind"]


def test_critical_rows_map_to_variants_and_a_disagreement_between_sources_is_refused():
    per_seed = [{"seed": "1", "d_head": "32", "scaled_loss_final": "4.0", "unscaled_loss_final": "4.2"},
                {"seed": "1", "d_head": "64", "scaled_loss_final": "9", "unscaled_loss_final": "9"},
                {"seed": "1", "d_head": "256", "scaled_loss_final": "4.3", "unscaled_loss_final": "5.2"}]
    qk = [{"seed": "1", "d_qk": "256", "scaled_loss_final": "4.3", "unscaled_loss_final": "5.2"},
          {"seed": "3", "d_qk": "256", "scaled_loss_final": "4.4", "unscaled_loss_final": "5.1"},
          {"seed": "3", "d_qk": "32", "scaled_loss_final": "7", "unscaled_loss_final": "7"}]  # not the d32 model
    runs = crossing.merge(crossing.critical_runs(per_seed, qk, PAIRS))
    assert runs == {1: {"s32": {"loss_final": 4.0}, "u32": {"loss_final": 4.2}, "s256": {"loss_final": 4.3},
                        "u256": {"loss_final": 5.2}},
                    3: {"s256": {"loss_final": 4.4}, "u256": {"loss_final": 5.1}}}
    qk[0]["scaled_loss_final"] = "4.31"
    with pytest.raises(ValueError, match="seed 1 s256.loss_final"):
        crossing.merge(crossing.critical_runs(per_seed, qk, PAIRS))


def test_the_train_stage_run_is_placed_at_the_one_seed_it_equals():
    runs = {1: {"s256": {"loss_final": 4.3}}, 2: {"s256": {"loss_final": 4.4}}}
    assert crossing.seed_of({"s256": {"loss_final": 4.4, "entropy_final": 0.7}, "comparison": {}}, runs) == 2
    assert crossing.seed_of({"s256": {"loss_final": 4.5}}, runs) is None
    assert crossing.seed_of({"s256": {"loss_final": 4.3}}, {**runs, 3: {"s256": {"loss_final": 4.3}}}) is None


def test_same_seed_differences_their_t_interval_and_a_single_pair_without_one():
    base = {1: {"gap": 1.0, "x.entropy_step222": 0.5}, 2: {"gap": 2.0, "x.entropy_step222": 0.5},
            3: {"gap": 3.0, "x.entropy_step222": 0.5}}
    other = {1: {"gap": 1.1, "x.entropy_step222": 0.25}, 2: {"gap": 2.3, "x.entropy_step222": math.nan},
             9: {"gap": 0.0, "x.entropy_step222": 1.0}}  # seed 9: no baseline run
    d = crossing.differences(other, base)
    g = d["gap"]  # differences 0.1, 0.3: mean 0.2, sd 0.1414, se 0.1, t(0.975, 1) = 12.706
    assert g["n"] == 2 and g["diff"] == pytest.approx(0.2)
    assert (g["ci_lo"], g["ci_hi"]) == (pytest.approx(0.2 - 1.2706, abs=1e-4), pytest.approx(0.2 + 1.2706, abs=1e-4))
    assert g["sd"] == pytest.approx(math.sqrt(0.02)) and g["seed_sd"] == pytest.approx(1.0)
    e = d["x.entropy_step222"]  # log scale, one finite pair: a factor of 0.5, no interval
    assert e["n"] == 1 and e["log"] and math.exp(e["diff"]) == pytest.approx(0.5) and "ci_lo" not in e


def test_the_text_says_shift_only_where_an_interval_excludes_zero():
    no = {"gap": {"n": 3, "log": False, "diff": 0.1, "ci_lo": -0.1, "ci_hi": 0.3, "sd": 0.05, "seed_sd": 0.1}}
    yes = {"gap": {**no["gap"], "ci_lo": 0.02}}
    table, said = crossing.crossing_markdown(no, ["src"], "Xeon")
    assert "No shift shown" in said and any(line.startswith("| gap | 3 |") for line in unpad("\n".join(table)).split("\n"))
    text = crossing.crossing_markdown(yes, ["src"], "Xeon")[1]
    assert "**A shift**: the interval of gap excludes 0" in text and "0.5 to 0.5 of a seed sd" in text


def test_collapse_count_and_its_exact_interval():
    assert collapse.collapsed([0.6, 0.099, 0.1, 0.002]) == 2
    r = collapse.row("p", "m", 10, 0, "src")
    assert r["interval"][0] == 0 and r["interval"][1] == pytest.approx(1 - 0.025 ** (1 / 10))  # exact at k = 0
    r = collapse.row("p", "m", 10, 10, "src")
    assert r["interval"][0] == pytest.approx(0.025 ** (1 / 10)) and r["interval"][1] == 1
    assert collapse.row("p", "m", 10, None, "src")["interval"] is None


def test_the_lowest_value_a_summary_allows_is_reached_by_the_extreme_sample():
    x = [0.0, 1.0, 1.0, 1.0, 1.0]  # Samuelson's bound is attained when all the others are equal
    m = sum(x) / 5
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / 4)
    assert collapse.lowest_possible(m, sd, 5, log=False) == pytest.approx(0.0, abs=1e-12)
    assert collapse.lowest_possible(math.log(0.7), 0.0, 5, log=True) == pytest.approx(0.7)


def test_sensitivity_rows_count_zero_only_when_the_bound_clears_the_rule():
    sens = {"s256": {"entropy_step1480": {
        "baseline": {"center": -0.36, "sd": 0.05, "n": 5, "log": 1},
        "tight": {"center": math.log(0.7), "sd": 0.05, "n": 5, "log": 1},
        "wide": {"center": math.log(0.5), "sd": 1.0, "n": 5, "log": 1}}}}  # exp(-0.69 - 1.79) < 0.1
    rows = {r["perturbation"]: r for r in collapse.sensitivity_rows(sens, "s256", "EPYC")}
    assert set(rows) == {"sensitivity: tight", "sensitivity: wide"}
    assert rows["sensitivity: tight"]["k"] == 0 and rows["sensitivity: wide"]["k"] is None


def test_committed_rows_count_a_collapsed_seed_and_the_other_cpu_only_when_it_differs():
    dist = {"runs": {"1": {"s256": {"entropy_final": 0.6}}, "2": {"s256": {"entropy_final": 0.05}},
                     "3": {"s256": {"entropy_final": 0.7}}}}
    other = {1: {"s256": {"entropy_final": 0.01}}, 2: {"s256": {"entropy_final": 0.6}}}
    envs = {"seeds": env("EPYC"), "critical": env("Xeon")}
    rows = collapse.committed_rows(dist, envs, other, {}, "s256")
    assert [(r["k"], r["n"]) for r in rows] == [(1, 3), (1, 2)]
    assert len(collapse.committed_rows(dist, {**envs, "critical": env("EPYC")}, other, {}, "s256")) == 1


def test_the_gate_matrix_gives_means_only_and_they_are_named_missing():
    gate = {"results": [{"case": "avx2", "decide": {"endpoints": [
        {"metric": "train.s256.entropy_final", "shift": math.log(0.5), "seeds": 10},
        {"metric": "train.s256.loss_final", "shift": 0.1, "seeds": 10}]}},
        {"case": "one_seed", "decide": {"endpoints": [{"metric": "train.s256.entropy_final", "shift": 0.0, "seeds": 1}]}}]}
    means = collapse.gate_means(gate, "s256")
    assert means == ["avx2 ×0.5 (10 seeds)"]
    text = collapse.markdown([collapse.row("none", "EPYC", 10, 0, "dist")], "s256", gate=means)
    assert "avx2 ×0.5 (10 seeds)" in text and "0 / 10" in text and "Not counted:" in text
