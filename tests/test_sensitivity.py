"""The sensitivity sweep's statistics (experiments.sensitivity): paired effects, Holm's correction,
the "accounts for" rule with its no-overshoot band, the pre-registration verdicts, the joint
protocol table, and its choices against docs/PROTOCOL.md (only unstated settings are varied)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from attnrepro.experiments import sensitivity as S
from attnrepro.stats import holm_adjusted
from conftest import unpad

REPO = Path(__file__).resolve().parents[1]


def cfg(**kw):
    base = dict(seeds=[1, 2, 3, 4, 5], choices={"a": {"optim": {"weight_decay": 0.0}},
                                                "b": {"model": {"block_size": 32}, "scope": "failures"}},
                metrics={"d32_scaled": ["loss_final"], "failures_correct": ["loss_final"]}, combinations={})
    base.update(kw)
    c = S.SensitivityConfig(**base)
    c.validate()
    return c


def test_paired_effect_matches_scipy_and_its_interval():
    from scipy import stats

    base = [4.0, 4.1, 3.9, 4.05, 3.95]
    ours = [4.2, 4.25, 4.1, 4.3, 4.1]
    e = S.paired_effect(ours, base, log=False)
    d = [o - b for o, b in zip(ours, base)]
    assert e["diff"] == pytest.approx(sum(d) / 5)
    assert e["se"] == pytest.approx(stats.tstd(d) / math.sqrt(5))
    assert e["p"] == pytest.approx(stats.ttest_rel(ours, base).pvalue)
    half = stats.t.ppf(0.975, 4) * e["se"]
    assert (e["ci_lo"], e["ci_hi"]) == pytest.approx((e["diff"] - half, e["diff"] + half))
    lg = S.paired_effect([2.0] * 5, [1.0] * 5, log=True)  # log scale: the difference of logs, no spread
    assert lg["diff"] == pytest.approx(math.log(2)) and lg["se"] == 0 and lg["p"] == 0.0


def test_holm_step_down():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.04 -> 0.04, 0.06, 0.06 (monotone), 0.06
    assert holm_adjusted([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm_adjusted([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm_adjusted([]) == []
    # one small p among many survives only if below alpha / m
    ps = [0.001] + [0.5] * 49
    assert holm_adjusted(ps)[0] == pytest.approx(0.05) and holm_adjusted([0.0009] + [0.5] * 49)[0] < 0.05


def test_analyse_corrects_over_all_cells_and_respects_scope():
    c = cfg()
    vals = {("d32_scaled", "loss_final", "baseline"): [4.0, 4.1, 3.9, 4.05, 3.95],
            ("d32_scaled", "loss_final", "a"): [4.2, 4.31, 4.1, 4.24, 4.16],
            ("failures_correct", "loss_final", "baseline"): [4.7, 4.72, 4.69, 4.71, 4.7],
            ("failures_correct", "loss_final", "a"): [4.7, 4.73, 4.69, 4.7, 4.7],
            ("failures_correct", "loss_final", "b"): [4.8, 4.83, 4.8, 4.82, 4.79]}
    m, rows = S.analyse(vals, c)
    assert "b" not in m["d32_scaled"]["loss_final"]  # a failures-only choice never runs on a train variant
    assert m["design"] == {"seeds": 5, "cells": 3, "alpha": 0.05, "correction": "holm", "protocols": 3, "runs": 25}
    ps = [r["p"] for r in rows]
    assert [r["p_holm"] for r in rows] == pytest.approx(holm_adjusted(ps))
    assert m["failures_correct"]["loss_final"]["b"]["significant"] == 1
    assert m["failures_correct"]["loss_final"]["a"]["significant"] == 0
    assert len(c.planned()) == 25 and S.cells(m).keys() == {("d32_scaled", "loss_final"),
                                                            ("failures_correct", "loss_final")}


def band(values, log=False):
    return S.protocol_band(values, log)


BASE = [4.0, 4.02, 3.98, 4.01, 3.99]  # centre 4.0, sd ~0.016: prediction interval about 3.95-4.05


def row(values, p_holm=0.001):
    return {**band(values), "p_holm": p_holm}


@pytest.mark.parametrize("choice, p_holm, published, want", [
    ([4.30, 4.32, 4.28, 4.31, 4.29], 0.001, 5.0, "accounts"),  # toward and short
    ([4.98, 5.0, 4.97, 5.01, 4.99], 0.001, 5.0, "accounts"),  # toward and onto it
    ([5.60, 5.62, 5.58, 5.61, 5.59], 0.001, 5.0, "overshoots"),  # toward and far past its band
    ([3.70, 3.72, 3.68, 3.71, 3.69], 0.001, 5.0, "away"),  # away from it
    ([4.30, 4.32, 4.28, 4.31, 4.29], 0.2, 5.0, "not significant"),  # toward, but not after Holm
    ([4.30, 4.32, 4.28, 4.31, 4.29], 0.001, 4.01, "no deviation"),  # the baseline already predicts it
])
def test_accounts_for(choice, p_holm, published, want):
    assert S.accounts_for(band(BASE), row(choice, p_holm), published, 0.005) == want


def test_the_published_band_is_its_rounding_interval_widened_by_the_choices_prediction_half_width():
    from scipy import stats

    choice = [5.10, 5.14, 5.06, 5.12, 5.08]
    r = row(choice)
    w = stats.t.ppf(0.975, 4) * r["sd"] * math.sqrt(1 + 1 / 5)
    edge = 5.0 + 0.05 + w  # published 5.0 printed as "5.0": half 0.05
    assert r["center"] < edge and S.accounts_for(band(BASE), r, 5.0, 0.05) == "accounts"
    assert S.accounts_for(band(BASE), r, 5.0, 0.0) == ("accounts" if r["center"] <= 5.0 + w else "overshoots")
    far = row([x + (edge - r["center"]) + 0.01 for x in choice])
    assert S.accounts_for(band(BASE), far, 5.0, 0.05) == "overshoots"
    down = S.accounts_for(band(BASE), row([3.5, 3.52, 3.48, 3.51, 3.49]), 3.0, 0.005)  # downward, short
    assert down == "accounts"


def test_a_noisy_choice_that_lands_further_past_the_figure_than_the_baseline_sits_short_overshoots():
    # baseline 0.050 (tight), published 0.07; the choice's centre 0.15 is inside published + w (its own
    # wide band) but 0.08 from the figure against the baseline's 0.02: it does not account for it
    base = band([0.0495, 0.0505, 0.05, 0.0490, 0.0510])
    noisy = row([0.10, 0.20, 0.15, 0.11, 0.19])
    assert S.accounts_for(base, noisy, 0.07, 0.005) == "overshoots"
    closer = row([0.06, 0.11, 0.08, 0.07, 0.09])  # just as noisy, ends 0.01 from it: accounts
    assert S.accounts_for(base, closer, 0.07, 0.005) == "accounts"


def test_a_nan_p_does_not_lift_the_other_cells_and_a_zero_falls_back_to_the_linear_scale():
    c = cfg(metrics={"d32_scaled": ["loss_final", "entropy_final"]}, choices={"a": {"optim": {"weight_decay": 0.0}}})
    vals = {("d32_scaled", "loss_final", "baseline"): BASE,
            ("d32_scaled", "loss_final", "a"): [4.3, 4.33, 4.29, 4.31, 4.28],
            ("d32_scaled", "entropy_final", "baseline"): [0.5, 0.51, 0.49, 0.5, 0.5],
            ("d32_scaled", "entropy_final", "a"): [0.5, float("nan"), 0.49, 0.5, 0.5]}
    m, rows = S.analyse(vals, c)
    assert m["d32_scaled"]["loss_final"]["a"]["p_holm"] == pytest.approx(2 * m["d32_scaled"]["loss_final"]["a"]["p"])
    assert m["d32_scaled"]["loss_final"]["a"]["significant"] == 1
    vals[("d32_scaled", "entropy_final", "a")] = [0.0, 0.0, 0.0, 0.0, 0.0]  # one-hot rows: entropy exactly 0
    m, rows = S.analyse(vals, c)
    assert m["d32_scaled"]["entropy_final"]["baseline"]["log"] == 0
    assert m["d32_scaled"]["entropy_final"]["a"]["diff"] == pytest.approx(-0.5)
    assert "entropy_final a: -0.5" in S.SensitivityResult(m, rows, {}).table()


def test_log_scale_metrics_are_judged_on_the_log_scale():
    base = band([0.05, 0.051, 0.049, 0.0505, 0.0495], log=True)
    r = {**band([0.1, 0.102, 0.098, 0.101, 0.099], log=True), "p_holm": 0.001}
    assert S.accounts_for(base, r, 0.15, 0.0005) == "accounts"
    assert S.closes(base, r, 0.15) == pytest.approx(math.log(2) / math.log(3), rel=0.01)
    assert S.accounts_for(base, {**band([0.5] * 4 + [0.51], log=True), "p_holm": 0.001}, 0.15, 0.0005) == "overshoots"


def sweep_metrics():
    c = cfg()
    vals = {("d32_scaled", "loss_final", "baseline"): BASE,
            ("d32_scaled", "loss_final", "a"): [4.3, 4.33, 4.29, 4.31, 4.28],
            ("failures_correct", "loss_final", "baseline"): BASE,
            ("failures_correct", "loss_final", "a"): [4.0, 4.03, 3.97, 4.0, 4.0],
            ("failures_correct", "loss_final", "b"): [6.0, 6.02, 5.98, 6.01, 5.99]}
    return S.analyse(vals, c)[0]


def test_prereg_verdicts():
    m = sweep_metrics()
    published = {("d32_scaled", "loss_final"): (5.0, 0.005), ("failures_correct", "loss_final"): (5.0, 0.005)}
    entries = [{"cell": "d32_scaled.loss_final", "choice": "a", "reason": "r"},
               {"cell": "failures_correct.loss_final", "choice": "b", "reason": "r"},
               {"cell": "failures_correct.loss_final", "choice": "a", "reason": "r"},
               {"cell": "d32_scaled.loss_final", "choice": "b", "reason": "r"},
               {"cell": "d256_scaled.loss_final", "choice": "a", "reason": "r"}]
    v = S.prereg_verdicts(entries, m, published)
    assert [(x["verdict"], x["why"]) for x in v] == [
        ("held", ""), ("failed", "overshoots"), ("failed", "not significant"),
        ("not testable", "the choice is not run for this variant"),
        ("not testable", "the sweep does not measure this cell")]
    assert S.prereg_verdicts(entries[:1], m, {})[0]["why"] == "no published figure"
    near = {("d32_scaled", "loss_final"): (4.0, 0.005)}
    assert S.prereg_verdicts(entries[:1], m, near)[0]["why"] == "no deviation at the baseline"


def test_joint_table_counts_every_cell_for_every_protocol():
    m = sweep_metrics()
    published = {("d32_scaled", "loss_final"): (4.3, 0.005), ("failures_correct", "loss_final"): (6.0, 0.005)}
    t = {j["protocol"]: j for j in S.joint_table(m, published)}
    assert list(t) == ["baseline", "a", "b"]
    assert all(j["cells"] == 2 for j in t.values())
    assert (t["baseline"]["inside"], t["a"]["inside"], t["b"]["inside"]) == (0, 1, 1)
    assert t["b"]["changed"] == 1 and t["a"]["changed"] == 2
    b = m["failures_correct"]["loss_final"]["baseline"]
    z_fail = (6.0 - b["center"]) / b["sd"]
    assert t["a"]["score"] < t["baseline"]["score"] and t["b"]["score"] < t["baseline"]["score"]
    assert t["a"]["score"] == pytest.approx(((6.0 - m["failures_correct"]["loss_final"]["a"]["center"])
                                             / m["failures_correct"]["loss_final"]["a"]["sd"]) ** 2
                                            + ((4.3 - m["d32_scaled"]["loss_final"]["a"]["center"])
                                               / m["d32_scaled"]["loss_final"]["a"]["sd"]) ** 2)
    assert t["baseline"]["score"] > z_fail ** 2
    assert t["baseline"]["score_base_sd"] == pytest.approx(t["baseline"]["score"])
    d = m["d32_scaled"]["loss_final"]
    assert t["a"]["score_base_sd"] == pytest.approx(((6.0 - m["failures_correct"]["loss_final"]["a"]["center"])
                                                     / b["sd"]) ** 2 + ((4.3 - d["a"]["center"]) / d["baseline"]["sd"]) ** 2)


def test_noise_alone_lowers_a_protocols_own_joint_score_but_not_the_one_in_the_baselines_sd():
    c = cfg(choices={"noisy": {"optim": {"weight_decay": 0.0}}})
    vals = {("d32_scaled", "loss_final", "baseline"): BASE, ("failures_correct", "loss_final", "baseline"): BASE,
            ("d32_scaled", "loss_final", "noisy"): [3.5, 4.5, 3.7, 4.3, 4.0],  # same centre, 25x the spread
            ("failures_correct", "loss_final", "noisy"): [3.5, 4.5, 3.7, 4.3, 4.0]}
    m, _ = S.analyse(vals, c)
    published = {("d32_scaled", "loss_final"): (4.3, 0.005), ("failures_correct", "loss_final"): (4.3, 0.005)}
    t = {j["protocol"]: j for j in S.joint_table(m, published)}
    assert t["noisy"]["score"] < t["baseline"]["score"] / 100
    assert t["noisy"]["score_base_sd"] == pytest.approx(t["baseline"]["score_base_sd"])


@pytest.mark.parametrize("change, message", [
    ({"seeds": [1, 2, 3, 4]}, "at least 5 different seeds"),
    ({"choices": {"baseline": {"optim": {"weight_decay": 0.0}}}}, "none named 'baseline'"),
    ({"choices": {"a": {"optim": {"weight_decay": 0.0}, "split": "first"}}}, "sensitivity.choices.a"),
    ({"choices": {"a": {"optim": {"weight_decay": 0.0}, "scope": "some"}}}, "sensitivity.choices.a.scope"),
    ({"combinations": {"ab": ["a"]}}, "two or more different choices"),
    ({"combinations": {"ab": ["a", "c"]}}, "two or more different choices"),
])
def test_bad_configs(change, message):
    with pytest.raises(Exception, match=re.escape(message)):
        cfg(**change)


def test_a_combination_merges_its_choices_and_their_scopes():
    c = cfg(combinations={"ab": ["a", "b"]})
    p = c.protocol("ab")
    assert p["optim"] == {"weight_decay": 0.0} and p["model"] == {"block_size": 32} and p["scope"] == {"failures"}
    assert not c.applies("ab", "d32_scaled") and c.applies("ab", "failures_correct")
    with pytest.raises(Exception, match="weight_decay set by two"):
        cfg(choices={"a": {"optim": {"weight_decay": 0.0}}, "b": {"optim": {"weight_decay": 0.3}}},
            combinations={"ab": ["a", "b"]})


def test_train_metric_names_are_checked_before_any_run():
    steps = [0, 222, 1480]
    assert all(S.train_metric(m, steps, 2) for m in ("loss_final", "entropy_step222", "trained_w_qkv_fro_l0",
                                                     "entropy_final_l1", "val_loss_final"))
    assert not any(S.train_metric(m, steps, 2) for m in ("loss_finale", "entropy_step223", "trained_q_std_l2"))


# ---- the project's own sweep: only settings docs/PROTOCOL.md marks unstated, pre-registration valid

def protocol_rows() -> dict[str, str]:
    """params key -> 'stated' | 'unstated', from docs/PROTOCOL.md's tables."""
    out = {}
    for line in (REPO / "docs" / "PROTOCOL.md").read_text(encoding="utf-8").splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 5 and cols[1].startswith("`") and cols[1] != "—":
            out[cols[1].strip("`")] = "stated" if cols[3].startswith("stated") else cols[3]
    return out


