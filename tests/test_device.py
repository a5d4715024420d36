"""Tensors made on the model's device: the measurements run on a CPU stand-in for a GPU that fails on a
device mismatch as CUDA does, so a tensor built on the CPU and mixed with the model's fails on CPU CI.

The stand-in: tensors "on the device" are CPU tensors of the subclass OnDevice, whose `device` reads
`meta`; factories and `.to` asked for that device make OnDevice tensors; an operation mixing an
OnDevice tensor with a plain tensor of one or more dimensions raises (CUDA accepts CPU scalars, and
CPU index tensors inside [], as here). The last test runs the same measurements on a real GPU."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from attnrepro.envinfo import setup_determinism
from attnrepro.measure import probes, weights
from attnrepro.model.transformer import ModelConfig, TinyGPT
from attnrepro.run import task_lm

FAKE = torch.device("meta")
MIXING_ALLOWED = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}  # CPU indices index a CUDA tensor
PLAIN_RESULT = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.item, torch.Tensor.tolist}


class OnDevice(torch.Tensor):
    """A CPU tensor standing in for one on another device (see the module docstring)."""

    @property
    def device(self):
        return FAKE

    @property
    def is_meta(self):
        return False


def _fake_device(x) -> bool:
    return isinstance(x, (torch.device, str)) and torch.device(x) == FAKE


def _on_device(t) -> torch.Tensor:
    return t.as_subclass(OnDevice) if isinstance(t, torch.Tensor) and not isinstance(t, OnDevice) else t


class DeviceStandIn(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        made_there = False
        if _fake_device(kwargs.get("device")):
            kwargs["device"], made_there = "cpu", True
        if func in (torch.Tensor.to, torch.Tensor.type_as, torch.Tensor.new_tensor):
            made_there |= any(_fake_device(a) for a in args) or any(isinstance(a, OnDevice) for a in args[1:])
            args = tuple("cpu" if _fake_device(a) else a for a in args)
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        there = [t for t in leaves if isinstance(t, OnDevice)]
        here = [t for t in leaves if not isinstance(t, OnDevice) and t.dim() > 0]
        if there and here and func not in MIXING_ALLOWED and not made_there:
            raise RuntimeError(f"device mismatch in {getattr(func, '__name__', func)}: a tensor on the model's device "
                               f"and a CPU tensor of shape {tuple(here[0].shape)}")
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in PLAIN_RESULT or not (there or made_there):
            return out
        return tree_map(_on_device, out)


def to_stand_in(model: torch.nn.Module) -> torch.nn.Module:
    """The model's parameters and buffers as OnDevice tensors (the model "on the GPU")."""
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = torch.nn.Parameter(p.detach().as_subclass(OnDevice), p.requires_grad)
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = b.as_subclass(OnDevice)
    return model


def tiny_model(**kw) -> TinyGPT:
    cfg = dict(vocab_size=50, block_size=16, d_model=32, n_head=2, d_qk=None, n_layer=2, scaled=True, bug="correct",
               causal=True, impl="manual", fused_qkv=True, qkv_bias=False, proj_bias=False, mlp_ratio=2,
               activation="gelu", dropout=0.0, tie_weights=True, head_bias=False, init_std=0.02, init="gpt2",
               qk_norm="none", qk_gain_init=None)
    cfg.update(kw)
    torch.manual_seed(0)
    return TinyGPT(ModelConfig(**cfg)).eval()


def weights_on(device_fn, shape=(2, 3, 8, 8)) -> torch.Tensor:
    torch.manual_seed(0)
    logits = torch.randn(*shape)
    mask = torch.ones(shape[-2], shape[-1], dtype=torch.bool).tril()
    return device_fn(torch.softmax(logits.masked_fill(~mask, float("-inf")), -1))


def test_the_stand_in_catches_a_cpu_tensor_mixed_with_a_device_tensor():
    p = weights_on(_on_device)
    with DeviceStandIn():
        with pytest.raises(RuntimeError, match="device mismatch"):
            p * torch.ones(8)
        assert isinstance(p * torch.ones(8, device=p.device), OnDevice)
        assert isinstance(p + torch.arange(8).to(p.device), OnDevice)
        assert isinstance(p * torch.tensor(2.0), OnDevice)  # a CPU scalar is fine on CUDA too
        assert p[..., torch.arange(2), :].shape[-2] == 2  # so are CPU indices


@pytest.mark.parametrize("causal", [True, False])
def test_weights_measures_on_the_device_match_the_cpu(causal):
    p_cpu = weights_on(lambda t: t)
    want = {"entropy": weights.normalized_entropy(p_cpu, causal), "jacobian": weights.jacobian_fro(p_cpu),
            **weights.position_stats(p_cpu)}
    with DeviceStandIn():
        p = weights_on(_on_device)
        got = {"entropy": weights.normalized_entropy(p, causal), "jacobian": weights.jacobian_fro(p),
               **weights.position_stats(p)}
        summary = weights.layer_summary(p, (p + 1).log(), causal)
    for k, v in want.items():
        assert torch.equal(got[k].as_subclass(torch.Tensor), v), k
    assert summary == weights.layer_summary(p_cpu, (p_cpu + 1).log(), causal)


def test_probes_and_weight_symptoms_on_the_device():
    x = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(1))
    batches = [(x, x)]
    ref = tiny_model()
    want = (probes.measure_init(ref, x[None]), probes.head_stats(probes.attention_maps(ref, x)),
            probes.diag_weight_all_rows(ref, batches), task_lm.weight_symptoms(ref, batches))
    model = to_stand_in(tiny_model())
    with DeviceStandIn():
        xd = x.to(FAKE)
        got = (probes.measure_init(model, xd[None]), probes.head_stats(probes.attention_maps(model, xd)),
               probes.diag_weight_all_rows(model, [(xd, xd)]), task_lm.weight_symptoms(model, [(xd, xd)]))
    assert got == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measurements_on_cuda_match_the_cpu():
    x = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(1))
    ref = tiny_model()
    want = (probes.head_stats(probes.attention_maps(ref, x)), task_lm.weight_symptoms(ref, [(x, x)]))
    model = tiny_model().cuda()
    xc = x.cuda()
    got = (probes.head_stats(probes.attention_maps(model, xc)), task_lm.weight_symptoms(model, [(xc, xc)]))
    probes.measure_init(model, xc[None])
    for a, b in zip(got[0], want[0]):
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a)
    assert all(abs(got[1][k] - want[1][k]) < 1e-4 for k in want[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_steps_on_cuda_pass_the_loud_determinism_and_repeat_exactly(monkeypatch):
    """Under setup_determinism(cuda) a nondeterministic CUDA op raises: a few steps of the chapter's model
    train without one, and twice give the same loss bit for bit."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    setup_determinism(1, "cuda")
    try:
        losses = []
        for _ in range(2):
            model = tiny_model().cuda().train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            x = torch.randint(50, (4, 16), generator=torch.Generator().manual_seed(2)).cuda()
            for _ in range(3):
                _, loss = model(x, x)
                opt.zero_grad()
                loss.backward()
                opt.step()
            losses.append(loss.item())
        assert losses[0] == losses[1]
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]
