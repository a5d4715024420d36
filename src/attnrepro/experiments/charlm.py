"""The `charlm` stage's one call: the companion char LM's run from the run engine, measured.

The science is attnrepro.charlm's (char_text, results); it is one of the engine's tasks, so it
cannot import the engine (attnrepro.sweep) itself: this module joins the two.
"""

from __future__ import annotations

from pathlib import Path

from ..charlm import CharLMConfig, CharLMResult, char_text, results, run_spec
from ..engine import EngineConfig
from ..sweep import require_ok, run_sweep


def run(cfg: CharLMConfig, engine: EngineConfig) -> CharLMResult:
    """The text checked, the run from the store (trained first when missing), then its results."""
    data = char_text(cfg)
    spec, inputs = run_spec(cfg, Path(cfg.text_file).read_bytes())
    (rec,) = run_sweep("charlm", [spec], inputs, engine)
    require_ok([rec], "charlm")
    return results(cfg, data, rec)
