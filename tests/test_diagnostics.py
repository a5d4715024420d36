"""diagnostics: the §1.19.3 measures on causal rows."""

import math

import pytest
import torch

from attnrepro.model.attention import causal_mask
from attnrepro.measure.weights import (
    jacobian_fro,
    jacobian_fro_explicit,
    layer_summary,
    logit_std,
    normalized_entropy,
    position_stats,
    visible_keys,
)



def causal_uniform(t):
    m = causal_mask(t, t).double()
    return m / m.sum(-1, keepdim=True)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_jacobian_closed_form_matches_explicit(n):
    g = torch.Generator().manual_seed(n)
    rows = torch.softmax(torch.randn(5, n, generator=g, dtype=torch.float64) * 3, -1)
    closed = jacobian_fro(rows.unsqueeze(0))  # one "head", 5 rows -> mean over rows
    explicit = torch.stack([jacobian_fro_explicit(r) for r in rows]).mean()
    assert abs(closed.item() - explicit.item()) < 1e-12
    for r in rows:  # row by row too (a row of a 1 x n matrix)
        assert abs(jacobian_fro(r[None]).item() - jacobian_fro_explicit(r).item()) < 1e-12


def test_jacobian_explicit_is_really_the_matrix_norm():
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    J = torch.diag(p) - torch.outer(p, p)
    assert jacobian_fro_explicit(p).item() == pytest.approx(math.sqrt((J ** 2).sum().item()), abs=1e-15)


def test_jacobian_one_hot_and_uniform():
    one_hot = torch.zeros(1, 6, dtype=torch.float64)
    one_hot[0, 2] = 1
    assert jacobian_fro(one_hot).item() == pytest.approx(0.0, abs=1e-15)
    for n in (2, 5, 64):
        u = torch.full((1, n), 1 / n, dtype=torch.float64)
        assert jacobian_fro(u).item() == pytest.approx(math.sqrt(1 / n - 1 / n ** 2), abs=1e-14)


def test_normalized_entropy_uniform_is_one():
    p = causal_uniform(8)[None, None].repeat(2, 3, 1, 1)
    h = normalized_entropy(p)
    assert h.shape == (2, 3)
    torch.testing.assert_close(h, torch.ones(2, 3, dtype=torch.float64))


def test_normalized_entropy_one_hot_is_zero():
    p = torch.eye(6, dtype=torch.float64)  # each query attends to itself only
    assert normalized_entropy(p).item() == pytest.approx(0.0, abs=1e-15)


def test_normalized_entropy_excludes_row_zero():
    # rows 1.. uniform -> 1; row 0 can only be one-hot (entropy 0). Including it would give < 1.
    p = causal_uniform(4)
    assert normalized_entropy(p).item() == pytest.approx(1.0, abs=1e-12)
    # a half-uniform, half-peaked matrix averages the visible rows only
    q = p.clone()
    q[3] = torch.tensor([0, 0, 0, 1.0], dtype=torch.float64)
    assert normalized_entropy(q).item() == pytest.approx(2 / 3, abs=1e-12)


def test_normalized_entropy_kv_cache_rows():
    # 2 queries at absolute positions 3 and 4 of 5 keys: 4 and 5 visible keys
    assert visible_keys(2, 5).tolist() == [4, 5]
    m = causal_mask(2, 5).double()
    p = m / m.sum(-1, keepdim=True)
    assert normalized_entropy(p).item() == pytest.approx(1.0, abs=1e-12)


def test_logit_std_ignores_masked_entries():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64) * 3
    allowed = causal_mask(6, 6)
    expected = logits[..., allowed].std().item()
    masked = logits.masked_fill(~allowed, float("-inf"))
    got = logit_std(masked)
    assert math.isfinite(got)
    assert got == pytest.approx(expected, rel=1e-12)
    # and the masked entries' values do not matter
    assert logit_std(logits.masked_fill(~allowed, 1e6)) == pytest.approx(expected, rel=1e-12)


def test_position_stats_hand_built():
    # 4 x 4 causal matrix; rows 1..3 are what counts
    p = torch.tensor([
        [1.0, 0.0, 0.0, 0.0],
        [0.25, 0.75, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [0.5, 0.0, 0.0, 0.5],
    ], dtype=torch.float64)
    s = position_stats(p)
    assert s["diag"].item() == pytest.approx((0.75 + 0.0 + 0.5) / 3)
    assert s["prev"].item() == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    # distances: row1 0.25*1; row2 1*1; row3 0.5*3
    assert s["distance"].item() == pytest.approx((0.25 + 1.0 + 1.5) / 3)


def test_position_stats_previous_token_head():
    t = 6
    p = torch.zeros(t, t, dtype=torch.float64)
    p[0, 0] = 1
    for i in range(1, t):
        p[i, i - 1] = 1
    s = position_stats(p[None, None].repeat(1, 2, 1, 1))
    assert s["prev"].shape == (1, 2)
    torch.testing.assert_close(s["prev"], torch.ones(1, 2, dtype=torch.float64))
    torch.testing.assert_close(s["diag"], torch.zeros(1, 2, dtype=torch.float64))
    torch.testing.assert_close(s["distance"], torch.ones(1, 2, dtype=torch.float64))


def test_position_stats_single_token_has_no_previous_token():
    """A one-token sequence: all weight on the diagonal, none on a previous token.

    Index pos - 1 = -1 must not wrap around to the last column.
    """
    s = position_stats(torch.ones(1, 1, dtype=torch.float64))
    assert s["diag"].item() == 1.0
    assert s["prev"].item() == 0.0
    assert s["distance"].item() == 0.0


def test_layer_summary_keys_and_values():
    p = causal_uniform(5)[None, None]
    logits = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    s = layer_summary(p, logits)
    assert set(s) == {"entropy", "logit_std", "jacobian_fro"}
    assert s["entropy"] == pytest.approx(1.0)
    assert s["logit_std"] == 0.0
    expected = sum(math.sqrt(1 / n - 1 / n ** 2) for n in range(1, 6)) / 5
    assert s["jacobian_fro"] == pytest.approx(expected)
