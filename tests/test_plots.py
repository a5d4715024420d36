"""`dvc plots show` draws the right thing: every data plot has explicit x and y and one line per
series (file, column, or the `series` column of a long table), the failure curves are one
overlay, tables are plain outputs, and the HTML page loads Vega from the repository, not a CDN.

Runs the real `dvc plots show --json` on a copy of the repository with small fixture CSVs in the
formats the stages write (the stages' own tests check those headers)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo

DVC = Path(sys.executable).parent / "dvc"
DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
IMAGE = (".png", ".jpg", ".jpeg", ".svg", ".gif")
STEPS = [0, 100, 200]


def _entries(section):
    for e in section:
        yield (e, {}) if isinstance(e, str) else next(iter(e.items()))


def top_plots() -> dict[str, dict]:
    """Top-level plot id -> its definition ({} for a bare path such as an image)."""
    return {pid: (props or {}) for pid, props in _entries(DVC_YAML.get("plots", []))}


def data_plots() -> dict[str, dict]:
    return {pid: d for pid, d in top_plots().items() if not pid.lower().endswith(IMAGE)}


def y_sources(defn: dict) -> list[tuple[str, str]]:
    """(file, column) pairs of a plot definition's y."""
    out = []
    for f, cols in (defn.get("y") or {}).items():
        out += [(f, c) for c in ([cols] if isinstance(cols, str) else cols)]
    return out


# ---------------------------------------------------------------- fixture data, in the stages' formats

def _variants(section: str) -> list[str]:
    v = PARAMS[section]["variants"]
    return list(v) if isinstance(v, dict) else list(v)


def fixture_rows(path: str) -> list[dict]:
    """Small rows for plot file `path`, with the columns its stage writes."""
    if path.startswith("plots/views/"):  # the page's copies of the step-wise tables (attnrepro.report.headline_metrics)
        from attnrepro.report import headline_metrics as headline

        view, line = headline.view_of(path)
        (src,) = {s for name, s, _ in view.lines if name == line}
        return headline.view_rows(view, line, fixture_rows(src))
    if path.startswith("plots/train/"):  # diagnostics every diag_every steps only: empty cells between
        return [{"step": s, "lr": 1e-3, "loss": 7 - s / 100, "entropy_l0": 0.9 if s != 100 else None,
                 "jacobian_fro_l0": 0.2 if s != 100 else None} for s in STEPS]
    if path == "plots/seeds/curves.csv":
        pytest.importorskip("pandas")
        from attnrepro.experiments.comparison import curves

        hist = {(v, s): [{"step": t, "loss": 7 - t / 100 - s * 0.01, "entropy_l0": 0.9} for t in STEPS]
                for v in _variants("train") for s in (1, 2, 3)}
        return curves(hist, _variants("train"))
    if path == "plots/seeds/gaps.csv":
        return [{"seed": s, "gap_d32_loss_final": 0.1 + s / 100, "gap_d32_val_loss_final": 0.1,
                 "gap_d256_loss_final": 1.4, "gap_d256_val_loss_final": 1.1, "gap_ratio_loss_final": 10.0,
                 "gap_ratio_val_loss_final": 9.0} for s in PARAMS["seeds"]["seeds"]]
    if path == "plots/init_sweep/sweep.csv":
        return [{"d_head": d, "logit_std": d / 500, "theory_sqrt_d": d ** 0.5, "pred_varprop": d / 400}
                for d in PARAMS["init_sweep"]["d_heads"]]
    if path.startswith("plots/failures/"):
        return [{"step": s, "lr": 1e-3, "loss": 7 - s / 100, "grad_norm": 1.0} for s in STEPS]
    if path == "plots/kv_cache/latency.csv":
        return [{"context": c, "uncached_ms": c / 10, "cached_ms": 1.0, "speedup": c / 10} for c in (16, 64, 256)]
    if path == "plots/latency/mean_ms.csv":
        rows = [{"impl": impl, "dtype": "fp32", "n": n, "oom": 0, "mean_ms": n / 100, "p20_ms": n / 110,
                 "p80_ms": n / 90} for impl in ("sdpa", "naive") for n in (128, 256, 512)]
        from attnrepro.experiments import latency

        return [{k: r[k] for k in latency.SERIES_COLUMNS} for r in latency.series_rows(rows)]
    if path == "plots/reversal/losses.csv":
        hist = {v: [{"step": s, "train_loss": 2 - s / 200, "val_loss": 2 - s / 210,
                     "batch_loss": None if s == 0 else 1.0} for s in STEPS] for v in _variants("reversal")}
        from attnrepro.experiments.reversal import wide_losses

        return wide_losses(hist)
    if path == "plots/charlm/losses.csv":
        return [{"step": s, "train_loss": 4 - s / 100, "val_loss": 4 - s / 110} for s in STEPS]
    if path == "plots/charlm/steps.csv":
        return [{"step": s, "loss": 4 - s / 100} for s in range(5)]
    if path == "plots/critical/curve.csv":
        return [{"d_head": d, **{f"{c}_{q}": d / 200 for c in ("gap_loss_final", "scaled_entropy_final",
                                                               "unscaled_entropy_final")
                                 for q in ("mean", "min", "max")}}
                for d in PARAMS["critical"]["d_heads"]]
    if path == "plots/qknorm/curves.csv":
        forms = [*PARAMS["qknorm"]["references"], *PARAMS["qknorm"]["forms"]]
        return [{"step": s, **{f"{n}_{c}": 7 - s / 100 for c in ("loss", "entropy_l0") for n in forms}}
                for s in STEPS]
    raise AssertionError(f"no fixture for {path}: add one here when you add a plot")


