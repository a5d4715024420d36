"""The views of a run that a person reads in DVC: the one declared metric and the plots page's tables.

`dvc exp show` and `dvc metrics diff` show the declared metrics files only, so the pipeline
declares one small file, metrics/headline.json (every other metrics/*.json is a plain output
that attnrepro reads):

    run         this run's values of the primary endpoints (claims.yaml `primary:`; `<file>.<key>` names,
                nested: `run.train.d32_unscaled.loss_final`)
    over_seeds  the seed summaries of the headline gaps (metrics/seeds.json): mean and 95%
                interval of each gap, the ratio of the mean gaps with its interval, n_seeds
    claims      the check's counts per claim class (metrics/claims_summary.json)

No timing is ever among them (claims.yaml `timings:` globs are refused).

`dvc plots show` embeds every column of every row of a plotted file in the page. The step-wise
tables (1,500 rows, up to 40 columns) made the page 22 MB; `VIEWS` are the page's copies of
them: one file per line, `x` and the one plotted column, empty cells left out, and at most
MAX_POINTS rows (every k-th row and the last). They are written to plots/views/<view>/<line>.csv
and read only by dvc.yaml's top-level `plots:`.
"""

from __future__ import annotations

import csv
import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from attnrepro.config import UserError
from attnrepro.files import read_json
from attnrepro.judge.claims import load
from attnrepro.stats import flatten

HEADLINE = "metrics/headline.json"
VIEWS_DIR = "plots/views"
MAX_POINTS = 500  # per line: a 400-pixel plot shows no more

# metrics/seeds.json: the headline gaps' summaries, and the fields of each shown
SEED_SUMMARIES = {
    "gap_d32_loss_final": ("mean", "ci95_lo", "ci95_hi"),
    "gap_d256_loss_final": ("mean", "ci95_lo", "ci95_hi"),
    "gap_ratio_of_means_loss_final": ("value", "ci95_lo", "ci95_hi"),
}
CLAIM_CLASSES = ("checksum", "conclusion", "finding", "value")
MAX_LEAVES = 60


# ---------------------------------------------------------------- metrics/headline.json

