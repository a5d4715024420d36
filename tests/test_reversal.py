"""Digit-reversal companion experiment: data, masks, generation, parity, determinism."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml

from attnrepro.config import ConfigError, from_dict
from attnrepro.experiments import reversal as R
from attnrepro.files import dumps_json
from attnrepro.model.transformer import TinyGPT, load_checkpoint
from attnrepro.run import task_reversal as RT
from attnrepro.run.execute import execute

ROOT = Path(__file__).resolve().parents[1]


PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def cfg(**kw) -> R.ReversalConfig:
    """params.yaml's reversal section (the only source of values) with `kw` replaced."""
    return from_dict(R.ReversalConfig, {**PARAMS["reversal"], **kw}, prefix="reversal")


def test_sequence_and_labels():
    seq = RT.encode(torch.tensor([[3, 1, 4, 2, 0, 5]]))
    assert seq.tolist() == [[10, 3, 1, 4, 2, 0, 5, 11, 5, 0, 2, 4, 1, 3, 12]]
    x, y = RT.inputs_labels(seq)
    assert x.tolist() == [[10, 3, 1, 4, 2, 0, 5, 11, 5, 0, 2, 4, 1, 3]]
    assert y.tolist() == [[-100] * 7 + [5, 0, 2, 4, 1, 3, 12]]
    # labels are the inputs shifted by one wherever they are supervised
    assert torch.equal(y[0, 7:13], x[0, 8:14])


def test_splits_disjoint_and_fixed():
    a = R.make_splits(300, 50, 40, seed=0)
    b = R.make_splits(300, 50, 40, seed=0)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [len(a[k]) for k in ("train", "val", "test")] == [300, 50, 40]
    keys = [tuple(s[1:7].tolist()) for k in a for s in a[k]]
    assert len(set(keys)) == len(keys)
    for s in a["test"]:
        assert s[8:14].tolist() == s[1:7].flip(0).tolist()
    idx = RT.batch_indices(300, 600, 64, seed=1)
    assert idx.shape == (600, 64) and int(idx.max()) < 300
    assert torch.equal(idx, RT.batch_indices(300, 600, 64, seed=1))


@pytest.mark.parametrize("variant", ["heads4", "heads1", "no_mask"])
def test_parameter_count_exact(variant):
    model = TinyGPT(cfg().model_config(variant))
    assert model.num_params() == 69_709


def init_models(c: R.ReversalConfig) -> dict[str, TinyGPT]:
    """Each variant built from the seed alone, as its run builds it."""
    out = {}
    for name in c.variants:
        torch.manual_seed(c.seed)
        out[name] = TinyGPT(c.model_config(name))
    return out


def test_identical_initial_weights_across_variants():
    models = init_models(cfg())
    states = [m.state_dict() for m in models.values()]
    for s in states[1:]:
        assert s.keys() == states[0].keys()
        assert all(torch.equal(s[k], states[0][k]) for k in s)
    m = models["heads4"]
    # init "normal": weights N(0, 0.02) everywhere (no gpt2 residual shrink), biases zero
    assert abs(m.blocks[0].attn.proj.weight.std().item() - 0.02) < 0.002
    assert m.blocks[0].attn.q.bias.abs().sum() == 0 and m.head.bias.abs().sum() == 0
    assert models["heads1"].cfg.n_head == 1 and models["no_mask"].cfg.causal is False


def test_causal_mask_hides_future_tokens():
    torch.manual_seed(0)
    model = TinyGPT(cfg().model_config("heads4")).eval()
    seq = R.make_splits(4, 1, 1, seed=3)["test"]
    x = seq[:, :-1]
    alt = x.clone()
    alt[:, 10:] = (alt[:, 10:] + 3) % 10
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(alt)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])
    # the same weights without the mask do let the future leak
    assert R.prefix_change(model, seq[0], causal=True) == 0.0
    assert R.prefix_change(model, seq[0], causal=False) > 0.0


class Spy(torch.nn.Module):
    """Wraps a model and keeps every input it is given."""

    def __init__(self, model):
        super().__init__()
        self.model, self.cfg, self.seen = model, model.cfg, []

    def forward(self, idx, targets=None):
        self.seen.append(idx.clone())
        return self.model(idx, targets)


def test_generation_never_sees_the_answer():
    torch.manual_seed(1)
    model = TinyGPT(cfg().model_config("heads4"))
    seqs = R.make_splits(1, 1, 16, seed=5)["test"]
    spy = Spy(model)
    pred = R.generate_answers(spy, seqs[:, :R.PROMPT_LEN])
    assert pred.shape == (16, 7)
    assert [s.shape[1] for s in spy.seen] == list(range(8, 15))
    for s in spy.seen:  # every input beyond the prompt is the model's own previous output
        assert torch.equal(s[:, :8], seqs[:, :8])
        assert torch.equal(s[:, 8:], pred[:, : s.shape[1] - 8])
    with pytest.raises(ValueError):
        R.generate_answers(model, seqs[:, :9])  # a prompt carrying an answer digit is refused


def test_accuracy_definitions():
    seqs = RT.encode(torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 0, 1, 2]]))
    truth = seqs[:, 8:]
    pred = truth.clone()
    pred[0, 5] = 0  # one wrong digit
    pred[1, 6] = 3  # all digits right, no EOS
    acc = R.accuracy(pred, seqs)
    assert acc["digit_acc"] == pytest.approx(11 / 12)
    assert acc["seq_acc"] == 0.0
    assert R.accuracy(truth, seqs)["seq_acc"] == 1.0


