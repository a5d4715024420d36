"""The choices stage (experiments.choices): the text and newline rules, its config, its statistics."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest

from attnrepro.config import ConfigError
from attnrepro.data import corpus
from attnrepro.experiments import choices as C
from conftest import unpad

POEMS = ["床前明月光\n疑是地上霜", "白日依山盡\n黃河入海流\n欲窮千里目", "春眠不覺曉"]


def test_text_rules():
    assert corpus.corpus_text(POEMS, "unk") == corpus.corpus_text(POEMS, "token") == "\n".join(POEMS)
    assert "\n" not in corpus.corpus_text(POEMS, "drop")
    assert corpus.corpus_text(POEMS, "poems").count("\n") == len(POEMS) - 1
    with pytest.raises(corpus.CorpusError, match="newline rule"):
        corpus.corpus_text(POEMS, "keep")


def test_newline_token_is_kept_and_unk_is_the_protocol():
    tok_unk, arr_unk, m_unk = corpus.build(POEMS * 20, 12, 0.1, "unk")
    tok_tok, arr_tok, m_tok = corpus.build(POEMS * 20, 12, 0.1, "token")
    assert "\n" not in tok_unk.itos and "\n" in tok_tok.itos and len(tok_tok.itos) == len(tok_unk.itos) == 12
    assert m_tok["unk_rate"] < m_unk["unk_rate"]  # line breaks are no longer <unk>
    assert m_unk["tokens"] == m_tok["tokens"]  # the same text, encoded otherwise
    assert corpus.build(POEMS * 20, 12, 0.1, "poems")[2]["tokens"] == m_unk["tokens"] - 20 * 3  # 3 breaks inside poems
    # the default build is byte for byte what it was before the rule existed
    files = corpus.input_files(tok_unk, arr_unk)
    assert set(files) == {"train.npy", "val.npy", "vocab.json"}
    assert np.array_equal(np.load(io.BytesIO(files["train.npy"])), arr_unk["train"])


def cfg(**kw):
    c = C.ChoicesConfig(seeds=kw.get("seeds", [1, 2, 3]), arms=kw.get("arms", {"a": {"newline": "token"}}))
    c.validate()
    return c


@pytest.mark.parametrize("arms,msg", [({"baseline": {"newline": "token"}}, "none named"),
                                      ({"a": {"newline": "unk"}}, "unk is the baseline"),
                                      ({"a": {"newline": "keep"}}, "token | drop | poems"),
                                      ({"a": {"dropout": 0.1}}, "newline: <rule>"),
                                      ({"a": {"optim": {}}}, "OptimConfig")])
def test_config_errors_name_the_key(arms, msg):
    with pytest.raises(ConfigError, match=msg):
        cfg(arms=arms)
    with pytest.raises(ConfigError, match="at least 3"):
        cfg(seeds=[1, 1, 2])


def rows(shift=0.0, d32=0.2, n=5, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        small = d32 + rng.normal(0, 0.02)
        out.append({"d32_unscaled.loss_final": 4.2, "d32_scaled.loss_final": 4.0, "gap_d32": small,
                    "gap_d256": 0.9 + shift + rng.normal(0, 0.02),
                    "d256_unscaled.entropy_step222": 0.002 * math.exp(rng.normal(0, 0.1)),
                    "jacobian_fall_orders": 2.4 + rng.normal(0, 0.1)})
    return out


def test_analyse_pairs_corrects_per_arm_and_flags_an_unbounded_ratio():
    moved = C.analyse(rows(seed=1), rows(shift=0.5, seed=2), 32, 256)
    same = C.analyse(rows(seed=1), rows(seed=3), 32, 256)
    assert moved["arm"]["gap_d256"]["p_holm"] < 0.05 and moved["arm"]["gap_d256"]["diff"] == pytest.approx(0.5, abs=0.06)
    assert same["arm"]["gap_d256"]["p_holm"] > 0.05
    assert moved["design"]["tests"] == 6  # the arm's six cells, its own Holm family
    assert moved["baseline"] == same["baseline"] and "p" not in moved["baseline"]["gap_d256"]
    assert moved["baseline"]["gap_ratio"]["bounded"] == 1
    lo, hi = moved["baseline"]["gap_ratio"]["fieller_lo"], moved["baseline"]["gap_ratio"]["fieller_hi"]
    assert lo < moved["baseline"]["gap_ratio"]["value"] < hi
    noisy = C.analyse(rows(d32=0.0, seed=4), rows(seed=5), 32, 256)
    assert noisy["baseline"]["gap_ratio"]["bounded"] == 0 and "fieller_lo" not in noisy["baseline"]["gap_ratio"]
    assert "unbounded" in C.report_markdown({"x": noisy})


def test_the_fall_and_the_last_jacobian_are_one_test_in_an_arms_family():
    """Issue 63: the fall is log10 of ‖J‖ at step 0 (the shared init's) over ‖J‖ at the last step, so the two are
    one paired test; made again from the per-seed cells, Holm's family holds it once and ‖J‖ shows the fall's p."""
    def with_j(rows_):
        return [{**r, "d256_unscaled.jacobian_fro_step1480": 0.3 / 10 ** r["jacobian_fall_orders"]} for r in rows_]

    base, arm = with_j(rows(seed=1)), with_j(rows(shift=0.5, seed=2))
    stage = C.analyse(base, arm, 32, 256)  # as the stages ran it: seven tests, the fall twice
    assert stage["design"]["tests"] == 7
    again = C.reanalysed({"a": stage, "lost": stage}, {"a": {"baseline": base, "arm": arm}})
    a = again["a"]
    assert a["design"]["tests"] == 6 and "is jacobian_fall_orders's" in a["design"]["correction"]
    assert a["arm"]["d256_unscaled.jacobian_fro_step1480"]["p_holm"] == a["arm"]["jacobian_fall_orders"]["p_holm"]
    assert a["arm"]["gap_d256"]["p_holm"] <= stage["arm"]["gap_d256"]["p_holm"]  # a smaller family
    assert a["arm"]["gap_d256"]["mean"] == pytest.approx(stage["arm"]["gap_d256"]["mean"])
    assert again["lost"] == stage  # no per-seed cells: the stage's own analysis


def test_arm_names_name_files():
    with pytest.raises(ConfigError, match="a-z, 0-9 and _"):
        cfg(arms={"weight_decay_0.01": {"optim": {"weight_decay": 0.01}}})


def test_each_arm_is_a_stage_with_its_own_outputs(tmp_path):
    """dvc.yaml's foreach gives one stage per arm of params choices.arms, each writing its own files;
    load_arms reads them back by arm."""
    from attnrepro.files import dvc_stages, write_json

    (tmp_path / "params.yaml").write_text("choices:\n  arms:\n    a: {newline: token}\n    b: {newline: drop}\n")
    (tmp_path / "dvc.yaml").write_text((Path(__file__).parents[1] / "dvc.yaml").read_text(encoding="utf-8"))
    stages = {k: v for k, v in dvc_stages(tmp_path).items() if k.startswith("choices")}
    assert sorted(stages) == ["choices@a", "choices@b"]
    assert stages["choices@a"]["cmd"].split()[-2:] == ["stages/choices.py", "a"]
    assert "metrics/choices_b.json" in [next(iter(o)) for o in stages["choices@b"]["outs"]]
    for arm in "ab":
        write_json(tmp_path / "metrics" / f"choices_{arm}.json", {"arm": {"x": arm}})
    assert C.load_arms(tmp_path / "metrics") == {"a": {"arm": {"x": "a"}}, "b": {"arm": {"x": "b"}}}


def test_report_places_the_chapters_figures():
    from attnrepro.judge.claims import load

    exp = load("claims.yaml")
    pub = C.published_cells(exp.claims)
    assert pub["gap_d32"] == 0.17 and pub["gap_ratio"] == pytest.approx(0.95 / 0.17)
    assert pub["jacobian_fall_orders"] == pytest.approx(math.log10(0.2975 / 8e-05))
    text = unpad(C.report_markdown({"moved": C.analyse(rows(seed=1), rows(shift=0.5, seed=2), 32, 256)}, exp.claims))
    assert "**moved**" in text and "| gap_d256 | 0.95 |" in text and "Fieller" in text
