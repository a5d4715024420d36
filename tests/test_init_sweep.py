"""The init_sweep stage's library call on a tiny config: what it refuses."""

from __future__ import annotations

import textwrap

import pytest

from attnrepro.config import UserError, from_dict
from attnrepro.experiments.init_sweep import InitSweepConfig, run
from attnrepro.model.attention_impl import resolve

NAN_ATTENTION = """
import torch

def attn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return torch.full(query.shape[:-1] + value.shape[-1:], float("nan"))
"""


def test_an_attention_that_returns_nan_is_one_line(tmp_path, monkeypatch):
    """An attention.impl returning NaN let init_sweep exit 0 (issue 39)."""
    (tmp_path / "bi_nan.py").write_text(textwrap.dedent(NAN_ATTENTION))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = resolve("bi_nan:attn").identity
    cfg = from_dict(InitSweepConfig, {"d_heads": [32, 64], "vocab_size": 50, "block_size": 8, "batch_size": 2,
                                      "n_batches": 2, "token_low": 2, "init_std": 0.02, "model_seed": 0,
                                      "batch_seed": 0, "threads": 1}, "init_sweep")
    with pytest.raises(UserError, match=r"^init_sweep: at d_head 32 the attention \(bi_nan:attn@\w+\) gives "
                                         r"non-finite .*entropy"):
        run(cfg, impl)
