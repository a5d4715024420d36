"""Character-LM companion experiment: text, vocabulary, model shape, masks, determinism."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnrepro import figures
from attnrepro.config import ConfigError, from_dict
from attnrepro.experiments import charlm as C
from attnrepro.measure.probes import sequence_maps
from attnrepro.model.transformer import TinyGPT, load_checkpoint
from attnrepro.run.execute import execute

ROOT = Path(__file__).resolve().parents[1]
TEXT_FILE = ROOT / "src/attnrepro/data/charlm_sentences.txt"


PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def cfg(**kw) -> C.CharLMConfig:
    """params.yaml's charlm section (the only source of values) with `kw` replaced."""
    return from_dict(C.CharLMConfig, {**PARAMS["charlm"], "text_file": str(TEXT_FILE), **kw}, prefix="charlm")


def test_text_and_vocabulary():
    sentences = C.read_sentences(TEXT_FILE)
    assert len(sentences) == 8 and sentences[0].startswith("我正在学习")
    text = C.join_text(sentences)
    assert len(text) == 162  # the document's "原始文本长度"
    vocab = C.CharVocab(text)
    assert len(vocab) == 73 and "\n" in vocab.stoi
    assert vocab.decode(vocab.encode("我正在学习")) == "我正在学习"
    with pytest.raises(C.UserError):
        vocab.encode("猫")


def test_split_is_a_prefix_and_a_suffix():
    text = C.join_text(C.read_sentences(TEXT_FILE))
    vocab = C.CharVocab(text)
    tr, va = C.split_stream(text, 10, 0.1, vocab)
    assert len(tr) + len(va) == 1620 and len(va) == 162
    assert vocab.decode(torch.cat([tr, va])) == text * 10


def test_parameter_count_exact():
    model = TinyGPT(cfg().model_config(73))
    assert model.num_params() == 210_761
    blk = model.blocks[0]
    assert blk.attn.q.bias is None and blk.attn.proj.bias is not None
    assert isinstance(blk.mlp[1], torch.nn.ReLU) and blk.mlp[0].out_features == 256
    assert model.head.weight is not model.tok_emb.weight and model.head.bias is not None


def test_causal_mask_and_dropout_off_in_eval():
    torch.manual_seed(0)
    model = TinyGPT(cfg().model_config(73)).eval()
    x = torch.randint(0, 73, (2, 32))
    alt = x.clone()
    alt[:, 20:] = (alt[:, 20:] + 7) % 73
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(alt)
        again, _ = model(x)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])
    assert torch.equal(a, again)  # eval mode: no dropout noise
    maps = sequence_maps(model, x[0, :9])
    assert maps.shape == (4, 4, 9, 9)
    assert maps.triu(1).abs().max() == 0
    assert torch.allclose(maps.sum(-1), torch.ones(4, 4, 9))


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = TinyGPT(cfg().model_config(73))
    x = torch.randint(0, 73, (4, 32))
    _, loss = model(x, torch.randint(0, 73, (4, 32)))
    assert abs(loss.item() - math.log(73)) < 0.5


def test_verbatim_and_exact_lines():
    text = "\n甲乙丙。\n丁戊。\n"
    assert C.verbatim_fraction("甲乙丙。\n丁", text) == 1.0
    assert C.verbatim_fraction("甲乙丁丁", text) == 0.5
    assert C.exact_lines("甲乙丙。\n丁乙。\n丁", ["甲乙丙。", "丁戊。"]) == 0.5


def test_bad_params_are_config_errors():
    with pytest.raises(ConfigError, match="attn_layers"):
        cfg(attn_layers=[0, 4])
    with pytest.raises(ConfigError, match="val_fraction"):
        cfg(val_fraction=1.5)
    with pytest.raises(ConfigError, match="unknown key"):
        cfg(optimizer="sgd")


def test_no_cjk_font_falls_back(tmp_path):
    assert figures.find_cjk_family(["DejaVu Sans", "STIXGeneral"]) is None
    assert figures.find_cjk_family(["DejaVu Sans", "Noto Sans CJK JP"]) == "Noto Sans CJK JP"
    assert figures.find_cjk_family(["Acme CJK Sans", "WenQuanYi Zen Hei"]) == "WenQuanYi Zen Hei"  # a known one first
    out = tmp_path / "a.png"
    figures.attention_grid(out, torch.eye(3)[None, None].numpy(), list("自注意"), "t", ["b"], font=None)
    assert out.read_bytes()[:4] == b"\x89PNG"


TINY = dict(repeat=4, steps=6, eval_every=3, eval_batches=2, batch_size=4, gen_tokens=12)


def tiny_run(c: C.CharLMConfig, tmp_path) -> tuple:
    text = C.join_text(C.read_sentences(c.text_file))
    vocab = C.CharVocab(text)
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    execute(*C.run_spec(c, (ROOT / c.text_file).read_bytes()), out)
    model = load_checkpoint(out / "model.pt")
    evals, steps = (json.loads((out / n).read_text(encoding="utf-8")) for n in ("evals.json", "history.json"))
    return evals, [r["loss"] for r in steps], C.continuations(model, vocab, c), \
        sequence_maps(model, vocab.encode(c.attn_text))


def test_tiny_run_is_deterministic(tmp_path):
    a, b = tiny_run(cfg(**TINY), tmp_path), tiny_run(cfg(**TINY), tmp_path)
    assert a[:3] == b[:3] and torch.equal(a[3], b[3])
    assert [r["step"] for r in a[0]] == [0, 3, 6]
    assert a[0][-1]["train_loss"] < a[0][0]["train_loss"]  # six updates already help
    assert a[2]["greedy"].startswith("我正在学习") and len(a[2]["sampled"]) == 5 + 12
    assert tiny_run(cfg(**TINY, seed=7), tmp_path)[1] != a[1]


def test_stage_end_to_end(tmp_path):
    full = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    sec = full["charlm"]
    sec.update(TINY, text_file=str(TEXT_FILE))
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"engine": full["engine"], "charlm": sec}, allow_unicode=True), encoding="utf-8")
    res = subprocess.run([sys.executable, str(ROOT / "stages/charlm.py"), "--params", str(params)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((tmp_path / "metrics/charlm.json").read_text(encoding="utf-8"))
    assert metrics["params"] == 210_761 and metrics["vocab_size"] == 73
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    assert metrics["attn_future_weight_max"] == 0
    samples = (tmp_path / "plots/charlm/samples.txt").read_text(encoding="utf-8")
    assert samples.count("我正在学习") >= 2
    for f in ("losses.csv", "loss_curve.png", "attention_block1.png", "attention_block4.png"):
        assert (tmp_path / "plots/charlm" / f).stat().st_size > 0
