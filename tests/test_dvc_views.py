"""DVC views a person can read (issue 21 item 2; docs/dvc_views.md).

(a) `dvc exp show` / `dvc metrics diff` show one declared metrics file, metrics/headline.json:
    fewer than 60 numbers, never a timing; every other metrics file stays a plain output.
(b) every plot tells its lines apart (each y series its own file or column, a template of ours that
    colours by series), log axes where the PNGs draw them, the smoothing slider only against `step`,
    and the step-wise tables are plotted from plots/views/ (only the columns a plot needs).
(c) with Chromium on PATH, the page `dvc plots show` writes from this repository's plot files draws
    every plot and stays under 3 MB (skipped without Chromium).
"""

from __future__ import annotations

import csv
import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo, run_script

from attnrepro.report import headline_metrics as headline
from attnrepro.config import UserError
from attnrepro.files import dvc_stages
from attnrepro.judge.claims import load as load_claims
from attnrepro.stats import flatten

DVC = Path(sys.executable).parent / "dvc"
DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
CLAIMS = yaml.safe_load((REPO / "claims.yaml").read_text(encoding="utf-8"))
# the headline's metrics: the primary endpoints' (claims.yaml `primary:`)
HEADLINE = load_claims(REPO / "claims.yaml").headline
TEMPLATES = REPO / ".dvc" / "plots"
IMAGE = (".png", ".jpg", ".jpeg", ".svg", ".gif")
MAX_PAGE_BYTES = 3_000_000

# the templates vetted here: each colours by the field named (never by revision alone)
VETTED = {"linear": "line", "linear_logy": "line", "lines": "line", "lines_logx": "line", "lines_loglog": "line",
          "categories": "line", "series": "series"}
# the plots whose PNG draws a log axis (src/attnrepro/figures.py, report.py)
LOG_Y = {"train_entropy_l0", "train_jacobian_l0", "init_sweep_logit_std", "kv_cache_latency", "attention_latency",
         "reversal_loss", "charlm_loss", "charlm_batch_loss", "critical_entropy"}
LOG_X = {"init_sweep_logit_std", "kv_cache_latency", "attention_latency", "critical_gap", "critical_entropy"}


def _entries(section):
    for e in section or []:
        yield (e, {}) if isinstance(e, str) else next(iter(e.items()))


def data_plots() -> dict[str, dict]:
    return {pid: (d or {}) for pid, d in _entries(DVC_YAML.get("plots")) if not pid.lower().endswith(IMAGE)}


def y_sources(defn: dict) -> list[tuple[str, str]]:
    return [(f, c) for f, cols in (defn.get("y") or {}).items() for c in ([cols] if isinstance(cols, str) else cols)]


def template(name: str) -> dict:
    return json.loads((TEMPLATES / f"{name}.json").read_text(encoding="utf-8"))


def _walk(node, key):
    """Every value of `key` in a nested spec."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _walk(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, key)


# ---------------------------------------------------------------- (a) the declared metrics

def test_the_only_declared_metric_is_the_headline():
    declared = [p for st in DVC_YAML["stages"].values() for p, _ in _entries(st.get("metrics"))]
    assert declared == [headline.HEADLINE]
    st = DVC_YAML["stages"]["headline"]
    assert st["cmd"] == "sh scripts/py stages/headline.py"
    for out, opts in [*_entries(st.get("metrics")), *_entries(st.get("outs"))]:
        assert opts.get("cache") is False and opts.get("persist") is True, out
    assert {p for p, _ in _entries(st["outs"])} == {headline.VIEWS_DIR}


def test_every_other_metrics_file_stays_an_output():
    """What attnrepro reads (metrics/<stage>.json) is still some stage's output, a plain one."""
    stages = dvc_stages(REPO)
    outs = {p for st in stages.values() for p, _ in _entries(st.get("outs"))}
    for name in stages:
        if name in ("headline", "report"):
            continue
        assert f"metrics/{name.replace('@', '_')}.json" in outs, name  # choices@<arm>: metrics/choices_<arm>.json
    assert "metrics/claims_summary.json" in outs