def _stage(name):
    from conftest import load_stage_module

    return load_stage_module(name)


def _png(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnrepro.figures import save

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    save(fig, path)


@pytest.fixture(scope="module")
def plots_repo(tmp_path_factory):
    repo = copy_repo(tmp_path_factory.mktemp("plots") / "repo")
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=repo, check=True, env=env)
    shutil.copy(REPO / ".dvc" / "config", repo / ".dvc" / "config")
    shutil.copytree(REPO / ".dvc" / "plots", repo / ".dvc" / "plots")
    files = {f for d in data_plots().values() for f, _ in y_sources(d)}
    for f in sorted(files):
        rows = fixture_rows(f)
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        with open(repo / f, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    images = [pid for pid in top_plots() if pid.lower().endswith(IMAGE)]
    for st in DVC_YAML["stages"].values():
        images += [p for p, _ in _entries(st.get("plots", []))]
    for img in images:
        _png(repo / img)
    proc = subprocess.run([str(DVC), "plots", "show", "--json"], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    html = subprocess.run([str(DVC), "plots", "show"], cwd=repo, capture_output=True, text=True, env=env,
                          timeout=300)
    assert html.returncode == 0, html.stderr
    return type("Shown", (), {"repo": repo, "json": shown, "stderr": proc.stderr})


def series_of(values: list[dict]) -> set[tuple]:
    """The distinct lines in a plot's data: one per (file, column[, series value])."""
    return {(v.get("filename"), v.get("field"), v.get("series")) for v in values}


def test_no_plot_fails_to_load(plots_repo):
    assert not plots_repo.json.get("errors"), plots_repo.json["errors"]


@pytest.mark.parametrize("pid", sorted(data_plots()))
def test_data_plot_has_its_x_and_one_line_per_series(plots_repo, pid):
    defn = data_plots()[pid]
    assert defn.get("x") and defn.get("y"), f"{pid}: x and y must be explicit"
    (rendered,) = plots_repo.json["data"][pid]
    content = rendered["content"]
    encodings = [content.get("encoding", {})] + [layer.get("encoding", {}) for layer in content.get("layer", [])]
    assert defn["x"] in {e.get("x", {}).get("field") for e in encodings}, f"{pid}: x is not {defn['x']}"
    values = content["data"]["values"]
    sources = y_sources(defn)
    if defn.get("template") == "series":  # a long table: one line per value of its `series` column
        (f, _), = sources
        expected = len({r["series"] for r in fixture_rows(f)})
    else:
        expected = len(sources)
    assert len(series_of(values)) == expected, f"{pid}: {sorted(map(str, series_of(values)))}"
    # x keeps the file's own values (no index replacing a real step/n/d_head column)
    for f, _ in sources[:1]:
        xs = sorted({float(v[defn["x"]]) for v in values if f.endswith(v.get("filename", f))})
        assert xs == sorted({float(r[defn["x"]]) for r in fixture_rows(f)}), pid


def test_sparse_series_skip_empty_cells(plots_repo):
    """The train CSVs hold diagnostics every diag_every steps only; the project's `linear` template
    (.dvc/plots/linear.json, overriding DVC's) leaves the empty cells out instead of drawing them at 0."""
    content = plots_repo.json["data"]["train_entropy_l0"][0]["content"]
    assert {"filter": {"not": {"field": "entropy_l0", "equal": ""}}} in content.get("transform", [])
    values = content["data"]["values"]
    assert values and all(v["entropy_l0"] != "" for v in values)  # plots/views/ leaves them out of the data


def test_the_issue_plots(plots_repo):
    """The cases of issue 13: latency by implementation, reversal by variant, charlm keeps its step,
    the five failure curves are one overlay."""
    d = plots_repo.json["data"]
    latency = d["attention_latency"][0]["content"]["data"]["values"]
    assert {v["series"] for v in latency} == {"sdpa fp32", "naive fp32"}
    assert len(series_of(d["reversal_loss"][0]["content"]["data"]["values"])) == 2 * len(_variants("reversal"))
    assert {float(v["step"]) for v in d["charlm_loss"][0]["content"]["data"]["values"]} == set(map(float, STEPS))
    failures = [f for f, _ in y_sources(top_plots()["failures_loss"])]
    assert sorted(Path(f).stem for f in failures) == sorted(_variants("failures"))
    assert not any(pid.startswith("plots/failures/") and pid.endswith(".csv") for pid in d)


def test_stage_plots_are_images_and_tables_are_outs():
    """A stage's `plots:` hold images only (a CSV there is drawn with default props: nonsense);
    every CSV a top-level plot reads is some stage's output, a plain one."""
    outs = set()
    for name, st in DVC_YAML["stages"].items():
        for p, _ in _entries(st.get("plots", [])):
            assert p.lower().endswith(IMAGE), f"{name}: {p} is a data file among the stage's plots"
        outs |= {p for p, _ in _entries(st.get("outs", []))}
    for pid, defn in data_plots().items():
        for f, _ in y_sources(defn):
            assert f in outs or any(f.startswith(o.rstrip("/") + "/") for o in outs), f"{pid}: {f} is no output"


def test_html_page_needs_no_network(plots_repo):
    """`dvc plots show` uses the project's template (.dvc/config): Vega inline, no CDN script."""
    page = (plots_repo.repo / "dvc_plots" / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=", page), "a script is loaded from elsewhere"
    assert "vega@5" in page and "vegaEmbed(" in page and "vega-embed@6" in page
    assert "dvc_plots/" in (REPO / ".gitignore").read_text(encoding="utf-8").split()[-1] or \
        "/dvc_plots/" in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_templates_colour_each_series_as_the_figures_do():
    """scripts/plot_colours.py wrote figures.SERIES_COLOURS into the templates: every line of every data
    plot gets the colour a figure drawing those lines would give it, no two lines of a plot alike, and
    the four variants the same in every plot."""
    from attnrepro.figures import series_colours
    proc = subprocess.run([sys.executable, "scripts/plot_colours.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    variants_seen = 0
    for pid, defn in data_plots().items():
        template = json.loads((REPO / ".dvc" / "plots" / f"{defn['template']}.json").read_text(encoding="utf-8"))
        if defn["template"] == "series":  # lines named by the data: Vega's cycle in the table's order, as the PNG
            assert template["encoding"]["color"]["sort"] is None
            continue
        expr = next(t["calculate"] for t in template["transform"] if t.get("as") == "colour")
        mapping = json.loads(expr[1:expr.index(")[datum.line]")])
        sources = y_sources(defn)
        lines = ([Path(f).stem for f, _ in sources] if len({f for f, _ in sources}) > 1 else [c for _, c in sources])
        assert {n: mapping[n] for n in lines} == series_colours(lines), pid
        assert len({mapping[n] for n in lines}) == len(lines), pid
        variants_seen += sum(n in ("d32_scaled", "d256_unscaled") for n in lines)
    assert variants_seen >= 8  # train's and seeds' views draw the variants by their palette entries
