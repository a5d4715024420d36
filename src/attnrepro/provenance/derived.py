"""Derived values recomputed: a metric that is a function of other metrics of the run (train.json's
comparison, heads.json's layer means, spreads and maxima) is recomputed from its inputs by the function
of the experiment that wrote it, and must equal what the file says; a gap or a mean forged together with
dvc.lock is named here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from attnrepro.config import UserError, from_dict
from attnrepro.experiments.comparison import comparison, pairs_by_dhead
from attnrepro.experiments.heads import HeadsConfig, heads_metrics
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.files import read_json
from attnrepro.formatting import fmt_number
from attnrepro.provenance.lock import METRICS, same
from attnrepro.stats import flatten

HEAD = re.compile(r"l(\d+)h(\d+)")


def _agrees(written, again) -> bool:
    """Equal to the metrics files' rounding (6 significant digits: a mean of rounded inputs may move the last)."""
    if isinstance(written, (int, float)) and isinstance(again, (int, float)):
        return same(float(written), float(again)) or abs(written - again) <= 1e-5 * max(1.0, abs(written), abs(again))
    return written == again


def _train(metrics: dict, params: Mapping) -> dict:
    cfg = from_dict(TrainConfig, params["train"], prefix="train")
    return {"comparison": comparison(metrics, pairs_by_dhead(cfg))}


def _heads(metrics: dict, params: Mapping) -> dict:
    rows = [{"layer": int(m[1]), "head": int(m[2]), **v} for k, v in metrics.items() if (m := HEAD.fullmatch(k))]
    cfg = from_dict(HeadsConfig, params["heads"], prefix="heads")
    return heads_metrics(rows, metrics["base_loss"], 1 + max(r["layer"] for r in rows), cfg)


DERIVED = {"train": _train, "heads": _heads}  # metrics file -> its derived values, from the file and params


def derived_findings(root: Path, params: Mapping) -> list[str]:
    """Each derived value of DERIVED's files that differs from the one its producer makes of the file's inputs."""
    problems = []
    for file, again in DERIVED.items():
        path = root / METRICS / f"{file}.json"
        if not path.is_file() or file not in params:
            continue
        written = read_json(path)
        try:
            made = flatten(again(written, params), f"{file}.")
        except (KeyError, TypeError, ValueError, UserError) as e:
            problems.append(f"{METRICS}/{file}.json: its derived values cannot be recomputed from its inputs ({e})")
            continue
        mine = flatten(written, f"{file}.")
        bad = sorted(k for k, v in made.items() if k in mine and not _agrees(mine[k], v)) + \
            sorted(k for k in made if k not in mine)
        problems += [f"{METRICS}/{file}.json {k} = {fmt_number(mine.get(k))}, but recomputed from its inputs it is "
                     f"{fmt_number(made[k])}" for k in bad]
    return problems
