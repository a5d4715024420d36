"""The `reversal` stage's one call: every variant's run from the run engine, evaluated.

The science is attnrepro.reversal's (results); it is one of the engine's tasks, so it cannot
import the engine (attnrepro.sweep) itself: this module joins the two.
"""

from __future__ import annotations

from ..reversal import ReversalConfig, ReversalResult, results, run_spec
from ..engine import EngineConfig
from ..sweep import require_ok, run_sweep


def run(cfg: ReversalConfig, engine: EngineConfig) -> ReversalResult:
    """The variants' runs from the store (the missing ones trained first, in parallel), then their results."""
    records = run_sweep("reversal", [run_spec(cfg, name) for name in cfg.variants], {}, engine)
    require_ok(records, "reversal")
    return results(cfg, records)