def settings_of(choice: dict, variant: str) -> list[str]:
    """The params keys a choice changes for a variant's runs."""
    file = S.sensitivity_target(variant)[0]
    if "split" in choice:
        return ["corpus.val_fraction"]
    if "optim" in choice:
        return [f"{file}.{k}" for k in choice["optim"]]
    return [f"{file}.model.{k}" if file == "failures" else f"train.models.{{}}.{k}" for k in choice["model"]]


def test_every_choice_changes_only_unstated_settings():
    p = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    c = S.SensitivityConfig(**p["sensitivity"])
    c.validate()
    rows = protocol_rows()
    assert rows["train.decay"] == "stated" and rows["failures.model.block_size"] == "unstated"
    for name, choice in c.choices.items():
        for v in c.metrics:
            if not c.applies(name, v):
                continue
            for key in settings_of(choice, v):
                keys = [key.format(m) for m in ("small", "large")] if "{}" in key else [key]
                for k in keys:
                    assert rows.get(k) == "unstated", f"{name} changes {k} for {v}: {rows.get(k)}"


def test_the_preregistration_names_cells_and_choices_the_sweep_runs():
    p = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    c = S.SensitivityConfig(**p["sensitivity"])
    entries = S.load_prereg(REPO / S.PREREGISTRATION)
    assert len(entries) >= 5
    for e in entries:
        v, metric = e["cell"].split(".")
        assert metric in c.metrics[v] and c.applies(e["choice"], v), e
        assert e["reason"].strip()


