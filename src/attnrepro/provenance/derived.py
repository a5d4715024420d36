"""Derived values recomputed: a metric that is a function of other metrics of the run is recomputed from
its inputs by the function of the experiment that wrote it, and must equal what its file says: train.json's
comparison (the gaps and their ratio), each seed's comparison in dist/train.json, seeds.json (the gaps, their
ratios and the modes over seeds), heads.json's layer means, spreads and maxima; and whatever the judge adds
(`more`: claims.json and the counts of claims_summary.json). A gap or a mean forged together with dvc.lock
is named here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd

from attnrepro.config import UserError, from_dict
from attnrepro.experiments.comparison import (SeedsConfig, comparison, gap_d_heads, headline, modes_headline,
                                              pairs_by_dhead, variant_modes)
from attnrepro.experiments.heads import HeadsConfig, heads_metrics
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.files import json_ready, read_json, read_yaml_or_none
from attnrepro.formatting import fmt_number
from attnrepro.provenance.lock import METRICS, out_md5, same
from attnrepro.stats import flatten

HEAD = re.compile(r"l(\d+)h(\d+)")


def _agrees(written, again) -> bool:
    """Equal to the metrics files' rounding (6 significant digits: a mean of rounded inputs may move the last)."""
    if isinstance(written, (int, float)) and isinstance(again, (int, float)):
        return same(float(written), float(again)) or abs(written - again) <= 1e-5 * max(1.0, abs(written), abs(again))
    return written == again


def _train(metrics: dict, params: Mapping, root: Path) -> dict:
    if "comparison" not in metrics:  # none written: a missing metric is compare's (judge.check) to name
        return {}
    cfg = from_dict(TrainConfig, params["train"], prefix="train")
    return {"comparison": comparison(metrics, pairs_by_dhead(cfg))}


def _seed_runs(dist: dict, params: Mapping) -> dict[int, dict]:
    """dist/train.json's runs, each seed's comparison made again from its variants (run_seeds' runs)."""
    cfg = from_dict(TrainConfig, params["train"], prefix="train")
    pairs = pairs_by_dhead(cfg)
    runs = {}
    for s in dist["seeds"]:
        m = {v: dist["runs"][str(s)][v] for v in cfg.variants}
        runs[int(s)] = {**m, "comparison": comparison(m, pairs)}
    return runs


def _dist_train(dist: dict, params: Mapping, root: Path) -> dict:
    if not any("comparison" in r for r in (dist.get("runs") or {}).values()):
        return {}
    return {"runs": {str(s): {"comparison": r["comparison"]} for s, r in _seed_runs(dist, params).items()}}


def _seeds(metrics: dict, params: Mapping, root: Path) -> dict:
    """seeds.json as run_seeds makes it, from dist/train.json's runs."""
    cfg = from_dict(TrainConfig, params["train"], prefix="train")
    statistic = from_dict(SeedsConfig, params["seeds"], prefix="seeds").mode_statistic
    runs = _seed_runs(read_json(root / METRICS / "dist" / "train.json"), params)
    pairs = pairs_by_dhead(cfg)
    modes = variant_modes(runs, list(cfg.variants), statistic)
    small, large = gap_d_heads(pairs)
    split = frozenset(d for d in (small, large) if any(len(modes[v].groups) > 1 for v in pairs[d].values()))
    out = headline(pd.DataFrame([{"seed": s, **runs[s]["comparison"]} for s in runs]), small, large, split)
    return {**out, "modes": modes_headline(runs, modes)}


def _heads(metrics: dict, params: Mapping, root: Path) -> dict:
    rows = [{"layer": int(m[1]), "head": int(m[2]), **v} for k, v in metrics.items() if (m := HEAD.fullmatch(k))]
    if not rows:
        return {}
    cfg = from_dict(HeadsConfig, params["heads"], prefix="heads")
    return heads_metrics(rows, metrics["base_loss"], 1 + max(r["layer"] for r in rows), cfg)


def current(root: Path, stage: str) -> bool:
    """Did `stage` run with what the working tree holds: every dependency dvc.lock records for it unchanged?
    (A stage not rerun after its inputs moved made its outputs of others: `dvc status` lists it stale.)"""
    lock = read_yaml_or_none(root / "dvc.lock")
    entry = ((lock.get("stages") or {}).get(stage) if isinstance(lock, dict) else None) or {}
    return all((root / d["path"]).exists() and out_md5(root / d["path"]) == d.get("md5")
               for d in entry.get("deps") or [] if isinstance(d, dict) and "path" in d)


# metrics file -> (the params sections it needs, what its derived values are, from the file, params and the root)
DERIVED = {"train": (("train",), _train), "dist/train": (("train",), _dist_train),
           "seeds": (("train", "seeds"), _seeds), "heads": (("heads",), _heads)}


def derived_findings(root: Path, params: Mapping, more: Mapping[str, Callable[..., dict]] = {}) -> list[str]:
    """Each derived value of DERIVED's files that differs from the one its producer makes of the file's inputs;
    `more`: {metrics file: what makes its whole content again (as DERIVED's)}, where no value may be added."""
    problems = []
    for file, (sections, again) in {**DERIVED, **{f: ((), make) for f, make in more.items()}}.items():
        path = root / METRICS / f"{file}.json"
        if not path.is_file() or any(s not in params for s in sections):
            continue
        written = read_json(path)
        try:
            made = flatten(json_ready(again(written, params, root)), f"{file}.")
        except (KeyError, TypeError, ValueError, UserError) as e:
            problems.append(f"{METRICS}/{file}.json: its derived values cannot be recomputed from its inputs ({e})")
            continue
        mine = flatten(written, f"{file}.")
        bad = sorted(k for k in made if not (k in mine and _agrees(mine[k], made[k])))
        bad += sorted(k for k in mine if k not in made) if file in more else []
        problems += [f"{METRICS}/{file}.json {k} = {fmt_number(mine.get(k))}, but recomputed from its inputs it is "
                     f"{fmt_number(made.get(k))}" for k in bad[:3]]
        if len(bad) > 3:
            problems.append(f"{METRICS}/{file}.json: and {len(bad) - 3} more values differ from their recomputation")
    return problems