def test_headline_deps_cover_what_it_reads():
    deps = set(DVC_YAML["stages"]["headline"]["deps"])
    stems = {n.split(".", 1)[0] for n in HEADLINE}
    assert {f"metrics/{s}.json" for s in stems} | {"metrics/seeds.json", "metrics/claims_summary.json",
                                                  "claims.yaml"} <= deps
    for view in headline.VIEWS:
        assert set(view.sources) <= deps, view.name


def _leaves(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], obj


def _real_inputs() -> dict:
    stems = sorted({n.split(".", 1)[0] for n in HEADLINE})
    paths = [REPO / "metrics" / f"{s}.json" for s in [*stems, "seeds", "claims_summary"]]
    if not all(p.is_file() for p in paths):
        pytest.skip("the repository's metrics files are missing")
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in paths}


def test_headline_is_small_and_has_no_timing():
    m = _real_inputs()
    out = headline.headline(HEADLINE, CLAIMS["timings"], m, m["seeds"], m["claims_summary"])
    leaves = dict(_leaves(out))
    assert len(leaves) < 60
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in leaves.values())
    for key in leaves:  # `run.<file>.<key>`: the claims' own names under run.
        name = key.removeprefix("run.")
        assert not any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(key, g) for g in CLAIMS["timings"]), key
        assert not any(w in key for w in ("seconds", "_ms", "time", "rss", "ram_")), key
    for name in HEADLINE:
        assert leaves[f"run.{name}"] == flatten(m[name.split('.')[0]], name.split('.')[0] + ".")[name]
    for key, fields in headline.SEED_SUMMARIES.items():
        for f in fields:
            assert leaves[f"over_seeds.{key}.{f}"] == m["seeds"][key][f]
    written = REPO / headline.HEADLINE
    if written.is_file():
        on_disk = dict(_leaves(json.loads(written.read_text(encoding="utf-8"))))
        assert len(on_disk) < 60 and set(on_disk) == set(leaves)


def test_headline_refuses_a_timing_and_a_missing_metric():
    seeds = {k: {f: 1.0 for f in fs} for k, fs in headline.SEED_SUMMARIES.items()}
    m = {"latency": {"sdpa": {"ms": 3.0}}, "train": {"a": {"loss_final": 2.0}}}
    with pytest.raises(UserError, match="is a timing"):
        headline.headline(["latency.sdpa.ms"], ["latency.*"], m, seeds, {})
    with pytest.raises(UserError, match="has no number train.a.entropy"):
        headline.headline(["train.a.entropy"], [], m, seeds, {})
    out = headline.headline(["train.a.loss_final"], ["latency.*"], m, {**seeds, "n_seeds": 3},
                            {"value": {"n": 4, "passed": 3}})
    assert out == {"run": {"train": {"a": {"loss_final": 2.0}}},
                   "over_seeds": {"n_seeds": 3, **seeds}, "claims": {"value": {"n": 4, "passed": 3}}}