def test_a_run_that_diverged_leaves_its_cells_not_a_number_without_crashing_the_stage_or_the_report():
    from types import SimpleNamespace

    nan = float("nan")
    c = cfg()
    vals = {("d32_scaled", "loss_final", "baseline"): [4.3, nan, 4.29, 4.31, 4.28],  # a baseline run diverged
            ("d32_scaled", "loss_final", "a"): [4.3, 4.33, 4.29, 4.31, 4.28],
            ("failures_correct", "loss_final", "baseline"): BASE,
            ("failures_correct", "loss_final", "a"): [4.0, 4.03, 3.97, 4.0, 4.0],
            ("failures_correct", "loss_final", "b"): [6.0, nan, 5.98, 6.01, 5.99]}  # a choice's run diverged
    m, rows = S.analyse(vals, c)
    assert "mean" not in m["d32_scaled"]["loss_final"]["baseline"]
    assert next(r for r in rows if r["variant"] == "d32_scaled")["baseline"] is None
    published = {("d32_scaled", "loss_final"): (5.0, 0.005), ("failures_correct", "loss_final"): (5.0, 0.005)}
    joint = {j["protocol"]: j for j in S.joint_table(m, published)}
    assert joint["baseline"]["score"] == math.inf and joint["b"]["score"] == math.inf
    md = unpad(S.report_markdown(m, SimpleNamespace(claims=[]), prereg_path=Path("/nonexistent")))
    assert "| d32_scaled.loss_final | not a number |" in md
    assert "| failures_correct.loss_final | 4 | — | b | not a number | not a number (a run diverged) | — |" in md
    assert "No pre-registration at /nonexistent" in md  # said, not silently left out