def _nest(out: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def _number(x) -> Optional[float]:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return x


def headline(names: Sequence[str], timings: Sequence[str], metrics: Mapping[str, dict], seeds: Mapping,
             summary: Mapping) -> dict:
    """metrics/headline.json's content.

    names: the primary endpoints' metrics (`<file>.<key>`); timings: claims.yaml `timings:` globs;
    metrics: {file stem: that metrics file's content}; seeds: metrics/seeds.json;
    summary: metrics/claims_summary.json."""
    run: dict = {}
    for name in names:
        if any(fnmatch.fnmatchcase(name, g) for g in timings):
            raise UserError(f"claims.yaml primary: {name} is a timing (claims.yaml timings); "
                            "timings stay out of the declared metrics")
        stem = name.split(".", 1)[0]
        if stem not in metrics:
            raise UserError(f"claims.yaml primary: {name}: no metrics/{stem}.json among the headline's inputs")
        value = _number(metrics_value(metrics[stem], name.split(".")[1:]))
        if value is None:  # a key with a dot in it: by its flattened name
            value = flatten(metrics[stem], f"{stem}.").get(name)
        if value is None:
            raise UserError(f"claims.yaml primary: metrics/{stem}.json has no number {name}")
        _nest(run, name, value)
    over_seeds: dict = {}
    if "n_seeds" in seeds:
        over_seeds["n_seeds"] = seeds["n_seeds"]
    for key, fields in SEED_SUMMARIES.items():
        s = seeds.get(key)
        if not isinstance(s, Mapping) or any(_number(s.get(f)) is None for f in fields):
            raise UserError(f"metrics/seeds.json: {key} lacks one of {', '.join(fields)} (dvc repro seeds)")
        over_seeds[key] = {f: s[f] for f in fields}
    claims = {c: {k: v for k, v in summary[c].items() if _number(v) is not None}
              for c in CLAIM_CLASSES if isinstance(summary.get(c), Mapping)}
    out = {"run": run, "over_seeds": over_seeds, "claims": claims}
    n = len(flatten(out))
    if n >= MAX_LEAVES:
        raise UserError(f"{HEADLINE}: {n} numbers; a headline has fewer than {MAX_LEAVES} (claims.yaml primary)")
    return out


def headline_of(claims: Path, mdir: Path) -> dict:
    """metrics/headline.json's content from claims.yaml (its `headline:` names and timings) and the metrics
    folder `mdir`: what the headline stage writes, and what `attnrepro check` makes again."""
    exp = load(claims, conclusions="")
    files = {}
    for stem in sorted({n.split(".", 1)[0] for n in exp.headline}):
        if not (mdir / f"{stem}.json").is_file():
            raise UserError(f"{mdir / stem}.json: missing (claims.yaml headline names {stem}.*)")
        files[stem] = read_json(mdir / f"{stem}.json")
    return headline(exp.headline, exp.timings, files, read_json(mdir / "seeds.json"),
                    read_json(mdir / "claims_summary.json"))


def metrics_value(obj, path: Sequence[str]):
    """obj[path[0]][path[1]]..., or None (keeps ints as ints, unlike stats.flatten)."""
    for p in path:
        if not isinstance(obj, Mapping) or p not in obj:
            return None
        obj = obj[p]
    return obj


# ---------------------------------------------------------------- plots/views/

@dataclass(frozen=True)
class View:
    """plots/views/<name>/<line>.csv: `x` and `y`, one file per line, from (source file, column)."""
    name: str
    x: str
    y: str
    lines: tuple[tuple[str, str, str], ...]  # (line, source csv, source column)

    def path(self, line: str) -> str:
        return f"{VIEWS_DIR}/{self.name}/{line}.csv"

    @property
    def sources(self) -> list[str]:
        return sorted({src for _, src, _ in self.lines})


TRAIN = ("d32_unscaled", "d32_scaled", "d256_unscaled", "d256_scaled")  # params.yaml train.variants
QKNORM = ("d256_scaled", "d256_unscaled", "layernorm_with_scaling", "layernorm_instead", "l2_gain_with_scaling",
          "l2_gain_instead")  # params.yaml qknorm.references + qknorm.forms

VIEWS = (
    View("train_loss", "step", "loss", tuple((v, f"plots/train/{v}.csv", "loss") for v in TRAIN)),
    View("train_entropy_l0", "step", "entropy_l0", tuple((v, f"plots/train/{v}.csv", "entropy_l0") for v in TRAIN)),
    View("train_jacobian_l0", "step", "jacobian_fro_l0",
         tuple((v, f"plots/train/{v}.csv", "jacobian_fro_l0") for v in TRAIN)),
    View("seeds_loss_mean", "step", "loss_mean",
         tuple((v, "plots/seeds/curves.csv", f"{v}_loss_mean") for v in TRAIN)),
    View("qknorm_loss", "step", "loss", tuple((f, "plots/qknorm/curves.csv", f"{f}_loss") for f in QKNORM)),
)


def _empty(v) -> bool:
    return v is None or (isinstance(v, str) and v.strip() == "")


def thin(rows: list, max_points: int = MAX_POINTS) -> list:
    """Every k-th row and the last, k the smallest that leaves at most max_points rows."""
    if len(rows) <= max_points:
        return list(rows)
    k = math.ceil((len(rows) - 1) / (max_points - 1))
    return [r for i, r in enumerate(rows) if i % k == 0 or i == len(rows) - 1]


def view_rows(view: View, line: str, source_rows: Sequence[Mapping]) -> list[dict]:
    """One line of `view` from its source file's rows (dicts; CSV strings or numbers)."""
    (src, col), = [(s, c) for name, s, c in view.lines if name == line]
    if source_rows and (view.x not in source_rows[0] or col not in source_rows[0]):
        missing = view.x if view.x not in source_rows[0] else col
        raise UserError(f"{src}: no column {missing} (plots view {view.name}/{line})")
    rows = [{view.x: r[view.x], view.y: r[col]} for r in source_rows if not _empty(r[col]) and not _empty(r[view.x])]
    return thin(rows)


def read_rows(path: str | Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        raise UserError(f"{path}: missing (the stage that writes it has not run)") from None


def views(read=read_rows, skip_missing: bool = False) -> dict[str, list[dict]]:
    """{plots/views/<view>/<line>.csv: its rows} for every view; with skip_missing, the views whose
    source files exist only (a test's partial workspace)."""
    out: dict[str, list[dict]] = {}
    cache: dict[str, list[dict]] = {}
    for view in VIEWS:
        for line, src, _ in view.lines:
            if src not in cache:
                try:
                    cache[src] = read(src)
                except UserError:
                    if not skip_missing:
                        raise
                    cache[src] = []
            if cache[src]:
                out[view.path(line)] = view_rows(view, line, cache[src])
    return out


def write_tables(dest: str | Path, tables: Mapping[str, list[dict]]) -> None:
    """Write `views()`'s tables under `dest`, which stands for plots/views/."""
    for path, rows in tables.items():
        view, _ = view_of(path)
        target = Path(dest) / Path(path).relative_to(VIEWS_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=[view.x, view.y], lineterminator="\n")
            w.writeheader()
            w.writerows(rows)


def view_of(path: str) -> tuple[View, str]:
    """The view and line a plots/views/ path holds."""
    for view in VIEWS:
        for line, _, _ in view.lines:
            if view.path(line) == path:
                return view, line
    raise KeyError(path)