def _headline_stage(tmp_path) -> tuple[Path, list[str], dict]:
    """stages/headline.py run on a copy of the repository's inputs: (the copy, the plot tables it read, the
    metrics files as they were before)."""
    m = _real_inputs()
    sources = sorted({s for v in headline.VIEWS for s in v.sources})
    if not all((REPO / s).is_file() for s in sources):
        pytest.skip("the repository's plot tables are missing")
    repo = copy_repo(tmp_path / "repo")
    for stem in m:
        (repo / "metrics").mkdir(exist_ok=True)
        shutil.copy(REPO / "metrics" / f"{stem}.json", repo / "metrics" / f"{stem}.json")
    for s in sources:
        (repo / s).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / s, repo / s)
    before = {p: p.read_bytes() for p in (repo / "metrics").rglob("*") if p.is_file()}
    proc = run_script("stages/headline.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return repo, sources, before


def test_headline_stage_writes_the_primary_endpoints_values(tmp_path):
    repo, _, _ = _headline_stage(tmp_path)
    leaves = dict(_leaves(json.loads((repo / headline.HEADLINE).read_text(encoding="utf-8"))))
    assert sorted(k.removeprefix("run.") for k in leaves if k.startswith("run.")) == sorted(HEADLINE)


def test_headline_stage_writes_only_its_outputs(tmp_path):
    """stages/headline.py on a copy of the repository's inputs: metrics/headline.json and plots/views/ only."""
    repo, sources, before = _headline_stage(tmp_path)
    assert {p: p.read_bytes() for p in before} == before
    new = sorted(str(p.relative_to(repo)) for p in [*(repo / "metrics").rglob("*"), *(repo / "plots").rglob("*")]
                 if p.is_file() and p not in before and str(p.relative_to(repo)) not in sources)
    views = sorted(v.path(line) for v in headline.VIEWS for line, _, _ in v.lines)
    assert new == sorted([headline.HEADLINE, *views])
    for view in headline.VIEWS:
        for line, src, col in view.lines:
            with open(repo / view.path(line), newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            with open(repo / src, newline="", encoding="utf-8") as f:
                full = [r for r in csv.DictReader(f) if r[col] != ""]
            assert list(rows[0]) == [view.x, view.y]
            assert 0 < len(rows) <= headline.MAX_POINTS and all(r[view.y] != "" for r in rows)
            assert rows[0][view.y] == full[0][col] and rows[-1][view.y] == full[-1][col]  # ends kept


def test_thin_keeps_the_ends_and_the_cap():
    assert headline.thin(list(range(10)), 20) == list(range(10))
    for n in (501, 1000, 1500, 1501, 4000):
        out = headline.thin(list(range(n)), 500)
        assert out[0] == 0 and out[-1] == n - 1 and len(out) <= 500
        gaps = {b - a for a, b in zip(out, out[1:-1])}
        assert len(gaps) <= 1  # evenly spaced but for the last


# ---------------------------------------------------------------- (b) the plots

def test_views_match_the_params_and_the_plots():
    for v in headline.VIEWS[:4]:  # the train and seeds views: one line per train variant
        assert [line for line, _, _ in v.lines] == list(PARAMS["train"]["variants"]), v.name
    q = next(v for v in headline.VIEWS if v.name == "qknorm_loss")
    assert [line for line, _, _ in q.lines] == [*PARAMS["qknorm"]["references"], *PARAMS["qknorm"]["forms"]]
    plotted = {f for d in data_plots().values() for f, _ in y_sources(d) if f.startswith(headline.VIEWS_DIR + "/")}
    made = {v.path(line) for v in headline.VIEWS for line, _, _ in v.lines}
    assert plotted == made
    for pid, defn in data_plots().items():
        for f, col in y_sources(defn):
            if f in made:
                view, _ = headline.view_of(f)
                assert (defn["x"], col) == (view.x, view.y), pid


@pytest.mark.parametrize("pid", sorted(data_plots()))
def test_each_plot_tells_its_lines_apart(pid):
    defn = data_plots()[pid]
    name = defn.get("template")
    assert name in VETTED, f"{pid}: template {name!r} is not one of {sorted(VETTED)}"
    sources = y_sources(defn)
    assert len(set(sources)) == len(sources), f"{pid}: a y series twice"
    if name == "series":  # a long table: one line per value of its `series` column
        assert len(sources) == 1
    spec = template(name)
    colours = list(_walk(spec, "color"))
    assert colours and all(c.get("field") == VETTED[name] for c in colours), f"{pid}: {name} colours by {colours}"
    assert not any(isinstance(v, str) and v.startswith("<DVC_METRIC_") and v not in (
        "<DVC_METRIC_DATA>", "<DVC_METRIC_TITLE>", "<DVC_METRIC_X>", "<DVC_METRIC_Y>", "<DVC_METRIC_X_LABEL>",
        "<DVC_METRIC_Y_LABEL>") for v in _walk_values(spec)), f"{name}: an optional DVC anchor (colours by revision)"


def _walk_values(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk_values(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_values(v)
    else:
        yield node


def _scale_types(spec, channel):
    return {(enc.get(channel) or {}).get("scale", {}).get("type", "linear")
            for enc in _walk(spec, "encoding") if isinstance(enc, dict) and "field" in (enc.get(channel) or {})}


@pytest.mark.parametrize("pid", sorted(data_plots()))
def test_log_axes_where_the_pngs_draw_them_and_the_slider_against_step_only(pid):
    defn = data_plots()[pid]
    spec = template(defn["template"])
    assert _scale_types(spec, "y") == {"log" if pid in LOG_Y else "linear"}, pid
    assert _scale_types(spec, "x") == {"log" if pid in LOG_X else "linear"}, pid
    slider = any(p.get("name") == "smooth" for p in spec.get("params", []))
    assert slider == (defn["x"] == "step"), f"{pid}: x {defn['x']}, smoothing slider {slider}"


def test_the_log_templates_are_log():
    assert _scale_types(template("linear_logy"), "y") == {"log"}
    assert _scale_types(template("lines_loglog"), "y") == {"log"} == _scale_types(template("lines_loglog"), "x")
    assert _scale_types(template("lines_logx"), "x") == {"log"}
    assert _scale_types(template("linear"), "y") == {"linear"}


# ---------------------------------------------------------------- (c) the page, in Chromium

def _screenshot_module():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import screenshot_plots
    finally:
        sys.path.pop(0)
    return screenshot_plots


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """`dvc plots show --out` on a copy of the repository with its real plot files."""
    files = {f for d in data_plots().values() for f, _ in y_sources(d)}
    files |= {pid for pid, _ in _entries(DVC_YAML.get("plots")) if pid.lower().endswith(IMAGE)}
    for st in DVC_YAML["stages"].values():
        files |= {p for p, _ in _entries(st.get("plots"))}
    missing = sorted(f for f in files if not (REPO / f).is_file())
    assert not missing, f"committed plot files missing (dvc repro their stages): {missing[:3]}"
    repo = copy_repo(tmp_path_factory.mktemp("views") / "repo")
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=repo, check=True, env=env)
    shutil.copy(REPO / ".dvc" / "config", repo / ".dvc" / "config")
    shutil.copytree(TEMPLATES, repo / ".dvc" / "plots", dirs_exist_ok=True)
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, repo / f)
    proc = subprocess.run([str(DVC), "plots", "show", "--json"], cwd=repo, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    out = repo / "page"
    html = _screenshot_module().plots_show(repo, out)
    return type("Page", (), {"repo": repo, "html": html, "json": shown})


def test_page_embeds_only_what_each_plot_needs(page):
    assert not page.json.get("errors"), page.json["errors"]
    assert page.html.stat().st_size < MAX_PAGE_BYTES, f"{page.html.stat().st_size / 1e6:.1f} MB"
    for pid, defn in data_plots().items():
        (rendered,) = page.json["data"][pid]
        values = rendered["content"]["data"]["values"]
        if any(f.startswith(headline.VIEWS_DIR + "/") for f, _ in y_sources(defn)):  # x, y, rev, filename, field
            assert all(len(v) == 5 for v in values), pid
        lines = {(v.get("filename"), v.get("field"), v.get("series")) for v in values}
        assert len(lines) >= len(y_sources(defn)), pid


def test_page_renders_in_chromium(page, tmp_path):
    shot = _screenshot_module()
    chromium = shot.find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on PATH")
    r = shot.render(page.html, chromium, tmp_path / "page.png", width=1400, height=1600)
    assert r.vega_plots == len(data_plots())
    assert r.ok, f"{r.drawn} of {r.vega_plots} plots drew; {r.errors[:3]}"
    assert r.html_bytes < MAX_PAGE_BYTES
    png = (tmp_path / "page.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000  # a blank page compresses to a few kB
