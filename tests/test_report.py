"""The report stage: deterministic outputs from fixture metrics; `dvc plots show` renders."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnrepro.files import dvc_stages
from attnrepro.formatting import fmt
from conftest import unpad

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("d32_unscaled", "d32_scaled", "d256_unscaled", "d256_scaled")


def make_workspace(root: Path) -> Path:
    """A minimal workspace: params, claims, metrics, env records, training curves, one PNG."""
    root.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    (root / "params.yaml").write_text(yaml.safe_dump({"train": params["train"], "report": params["report"],
                                                      "attention": params["attention"]},
                                                     allow_unicode=True), encoding="utf-8")
    shutil.copy(REPO / "claims.yaml", root / "claims.yaml")
    (root / "src/attnrepro/judge").mkdir(parents=True)  # the predicates, beside claims.yaml
    shutil.copy(REPO / "src/attnrepro/judge/conclusions.py", root / "src/attnrepro/judge/conclusions.py")
    (root / "metrics" / "env").mkdir(parents=True)
    train = {v: {"params": 425984 if "d32" in v else 1376256, "loss_start": 7.1,
                 "loss_final": 4.0 + 0.1 * i, "entropy_step222": 0.5 - 0.1 * i} for i, v in enumerate(VARIANTS)}
    train["comparison"] = {"gap_d32_loss_final": 0.1, "gap_ratio_loss_final": 1.0}
    (root / "metrics" / "train.json").write_text(json.dumps(train), encoding="utf-8")
    (root / "metrics" / "corpus.json").write_text(json.dumps({"poems": 4003, "vocab_size": 1200}), encoding="utf-8")
    (root / "metrics" / "env" / "corpus.json").write_text(
        json.dumps({"cpu": "Test CPU", "cuda_available": 0, "torch": "x", "ram_bytes": 2**33}), encoding="utf-8")
    (root / "plots" / "train").mkdir(parents=True)
    for i, v in enumerate(VARIANTS):
        rows = ["step,lr,loss,grad_norm,entropy_l0,logit_std_l0,jacobian_fro_l0,val_loss"]
        for s in range(60):
            diag = f"{0.9 / (1 + i * s / 10):.6g},{1 + s * i:.6g},{0.3 / (1 + i * s / 10):.6g}" if s % 10 == 0 else ",,"
            rows.append(f"{s},0.001,{7.1 - s * 0.03 * (1 + 0.1 * i):.6g},1.0,{diag},")
        (root / "plots" / "train" / f"{v}.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "plots" / "init_sweep").mkdir(parents=True)
    rows = ["d_head,logit_std,theory_sqrt_d,pred_varprop"] + [f"{d},{0.002 * d},{d ** 0.5:.6g},{0.002 * d}"
                                                             for d in (32, 64, 128, 256, 512)]
    (root / "plots" / "init_sweep" / "sweep.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    # a real PNG for the embedding path
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(1, 1))
    fig.savefig(root / "plots" / "init_sweep" / "sweep.png", metadata={"Software": None})
    plt.close(fig)
    return root


def run_stage(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "stages" / "report.py")], cwd=root, capture_output=True,
                          text=True, timeout=120)


def snapshot(root: Path) -> dict[str, bytes]:
    files = [root / "metrics" / "claims.json", root / "metrics" / "claims_summary.json",
             *sorted((root / "report").rglob("*"))]
    return {str(f.relative_to(root)): f.read_bytes() for f in files if f.is_file()}


def test_report_stage_is_deterministic_and_complete(tmp_path):
    root = make_workspace(tmp_path / "w")
    p = run_stage(root)
    assert p.returncode == 0, p.stderr
    first = snapshot(root)
    p = run_stage(root)
    assert p.returncode == 0, p.stderr
    assert snapshot(root) == first  # byte-identical, figures and the HTML included

    assert {"report/REPORT.md", "report/APPENDIX.md", "report/REPORT.html", "report/figures/train_loss.png",
            "report/figures/train_diagnostics.png", "metrics/claims.json", "metrics/claims_summary.json"} <= set(first)
    md = unpad(first["report/REPORT.md"].decode())
    for name in ("train_loss.png", "train_diagnostics.png"):
        assert f"(figures/{name})" in md
    # a stage's figure is linked where it lies, and the link resolves from report/
    assert "(../plots/init_sweep/sweep.png)" in md and (root / "report" / "../plots/init_sweep/sweep.png").is_file()
    assert not any(f.startswith("report/figures/init_sweep") for f in first)
    # laid out like a paper: the verdict first, one numbered section per experiment in the chapter's order (no
    # heading twice), each with its design, cost and answer; the machine in one line, the tables in the appendix
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert len(headings) == len(set(headings)), headings
    appendix = unpad(first["report/APPENDIX.md"].decode())
    assert headings[0] == "## Verdict" and appendix.rstrip().split("\n## ")[-1].startswith("Machine records")
    numbered = [h for h in headings if h[3].isdigit()]
    assert [int(h[3:].split(".")[0]) for h in numbered] == list(range(1, len(numbered) + 1))
    order = [next(i for i, h in enumerate(numbered) if word in h) for word in
             ("Corpus", "controlled comparison", "initialisation", "heads of", "KV cache", "bugs", "O(n²)",
              "precision", "Exercises 1-2", "Exercise 3", "QK-norm", "Sensitivity", "reversal", "character LM")]
    assert order == sorted(order), numbered
    assert md.count("**Design.**") == md.count("**Cost.**") == md.count("**Answer.**") == len(numbered)
    assert "**Machine:** Test CPU" in md and "`attnrepro check`" in md
    train = md.split(next(h for h in numbered if "controlled comparison" in h), 1)[1].split("\n## ", 1)[0]
    assert "(figures/train_loss.png)" in train and "| d32_unscaled.params |" not in train  # the figure inline
    assert "](APPENDIX.md#the-controlled-comparison" in train and "| d32_unscaled.params |" in appendix  # its table
    assert "## The controlled comparison" in appendix and not re.search(r"^## \d", appendix, re.M)  # numbers skipped
    init = md.split(next(h for h in numbered if "initialisation" in h), 1)[1].split("\n## ", 1)[0]
    assert "(../plots/init_sweep/sweep.png)" in init  # a stage's figure in its own section
    assert "**The chapter " in md and "**this run against the reference:**" in md
    assert "❌" in md and "✅" in appendix and "unexplained" in appendix

    claims = json.loads(first["metrics/claims.json"])
    # the fixture's losses (4.0 .. 4.3) break the d256 gap conclusion, recomputed from the raw losses
    assert claims["train.d256_unscaled_behind"]["pass"] == 0 and claims["train.d256_unscaled_behind"]["class"] == "conclusion"
    assert claims["train.params.d32_scaled.params"] == {"class": "checksum", "pass": 1, "skipped": 0,
                                                        "value": 425984, "published": 425984}
    assert claims["corpus.pinned.poems"]["pass"] == 1
    summary = json.loads(first["metrics/claims_summary.json"])
    assert set(summary) == {"conclusion", "finding", "checksum", "value"}
    for cls, c in summary.items():
        assert c["n"] == c["passed"] + c["failed"], cls  # n: those judged, the skipped apart
    assert summary["conclusion"]["failed"] > 0
    assert "20" not in md.split("\n")[0]  # no dates in the title line


def test_report_changes_when_a_metric_changes(tmp_path):
    root = make_workspace(tmp_path / "w")
    assert run_stage(root).returncode == 0
    before = snapshot(root)
    train = json.loads((root / "metrics" / "train.json").read_text())
    train["d256_unscaled"]["loss_final"] = 5.2
    (root / "metrics" / "train.json").write_text(json.dumps(train))
    assert run_stage(root).returncode == 0
    after = snapshot(root)
    assert after["report/REPORT.md"] != before["report/REPORT.md"]
    assert after["report/REPORT.html"] != before["report/REPORT.html"]
    assert json.loads(after["metrics/claims.json"])["train.d256_unscaled_behind"]["pass"] == 1


def test_report_stage_bad_params_one_line(tmp_path):
    root = make_workspace(tmp_path / "w")
    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    params["report"]["smooth"] = 0
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    p = run_stage(root)
    assert p.returncode == 2 and p.stderr.strip().startswith("error: report.smooth")
    assert not (root / "report").exists()


def test_dvc_plots_show_renders_the_top_level_plots(tmp_path):
    if shutil.which("dvc") is None and not (Path(sys.executable).parent / "dvc").exists():
        pytest.skip("dvc not installed")
    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    root = make_workspace(tmp_path / "w")
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=root, check=True, timeout=60)
    shutil.copytree(REPO / ".dvc" / "plots", root / ".dvc" / "plots", dirs_exist_ok=True)  # the project's templates
    from attnrepro.report import headline_metrics as headline  # the page's tables (stage headline) from this workspace's files

    headline.write_tables(root / headline.VIEWS_DIR,
                          headline.views(lambda p: headline.read_rows(root / p), skip_missing=True))
    p = subprocess.run([dvc, "plots", "show", "-o", "html"], cwd=root, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([dvc, "plots", "show", "--json"], cwd=root, capture_output=True, text=True, timeout=120)
    ours = ("train_loss", "train_entropy_l0", "train_jacobian_l0", "init_sweep_logit_std")
    errors = [e for e in json.loads(p.stdout).get("errors") or [] if e.get("name") in ours]
    assert not errors, errors  # other stages' plots may lack their files in this fixture
    html = (root / "html" / "index.html").read_text(encoding="utf-8")
    for title in ("Training loss of the four variants", "Layer-0 attention entropy",
                  "Layer-0 softmax Jacobian norm", "Logit std at init"):
        assert title in html, title
    for v in VARIANTS:  # each variant's curve is a series of its own (dvc names them by file)
        assert f"{v}.csv" in html, v
    assert "sweep.png" in html


def test_report_stanza_depends_on_every_stage_output_it_reads():
    """dvc.yaml: the report's deps cover every metrics/*.json, metrics/env/*.json and embedded
    PNG that a stage outputs (so `dvc repro report` reruns when any of them changes), and list
    nothing that no stage outputs."""
    stages = dvc_stages(REPO)  # a foreach stage's copies (choices@<arm>) as DVC runs them
    outputs: set[str] = set()
    for name, st in stages.items():
        for kind in ("outs", "metrics", "plots"):
            for o in st.get(kind, []) or []:
                outputs.add(next(iter(o)) if isinstance(o, dict) else o)
    deps = set(stages["report"]["deps"])
    reads = {p for p in outputs if p not in ("metrics/claims.json", "metrics/claims_summary.json",
                                             "metrics/headline.json") and (
        (p.startswith("metrics/") and p.endswith(".json")) or (p.startswith("plots/") and p.endswith(".png")))}
    missing = [p for p in sorted(reads)
               if p not in deps and not any(p.startswith(d.rstrip("/") + "/") for d in deps)]
    assert not missing, f"report deps lack {missing}"
    produced = lambda d: d in outputs or any(d.startswith(o.rstrip("/") + "/") for o in outputs) or \
        (d.startswith("plots/train/") and "plots/train/*.csv" in outputs)
    stray = [d for d in deps if d.startswith(("metrics/", "plots/")) and not produced(d)]
    assert not stray, f"report deps that no stage outputs: {stray}"
    for stage in ("heads", "failures", "precision", "kv_cache", "latency", "train", "init_sweep", "reversal", "charlm"):
        assert f"metrics/{stage}.json" in deps and f"metrics/env/{stage}.json" in deps, stage


def test_report_per_seed_table_from_the_distribution(tmp_path):
    """Each seed's value of the headline metrics, with this run, their mean and sd (metrics/dist/train.json)."""
    root = make_workspace(tmp_path / "w")
    train = json.loads((root / "metrics" / "train.json").read_text())
    runs = {}
    for k, seed in enumerate(("20261014", "1", "2")):
        runs[seed] = {v: {"entropy_step222": train[v]["entropy_step222"] + 0.01 * k} for v in VARIANTS}
    from attnrepro.stats import distribution

    (root / "metrics" / "dist").mkdir()
    (root / "metrics" / "dist" / "train.json").write_text(json.dumps(distribution({int(s): r for s, r in runs.items()})))
    p = run_stage(root)
    assert p.returncode == 0, p.stderr
    md = unpad((root / "report" / "APPENDIX.md").read_text(encoding="utf-8"))
    assert "| metric | this run | seed 1 | seed 2 | seed 20261014 | mean | sd |" in md
    row = next(line for line in md.splitlines() if line.startswith("| d256_scaled.entropy_step222 |"))
    x = train["d256_scaled"]["entropy_step222"]
    assert row == f"| d256_scaled.entropy_step222 | {fmt(x, 4)} | {fmt(x + 0.01, 4)} | {fmt(x + 0.02, 4)} | {fmt(x, 4)} | " \
                  f"{fmt(x + 0.01, 4)} | 0.01 |"