def test_first_split_takes_validation_from_the_front_of_the_same_stream():
    import io

    import numpy as np

    def npy(a):
        buf = io.BytesIO()
        np.save(buf, np.asarray(a, dtype=np.int32))
        return buf.getvalue()
    train, val = list(range(100, 190)), list(range(190, 200))
    out = S.first_split({"train.npy": npy(train), "val.npy": npy(val), "vocab.json": b"{}"})
    t, v = (np.load(io.BytesIO(out[k])).tolist() for k in ("train.npy", "val.npy"))
    assert v == list(range(100, 110)) and t == list(range(110, 200)) and out["vocab.json"] == b"{}"


def test_accounts_for_says_missing_where_it_cannot_judge():
    base = band(BASE)
    assert S.accounts_for({k: v for k, v in base.items() if k != "center"}, row([4.3] * 4 + [4.31]), 5.0) == "missing"
    logb = band([0.05, 0.051, 0.049, 0.0505, 0.0495], log=True)
    r = {**band([0.1, 0.102, 0.098, 0.101, 0.099], log=True), "p_holm": 0.001}
    assert S.accounts_for(logb, r, 0.0, 0.0) == "missing"  # a published 0 has no log
    assert S.closes(base, row([4.3] * 4 + [4.31]), base["center"]) is None  # no gap to close


