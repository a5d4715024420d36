"""Health checks: each one fires on the bug it is meant for and passes on correct attention."""

import math

import pytest
import torch

from attnrepro.model.attention import BUGS, attention
from attnrepro.measure.health import (
    CHECKS,
    INTENDED,
    ROW_SUM_TOL,
    HealthResult,
    Probe,
    boundary_probe,
    check_boundary,
    check_entropy,
    check_matrix,
    check_row_sums,
    future_weight_max,
    row_sum_error,
    run_checks,
    variant_attention,
)


@pytest.fixture(scope="module")
def matrix():
    return check_matrix()


def test_correct_attention_passes_every_check(matrix):
    for name, res in matrix["correct"].items():
        assert isinstance(res, HealthResult)
        assert res.passed, f"{name} fired on correct attention: {res.message}"


@pytest.mark.parametrize("bug", [b for b in BUGS if b != "correct"])
def test_each_bug_is_caught_by_its_intended_check(matrix, bug):
    res = matrix[bug][INTENDED[bug]]
    assert not res.passed, f"{INTENDED[bug]} missed {bug}: {res.message}"
    assert res.message and res.name == INTENDED[bug]


def test_every_check_is_intended_for_some_bug():
    assert set(INTENDED.values()) == set(CHECKS)


def test_mask_zero_leaks_future_weight(matrix):
    assert matrix["mask_zero"]["check_future_zero"].measured > 0
    assert matrix["correct"]["check_future_zero"].measured == 0.0


def test_scale_after_softmax_row_sums_are_one_over_sqrt_d():
    for d in (16, 32, 64):
        res = check_row_sums(variant_attention("scale_after_softmax"), Probe(d_head=d))
        assert not res.passed
        assert res.measured == pytest.approx(1 - 1 / math.sqrt(d), abs=1e-5)


def test_row_sum_tolerance_is_stated_and_respected():
    assert 0 < ROW_SUM_TOL <= 1e-4
    res = check_row_sums(variant_attention("correct"))
    assert res.threshold == ROW_SUM_TOL and res.measured <= ROW_SUM_TOL
    # a perturbation just above the tolerance must fire
    def nudged(q, k, v):
        r = attention(q, k, v)
        return r.out, r.weights * (1 + 3 * ROW_SUM_TOL)
    assert not check_row_sums(nudged).passed


def test_boundary_probe_feeds_logits_of_the_requested_std():
    probe = Probe(batch=4, heads=2, seq=32)
    q, k, v = boundary_probe(probe, 5000.0)
    logits = attention(q, k, v, causal=False).logits
    assert logits.std().item() == pytest.approx(5000.0, rel=0.05)


def test_boundary_check_nan_only_without_stable_softmax():
    assert check_boundary(variant_attention("correct")).passed
    res = check_boundary(variant_attention("no_stable_softmax"))
    assert not res.passed and res.measured > 0
    # at small logits the unstable softmax is indistinguishable: the check needs the boundary
    assert check_boundary(variant_attention("no_stable_softmax"), logit_std=1.0).passed


def test_entropy_check_fires_both_ways():
    assert check_entropy(variant_attention("correct")).passed
    high = check_entropy(variant_attention("dk_not_sqrt"))
    assert not high.passed and high.measured >= 0.99
    # unscaled attention on large-variance q, k saturates: entropy below the band
    def saturated(q, k, v):
        return attention(q * 30, k * 30, v, scaled=False)
    low = check_entropy(saturated)
    assert not low.passed and low.measured <= 0.01


def test_checks_accept_a_user_function_returning_a_tuple():
    def my_attention(q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        t = s.shape[-1]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        w = torch.softmax(s, -1)
        return w @ v, w
    assert all(r.passed for r in run_checks(my_attention))


def test_weight_helpers():
    w = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    assert future_weight_max(w) == 0.0 and row_sum_error(w) == 0.0
    leak = torch.tensor([[0.9, 0.1], [0.25, 0.75]])
    assert future_weight_max(leak) == pytest.approx(0.1)
    assert math.isnan(row_sum_error(torch.tensor([[float("nan"), 0.0]])))


def test_variant_attention_rejects_unknown_bug():
    with pytest.raises(ValueError, match="unknown attention bug"):
        variant_attention("typo")


def test_results_are_deterministic():
    a = [r.as_dict() for r in run_checks(variant_attention("dk_not_sqrt"))]
    b = [r.as_dict() for r in run_checks(variant_attention("dk_not_sqrt"))]
    assert a == b
