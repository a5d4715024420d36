"""AttentionDebugger: periodic diagnostics, warnings, and nan localization by step and layer."""

import warnings

import pytest
import torch

from attnrepro.measure.debugger import STEPS, AttentionDebugger, AttentionWarning
from attnrepro.model.transformer import TinyGPT
from conftest import tinygpt


def tiny(**kw) -> TinyGPT:
    # init_std 0.2: q.k of order 1 at init, so a healthy model sits inside the entropy band
    # (with the chapter's 0.02 the initial attention is near-uniform, see init_sweep)
    cfg = dict(vocab_size=40, block_size=16, d_model=32, n_head=2, n_layer=2, init_std=0.2)
    cfg.update(kw)
    torch.manual_seed(0)
    return TinyGPT(tinygpt(**cfg))


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 40, (4, 16), generator=g)
    return x, torch.roll(x, -1, 1)


def blow_up_qk(model: TinyGPT, layer: int, factor: float) -> None:
    """Scale layer `layer`'s q and k projection rows: logits grow by factor^2."""
    d = model.cfg.d_model
    with torch.no_grad():
        model.blocks[layer].attn.qkv.weight[: 2 * d] *= factor


@pytest.mark.parametrize("layer", [0, 1])
def test_overflow_is_localized_to_exp_in_the_right_layer(layer):
    model = tiny(scaled=False, bug="no_stable_softmax")
    blow_up_qk(model, layer, 60.0)
    x, y = batch()
    with AttentionDebugger(model, warn=False) as dbg:
        _, loss = model(x, y)
        assert not torch.isfinite(loss)
        loc = dbg.step(7, loss.item())
    assert loc is not None and loc.found
    assert (loc.layer, loc.step) == (layer, "exp")
    assert dbg.events[-1].kind == "non_finite_loss" and dbg.events[-1].step == 7
    assert dbg.localizations == [(7, loc)]


def test_same_weights_with_stable_softmax_stay_finite_but_warn_saturation():
    model = tiny(scaled=False)  # correct, stable softmax
    blow_up_qk(model, 1, 60.0)
    x, y = batch()
    dbg = AttentionDebugger(model, every=1, logit_std_max=50.0)
    _, loss = model(x, y)
    assert torch.isfinite(loss)
    with pytest.warns(AttentionWarning):
        assert dbg.step(0, loss.item()) is None
    kinds = {(e.layer, e.kind) for e in dbg.events}
    assert (1, "entropy_low") in kinds and (1, "logit_std_high") in kinds
    assert not any(e.layer == 0 for e in dbg.events)
    dbg.detach()


def test_dk_not_sqrt_triggers_the_high_entropy_warning_and_correct_does_not():
    kinds = {}
    for bug in ("correct", "dk_not_sqrt"):
        model = tiny(bug=bug, init_std=0.12)  # same weights; only the scaling differs
        dbg = AttentionDebugger(model, every=1, warn=False)
        x, y = batch()
        _, loss = model(x, y)
        dbg.step(0, loss.item())
        kinds[bug] = {(e.layer, e.kind) for e in dbg.events}
    assert kinds["correct"] == set()
    assert kinds["dk_not_sqrt"] == {(0, "entropy_high"), (1, "entropy_high")}


def test_healthy_model_logs_every_n_steps_without_events():
    model = tiny()
    dbg = AttentionDebugger(model, every=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttentionWarning)
        for step in range(7):
            x, y = batch(step)
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            dbg.step(step, loss.item())
            opt.step()
    assert [r["step"] for r in dbg.history] == [0, 3, 6]
    row = dbg.history[0]
    for key in ("entropy_l0", "logit_std_l1", "jacobian_fro_l0"):
        assert key in row
    assert 0.01 < row["entropy_l0"] < 0.99 and dbg.events == []


def test_recomputed_attention_matches_the_recorded_forward():
    model = tiny()
    dbg = AttentionDebugger(model)
    x, _ = batch()
    model.set_record(True)
    model(x)
    for i, a in enumerate(model.attentions):
        _, _, _, res = dbg._recompute(i)
        assert torch.equal(res.weights, a.last["weights"])
    dbg.detach()


def test_grace_steps_silence_the_uniform_attention_of_initialization():
    model = tiny(init_std=0.02)
    x, y = batch()
    quiet = AttentionDebugger(model, every=1, grace_steps=10, warn=False)
    loud = AttentionDebugger(model, every=1, warn=False)
    _, loss = model(x, y)
    quiet.step(0, loss.item())
    assert quiet.events == [] and quiet.history[0]["entropy_l0"] > 0.99
    loud.step(0, loss.item())
    assert {e.kind for e in loud.events} == {"entropy_high"}


def test_detach_removes_hooks_and_a_finite_model_localizes_nothing():
    model = tiny()
    dbg = AttentionDebugger(model)
    x, _ = batch()
    model(x)
    loc = dbg.localize()
    assert not loc.found and loc.step is None
    dbg.detach()
    assert all(len(a._forward_hooks) == 0 for a in model.attentions)


def test_step_before_any_forward_and_bad_settings_are_clear_errors():
    with pytest.raises(RuntimeError, match="no forward pass captured"):
        AttentionDebugger(tiny()).step(0, 1.0)
    with pytest.raises(ValueError, match="every"):
        AttentionDebugger(tiny(), every=0)
    assert STEPS == ("scores", "masked", "exp", "weights")
