"""training: schedule, optimizer groups, batch order, a tiny run, determinism (§2)."""

import json
import math

import pytest
import torch

from attnrepro.model.transformer import TinyGPT, mean_loss
from attnrepro.run.task_lm import chapter_summary, loss_summary
from attnrepro.run.loop import (
    BatchSampler,
    Diverged,
    IndexedBatches,
    evaluate,
    fixed_batches,
    lr_at,
    make_optimizer,
    qk_scale,
    train_loop,
)

from conftest import optim, tinygpt


TINY = dict(vocab_size=12, block_size=8, d_model=16, n_head=2, n_layer=1)


def stream(n=400, period=5):
    """A periodic token stream: learnable in a few dozen steps."""
    return (torch.arange(n) % period + 2).long()


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyGPT(tinygpt(**{**TINY, **kw}))


def test_lr_warmup_linear_then_cosine_to_floor():
    cfg = optim(steps=110, warmup=10, lr=2.0, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in range(10)] == pytest.approx([2.0 * (s + 1) / 10 for s in range(10)])
    assert lr_at(10, cfg) == pytest.approx(2.0)  # cosine starts at the peak
    assert lr_at(60, cfg) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))  # half-way
    assert lr_at(110, cfg) == pytest.approx(0.2)  # floor at the end
    assert lr_at(109, cfg) == pytest.approx(0.2, abs=1e-3)
    after = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert min(after) >= 0.2 - 1e-12