def test_alignment_reads_the_reverse_diagonal():
    maps = torch.zeros(2, 3, 14, 14)
    for q, k in zip(R.ALIGN_QUERIES, R.ALIGN_KEYS):
        maps[0, 1, q, k] = 1.0
    maps[1, :, 7:13, 0] = 0.5  # weight elsewhere does not count, nothing is renormalized
    al = R.alignment(maps)
    assert al[0, 1] == 1.0 and al[0, 0] == 0.0 and al[1].abs().sum() == 0
    assert R.ALIGN_QUERIES == [7, 8, 9, 10, 11, 12] and R.ALIGN_KEYS == [6, 5, 4, 3, 2, 1]


@pytest.mark.parametrize("variant", ["heads4", "heads1", "no_mask"])
def test_multihead_attention_parity(variant):
    torch.manual_seed(2)
    model = TinyGPT(cfg().model_config(variant))
    attn = model.attentions[0]
    for lin in (attn.q, attn.k, attn.v, attn.proj):  # non-zero biases make the check stronger
        torch.nn.init.normal_(lin.bias, std=0.1)
    x = torch.randn(3, 14, 64)
    diff = R.mha_parity(attn, x)
    assert diff["out"] < 1e-5 and diff["weights"] < 1e-6
    # sensitivity: the same weights split into a different number of heads must not match
    other = torch.nn.MultiheadAttention(64, 2 if attn.cfg.n_head != 2 else 4, batch_first=True)
    with torch.no_grad():
        other.in_proj_weight.copy_(torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
        other.in_proj_bias.copy_(torch.cat([attn.q.bias, attn.k.bias, attn.v.bias]))
        other.out_proj.weight.copy_(attn.proj.weight)
        other.out_proj.bias.copy_(attn.proj.bias)
        mask = torch.ones(14, 14, dtype=torch.bool).triu(1) if attn.cfg.causal else None
        wrong, _ = other(x, x, x, attn_mask=mask)
        ours = attn(x)
    assert (wrong - ours).abs().max() > 1e-4


def test_bad_params_are_one_line_errors():
    with pytest.raises(ConfigError, match="n_head"):
        cfg(variants={"x": {"n_head": 5, "causal": True}})
    with pytest.raises(ConfigError, match="sample_index"):
        cfg(n_test=4, sample_index=4)


TINY = dict(n_train=256, n_val=64, n_test=32, steps=12, batch_size=16, eval_every=6)


def tiny_run(c: R.ReversalConfig) -> bytes:
    splits = R.make_splits(c.n_train, c.n_val, c.n_test, c.data_seed)
    out = {}
    for name in c.variants:
        with tempfile.TemporaryDirectory() as tmp:
            execute(R.run_spec(c, name), {}, Path(tmp))
            model = load_checkpoint(Path(tmp) / "model.pt")
            evals, history = (json.loads((Path(tmp) / f).read_text(encoding="utf-8"))
                              for f in ("evals.json", "history.json"))
        hist = R.loss_rows(evals, history)
        out[name] = R.evaluate_variant(model, splits, hist, c)[0]
        out[name]["weight_sum"] = sum(p.double().sum().item() for p in model.parameters())
    return dumps_json(out).encode()


def test_tiny_run_is_deterministic():
    c = cfg(**TINY, variants={"heads4": {"n_head": 4, "causal": True},
                              "heads1": {"n_head": 1, "causal": True}})
    first = tiny_run(c)
    assert first == tiny_run(c)
    assert first != tiny_run(cfg(**TINY, seed=43, variants={
        "heads4": {"n_head": 4, "causal": True}, "heads1": {"n_head": 1, "causal": True}}))


def test_stage_end_to_end_and_bad_params(tmp_path):
    full = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    sec = full["reversal"]
    sec.update(TINY, variants={"heads4": {"n_head": 4, "causal": True}})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"engine": full["engine"], "reversal": sec}), encoding="utf-8")
    cmd = [sys.executable, str(ROOT / "stages/reversal.py"), "--params", str(params)]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((tmp_path / "metrics/reversal.json").read_text(encoding="utf-8"))
    for key in ("digit_acc", "seq_acc", "align_l0", "align_l1", "align_l0_h3", "prefix_change_mask_on",
                "prefix_change_mask_off", "params", "train_loss_final", "val_loss_final"):
        assert isinstance(metrics["heads4"][key], (int, float)), key
    assert metrics["heads4"]["prefix_change_mask_on"] == 0
    for f in ("plots/reversal/losses.csv", "plots/reversal/loss_curves.png",
              "plots/reversal/attention_heads4.png", "data/reversal/predictions_heads4.csv",
              "data/reversal/heads4.pt"):
        assert (tmp_path / f).stat().st_size > 0
    header = (tmp_path / "plots/reversal/losses.csv").read_text(encoding="utf-8").splitlines()[0]
    assert header == "step,heads4_train_loss,heads4_val_loss,heads4_batch_loss"  # one column per series

    sec["lr"] = -1
    params.write_text(yaml.safe_dump({"engine": full["engine"], "reversal": sec}), encoding="utf-8")
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "reversal.lr" in res.stderr