def test_the_report_prints_the_share_of_the_gap_a_choice_closes_as_a_plain_percentage(tmp_path, monkeypatch):
    from types import SimpleNamespace

    prereg = tmp_path / "prereg.yaml"
    prereg.write_text("[]\n")
    verdict = {"cell": "c.m", "choice": "a", "verdict": "held", "why": "", "reason": "r", "closes": 0.9996}
    monkeypatch.setattr(S, "prereg_verdicts", lambda *a: [verdict, dict(verdict, closes=-3.9)])
    md = unpad(S.report_markdown(sweep_metrics(), SimpleNamespace(claims=[]), prereg_path=prereg))
    assert "| c.m | a | held | held | 100% | r |" in md and "| -390% |" in md and "e+02" not in md


def test_the_preregistered_entries_as_their_own_family():
    """prereg_family: Holm over the measured entries' raw p alone (an entry the sweep does not run is
    left out); with it, an entry significant among its few pre-registered fellows but not among every
    cell holds."""
    m = sweep_metrics()
    entries = [{"cell": "d32_scaled.loss_final", "choice": "a", "reason": "r"},
               {"cell": "failures_correct.loss_final", "choice": "a", "reason": "r"},
               {"cell": "d256_scaled.loss_final", "choice": "a", "reason": "r"}]
    fam = S.prereg_family(entries, m)
    raw = [m["d32_scaled"]["loss_final"]["a"]["p"], m["failures_correct"]["loss_final"]["a"]["p"]]
    assert list(fam) == [("d32_scaled.loss_final", "a"), ("failures_correct.loss_final", "a")]
    assert list(fam.values()) == holm_adjusted(raw)
    assert fam[("d32_scaled.loss_final", "a")] <= m["d32_scaled"]["loss_final"]["a"]["p_holm"]
    lifted = {"d32_scaled": {"loss_final": {k: dict(r, p_holm=0.2) if k == "a" else r
                                             for k, r in m["d32_scaled"]["loss_final"].items()}}}
    published = {("d32_scaled", "loss_final"): (5.0, 0.005)}
    assert S.prereg_verdicts(entries[:1], lifted, published)[0]["why"] == "not significant"
    assert S.prereg_verdicts(entries[:1], lifted, published,
                             family={("d32_scaled.loss_final", "a"): 0.01})[0]["verdict"] == "held"