def test_one_verdict_rendered_twice():
    """The report's verdict and `attnrepro check` print the same counts, made by the same code
    (judge.claims.tally_lines, judge.endpoints.summary_line), for the same results; and the committed
    report says them (the committed run's counts)."""
    from attnrepro.judge.check import Outcome, render
    from attnrepro.judge.claims import counts, load, tally_lines
    from attnrepro.report.assemble import build

    rep = build(REPO / "claims.yaml", REPO / "metrics", REPO / "plots", pairs=[])
    check = render(Outcome([], rep.results, {}, {})).splitlines()
    tally = tally_lines(counts(rep.results))
    assert set(tally) == {"conclusion", "finding", "checksum", "value"}
    for line in tally.values():
        assert f"  {line}" in check and line in rep.markdown.splitlines()
        assert line in (REPO / "report" / "REPORT.md").read_text(encoding="utf-8").splitlines()
    n = len(load(REPO / "claims.yaml").primary)
    assert sum(line.startswith(f"primary     {n} endpoints: ") for line in rep.markdown.splitlines()) == 1


def test_the_committed_reports_first_screen_answers():
    """REPORT.md's first 40 lines: both answers in one line, the chapter-against-ours table (the two gaps, the ratio
    with Fieller's interval), every conclusion of the chapter this run does not reproduce (metrics/claims.json)
    with its measured cause in at most about 50 words or "No measured cause", and the compute spent; the report
    at most about 550 lines, its tables at most 8 columns."""
    from attnrepro.judge.claims import load

    own = {c.id for c in load(REPO / "claims.yaml").claims if c.own}  # this project's findings, not the chapter's
    assert "sensitivity.block_32_moves_the_failures_table" in own and "qknorm.l2_gain_instead_loss" in own

    md = (REPO / "report" / "REPORT.md").read_text(encoding="utf-8").splitlines()
    first = "\n".join(md[:40])
    for words in ("**The chapter ", "**this run against the reference:**", "| loss gap at d_head 32 |",
                  "| loss gap at d_head 256 |", "| ratio of the mean gaps |", "(Fieller)",
                  "**Not reproduced, and why**", "**Compute spent:**"):
        assert words in first, words
    claims = json.loads((REPO / "metrics" / "claims.json").read_text(encoding="utf-8"))
    failed = [k for k, c in claims.items() if c["class"] == "conclusion" and not c["pass"] and not c["skipped"]
              and k not in own]
    assert failed
    for cid in failed:
        line = next(x for x in md[:40] if x.startswith(f"- `{cid}` "))
        assert "Measured cause: " in line or line.endswith("No measured cause."), line
        assert len(line.split("Measured cause: ")[-1].split()) <= 50, line
    assert len(md) <= 550
    widths = {line.count("|") - 1 for line in md if line.startswith("|")}
    assert widths and max(widths) <= 8, widths