def test_lr_no_warmup():
    cfg = optim(steps=10, warmup=0, lr=1.0, min_lr_ratio=0.0)
    assert lr_at(0, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(0.0, abs=1e-12)


def test_weight_decay_only_on_2d_params():
    model = tiny_model(n_layer=2)
    opt = make_optimizer(model, optim(weight_decay=0.1, decay="2d"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids_decay = {id(p) for p in decay["params"]}
    ids_no = {id(p) for p in no_decay["params"]}
    named = dict(model.named_parameters())  # tied head listed once
    assert ids_decay | ids_no == {id(p) for p in named.values()} and not ids_decay & ids_no
    for name, p in named.items():
        if name.endswith("bias") or ".ln" in name or name.startswith("ln_f"):
            assert id(p) in ids_no, name
        else:
            assert p.dim() == 2 and id(p) in ids_decay, name
    assert id(model.blocks[0].attn.qkv.weight) in ids_decay
    assert id(model.blocks[0].ln1.weight) in ids_no and id(model.blocks[0].mlp[0].bias) in ids_no


def test_batch_sampler_windows():
    toks = torch.arange(100)
    x, y = BatchSampler(toks, 8, 16, seed=0).next()
    assert x.shape == y.shape == (16, 8)
    assert torch.equal(y, x + 1)  # targets are the next tokens
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)  # contiguous windows
    assert int(y.max()) <= 99
    with pytest.raises(ValueError):
        BatchSampler(torch.arange(9), 8, 2, seed=0)


def test_batch_sampler_spare_draws_starts_as_doc_003_does():
    toks = torch.arange(12)  # block 8: starts 0..3 with spare 0; doc 003's randint(0, len - block - 1): 0..2
    starts = lambda spare: {int(x[0]) for _ in range(200) for x in BatchSampler(toks, 8, 4, seed=_, spare=spare).next()[0]}  # noqa: E731
    assert starts(0) == {0, 1, 2, 3} and starts(1) == {0, 1, 2}


def test_batch_order_independent_of_model_init_and_global_seed():
    toks = torch.arange(1000)
    s1 = BatchSampler(toks, 8, 4, seed=42)
    tiny_model(seed=0)
    first = [s1.next()[0] for _ in range(5)]
    s2 = BatchSampler(toks, 8, 4, seed=42)
    tiny_model(seed=123, d_model=32)  # a different init draw in between
    torch.manual_seed(999)
    torch.rand(17)
    second = [s2.next()[0] for _ in range(5)]
    assert all(torch.equal(p, q) for p, q in zip(first, second))
    other = BatchSampler(toks, 8, 4, seed=43).next()[0]
    assert not torch.equal(other, first[0])


def test_fixed_batches_repeatable():
    toks = torch.arange(500)
    a = fixed_batches(toks, 8, 4, 3, seed=1)
    b = fixed_batches(toks, 8, 4, 3, seed=1)
    assert len(a) == 3 and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


def run_tiny(steps=40, diag=frozenset({0, 7, 39}), val_every=10, seed=0):
    model = tiny_model(seed)
    toks = stream()
    sampler = BatchSampler(toks, 8, 8, seed=seed + 1)
    val = fixed_batches(toks, 8, 4, 2, seed=99)
    cfg = optim(steps=steps, batch_size=8, lr=1e-2, warmup=5)
    return model, train_loop(model, sampler, cfg, diag_steps=set(diag),
                             evaluate_fn=lambda m: {"val_loss": mean_loss(m, val)}, eval_every=val_every)


def test_train_loss_decreases_and_records_diagnostics_on_schedule():
    calls = []
    model = tiny_model(0)
    toks = stream()
    val = fixed_batches(toks, 8, 4, 2, seed=99)
    cfg = optim(steps=40, batch_size=8, lr=1e-2, warmup=5)
    res = train_loop(model, BatchSampler(toks, 8, 8, seed=1), cfg, diag_steps={0, 7, 39},
                     evaluate_fn=lambda m: {"val_loss": mean_loss(m, val)}, eval_every=10,
                     progress=lambda s, loss: calls.append(s))
    h = res.history
    assert [r["step"] for r in h] == list(range(40)) and calls == list(range(40))
    assert h[0]["loss"] == pytest.approx(math.log(12), abs=0.3)  # near-uniform start
    first, last = sum(r["loss"] for r in h[:3]) / 3, sum(r["loss"] for r in h[-3:]) / 3
    assert last < first - 0.5, (first, last)
    diag_keys = {"entropy_l0", "logit_std_l0", "jacobian_fro_l0"}
    for r in h:
        assert {"lr", "loss", "grad_norm"} <= set(r)
        assert (diag_keys <= set(r)) == (r["step"] in {0, 7, 39}), r
        assert not (set(r) - diag_keys - {"step", "lr", "loss", "grad_norm"})
        assert r["lr"] == pytest.approx(lr_at(r["step"], cfg))
    # the val loss is measured on the state after `step` updates, every 10 steps from 0
    assert [e["step"] for e in res.evals] == [0, 10, 20, 30]
    assert 0 < h[0]["entropy_l0"] <= 1
    # record mode is switched off again after a diagnostics step
    assert all(a.record is False and a.last is None for a in model.attentions)
    # val loss at step 0 is the untrained model's loss on the fixed batches
    fresh = tiny_model(0)
    assert res.evals[0]["val_loss"] == pytest.approx(evaluate(fresh, val)["loss"], rel=1e-6)


def test_train_deterministic_history():
    _, a = run_tiny(steps=15)
    _, b = run_tiny(steps=15)
    assert json.dumps(a.history) == json.dumps(b.history)
    _, c = run_tiny(steps=15, seed=1)
    assert json.dumps(a.history) != json.dumps(c.history)


def test_evaluate_and_qk_scale():
    model = tiny_model(0, n_layer=2)
    model.train()
    batches = fixed_batches(stream(), 8, 4, 2, seed=3)
    out = evaluate(model, batches)
    assert set(out) == {"loss"} | {f"{k}_l{i}" for k in ("entropy", "logit_std", "jacobian_fro") for i in (0, 1)}
    assert model.training and all(a.last is None for a in model.attentions)
    s = qk_scale(model, batches[0][0])
    assert set(s) == {f"{k}_l{i}" for k in ("q_std", "k_std", "logit_std", "w_qkv_fro") for i in (0, 1)}
    assert s["w_qkv_fro_l0"] == pytest.approx(model.blocks[0].attn.qkv.weight.double().norm().item())


def test_summary_contract():
    hist = [{"step": s, "loss": float(10 - s), "grad_norm": 0.5,
             **({"entropy_l0": 0.1 * s, "logit_std_l0": s, "jacobian_fro_l0": 0.01 * s} if s in (0, 3) else {})}
            for s in range(6)]
    final = {"loss": 4.5, "entropy_l0": 0.5, "entropy_l1": 0.6, "logit_std_l0": 2.0, "logit_std_l1": 3.0,
             "jacobian_fro_l0": 0.2, "jacobian_fro_l1": 0.3}
    s = {**loss_summary(hist, 3), **chapter_summary(hist, final, [0, 3, 100], {"q_std_l0": 1.0}, {"q_std_l0": 2.0})}
    assert s["loss_start"] == 10.0
    assert s["loss_final"] == pytest.approx((7 + 6 + 5) / 3)  # mean of the last loss_window steps
    assert s["loss_last_step"] == 5.0 and s["val_loss_final"] == 4.5 and s["grad_norm_final"] == 0.5
    assert s["entropy_final"] == 0.5 and s["entropy_final_l1"] == 0.6 and s["logit_std_final_l0"] == 2.0
    assert s["jacobian_fro_final"] == 0.2
    assert s["entropy_step3"] == pytest.approx(0.3) and "entropy_step100" not in s
    assert s["init_q_std_l0"] == 1.0 and s["trained_q_std_l0"] == 2.0


def test_adam_constant_lr_and_all_param_decay():
    model = tiny_model(0)
    cfg = optim(optimizer="adam", weight_decay=0.0, decay="all", schedule="constant", lr=0.5)
    opt = make_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.Adam) and not isinstance(opt, torch.optim.AdamW)
    assert len(opt.param_groups) == 1 and {lr_at(s, cfg) for s in (0, 50, 1499)} == {0.5}


def test_indexed_batches_follow_the_table():
    x, y = torch.arange(20).view(10, 2), -torch.arange(20).view(10, 2)
    b = IndexedBatches(x, y, torch.tensor([[3, 1], [0, 9]]))
    assert b.next()[0].tolist() == [[6, 7], [2, 3]] and b.next()[1].tolist() == [[0, -1], [-18, -19]]


def test_divergence_stops_the_run_at_once_naming_step_and_layer():
    model = tiny_model(0)
    cfg = optim(steps=50, batch_size=8, lr=1e6, warmup=0, grad_clip=None, decay="2d")
    with pytest.raises(Diverged) as e:
        train_loop(model, BatchSampler(stream(), 8, 8, seed=1), cfg)
    assert e.value.step < 10 and str(e.value).startswith(f"diverged at step {e.value.step}: the training loss is nan")
    assert "module blocks." in str(e.value)  # names where the first non-finite value appeared
    # an overflowing softmax is localized to its attention layer and operation
    model = tiny_model(0, bug="no_stable_softmax", scaled=False, init_std=2.0)
    with pytest.raises(Diverged) as e:
        train_loop(model, BatchSampler(stream(), 8, 8, seed=1), optim(steps=5, batch_size=8))
    assert e.value.step == 0 and "layer 0: first non-finite at step 'exp'" in str(e.value)
