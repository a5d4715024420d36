"""`attnrepro check`: exact on the reference's machine, statistical elsewhere, conclusions recomputed.

Every test builds its own temporary git repository: a small claims file and its predicates
(`predicates`, src/attnrepro/judge/conclusions.py), a four-stage
dvc.yaml, params, metrics, a seed distribution, machine records and dvc.lock committed as
the reference; the workspace is then changed the way a rerun (or a tamperer) would. The
live machine is `live` (a fixture: the Intel machine the reference was made on), and
`check` records the workspace in dvc.lock first, as `dvc repro` would (test_check_lock.py
covers outputs edited after the run).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from attnrepro.commands.main import main
from attnrepro.stats import distribution
from conftest import unpad
from test_check_lock import relock

REPO = Path(__file__).resolve().parents[1]
# the registry of the project's conclusions.py (its text up to the first claim): what a test's predicates use
REGISTRY = (REPO / "src/attnrepro/judge/conclusions.py").read_text(encoding="utf-8").split("\n# ----", 1)[0]


def predicates(*claims) -> str:
    """The text of a conclusions.py registering `claims`, each (experiment, cls, id, text, body[, requires]);
    a body without `return` is the expression returned."""
    out = [REGISTRY]
    for exp, cls, cid, text, body, *requires in claims:
        body = body if "return" in body else f"return {body}"
        out.append(f"\n\n@claim({exp!r}, {cls!r}, {cid!r}, {text!r}, requires={(requires or [None])[0]!r})\n"
                   f"def {cid.lower().replace('-', '_')}(m):\n    {body}\n")
    return "".join(out)


INTEL = {"cpu": "Intel Xeon", "torch": "2.13.0+cpu", "python": "3.11.7", "torch_threads": 1, "device": "cpu",
         "cuda_available": 0}
AMD = {**INTEL, "cpu": "AMD EPYC"}
CLAIMS = {"primary": [["train.unscaled.loss_final", "±0.2", "the test's margin"],
                      ["train.unscaled.entropy", "×2", "the test's margin"]],
          "gpu_only": ["latency.gpu_*"], "timings": ["latency.*"],
          "experiments": {
              "train": {"section": "§2 train",
                        "checksums": [{"id": "params", "text": "parameter count", "metric": "train.{row}.{col}",
                                       "columns": ["params"], "rows": {"scaled": [1000]}, "tol": "exact"}],
                        "values": [{"id": "loss", "text": "final loss", "metric": "train.{row}.{col}",
                                    "columns": ["loss_final"], "rows": {"scaled": [4.2]}}]},
              "latency": {"section": "§7"},
              "sweep": {"section": "a sweep", "drift": [["sweep.*", "info", "a summary over seeds"]]},
              "init": {"section": "§1", "drift": [["init.parity", "<= 64 eps64", "float noise"],
                                                  ["init.*", "±1%", "deterministic, no training"]]}}}
CONCLUSIONS = [("train", "conclusion", "unscaled_worse", "the unscaled model ends behind",
                'm["train.unscaled.loss_final"] - m["train.scaled.loss_final"] > 0.5'),
               ("train", "conclusion", "collapse", "the unscaled attention collapses", 'm["train.unscaled.entropy"] < 0.01')]
SEEDS = {s: {"scaled": {"params": 1000, "loss_final": 3.70 + 0.01 * s, "entropy": 0.84 + 0.005 * s},
             "unscaled": {"params": 1000, "loss_final": 5.10 + 0.02 * s, "entropy": 0.0004 * (1.3 ** s)}}
         for s in range(5)}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def write_repo(root: Path) -> Path:
    """The reference, committed: claims, params, a four-stage dvc.yaml, metrics, seeds, env records, dvc.lock."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "claims.yaml").write_text(yaml.safe_dump(CLAIMS), encoding="utf-8")
    (root / "src/attnrepro/judge").mkdir(parents=True)
    (root / "src/attnrepro/judge/conclusions.py").write_text(predicates(*CONCLUSIONS), encoding="utf-8")
    (root / "params.yaml").write_text(yaml.safe_dump({"train": {"lr": 0.003, "seed": 0}, "init": {"seed": 0}}),
                                      encoding="utf-8")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "sweep": {"cmd": "x", "metrics": ["metrics/sweep.json"], "outs": ["metrics/env/sweep.json"]},
        "train": {"cmd": "x", "params": ["train"], "metrics": ["metrics/train.json"],
                  "outs": ["metrics/env/train.json", "metrics/dist/train.json", "plots/train"]},
        "init": {"cmd": "x", "params": ["init"], "metrics": ["metrics/init.json"], "outs": ["metrics/env/init.json"]},
        "latency": {"cmd": "x", "metrics": ["metrics/latency.json"], "outs": ["metrics/env/latency.json"]}}}),
        encoding="utf-8")
    dump(root / "metrics/train.json", SEEDS[0])
    dump(root / "metrics/dist/train.json", distribution(SEEDS))
    dump(root / "metrics/init.json", {"logit_std": 0.0705, "parity": 4e-16})
    dump(root / "metrics/latency.json", {"cpu_ms": 3.0})
    dump(root / "metrics/sweep.json", {"gap": 0.2})
    (root / "plots/train").mkdir(parents=True)
    (root / "plots/train/loss.csv").write_text("step,loss\n0,5.5\n100,3.7\n", encoding="utf-8")
    for f in ("train", "init", "latency", "sweep"):
        dump(root / f"metrics/env/{f}.json", INTEL)
    relock(root)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "reference")
    return root


@pytest.fixture
def live(monkeypatch) -> dict:
    """The machine the check runs on (envinfo.environment's answer): the reference's, until a test moves it."""
    machine = dict(INTEL)
    monkeypatch.setattr("attnrepro.judge.check.live_environment", lambda device: machine)
    return machine


@pytest.fixture
def repo(tmp_path, live) -> Path:
    return write_repo(tmp_path / "r")


def check(root: Path, capsys, *args: str, lock: bool = True) -> tuple[int, str]:
    if lock:  # the workspace as a run made it: dvc.lock records its outputs and params
        relock(root)
    rc = main(["check", "--root", str(root), *args])
    out = capsys.readouterr()
    return rc, unpad(out.out + out.err)  # tables without their column padding


def edit(root: Path, file: str, change) -> None:
    p = root / "metrics" / f"{file}.json"
    data = json.loads(p.read_text(encoding="utf-8"))
    change(data)
    dump(p, data)


def another_machine(root: Path, live: dict) -> None:
    """The run was made here, on an AMD machine (the reference on an Intel one)."""
    live.update(AMD)
    for f in ("train", "init", "latency", "sweep"):
        dump(root / f"metrics/env/{f}.json", AMD)


def test_a_pass_judged_statistically_claims_no_more_than_nothing_shown_to_differ(repo, live, capsys):
    another_machine(repo, live)
    rc, out = check(repo, capsys)
    assert rc == 0 and out.splitlines()[0] == "check: PASS — nothing in this run is shown to differ from the reference (HEAD)"
    assert "INCONCLUSIVE" in out


def test_an_untouched_checkout_says_nothing_was_rerun(repo, capsys):
    rc, out = check(repo, capsys)
    assert rc == 0 and out.splitlines()[0].startswith("check: PASS — nothing was rerun: metrics/ holds the "
                                                      "reference's (HEAD) own results")


def test_the_reference_itself_passes_exactly_and_the_verdict_comes_first(repo, capsys):
    for f in ("train", "init", "latency", "sweep"):  # rerun here: the records of another run, the same machine
        dump(repo / f"metrics/env/{f}.json", {**INTEL, "git_revision": "a later commit"})
    rc, out = check(repo, capsys)
    assert rc == 0
    assert out.splitlines()[0] == "check: PASS — this run reproduces the reference (HEAD) exactly"
    assert "exact verdict (made as the reference's: same machine records and params): init, latency, sweep, train" in out
    # the primary endpoints: this run (one value) against the reference's 5 seeds, within ±0.2 shown
    assert "  primary     2 endpoints: 1 SAME, 0 DIFFERENT, 1 INCONCLUSIVE" in out
    assert "| train.unscaled.loss_final | ±0.2 | 1, 5 | 5.1 | 5.14 | -0.04 (-1.3 sd) | SAME |" in out
    legend = out.split("| SAME |", 1)[1].split("\n\n", 2)[1].splitlines()  # under the table, after a blank line
    assert [line.split()[0].rstrip(":") for line in legend] == ["SAME", "DIFFERENT", "INCONCLUSIVE"]
    assert "attnrepro check --decide" in legend[2] and "nothing to do" in legend[0]


def test_same_machine_same_params_any_change_fails(repo, capsys):
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.7000001))
    rc, out = check(repo, capsys)
    assert rc == 1 and out.startswith("check: FAIL")
    assert "metric train.scaled.loss_final = 3.7 drifted from 3.7 (exact)" in out


def test_another_machine_inside_the_seed_band_passes(repo, live, capsys):
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.72))
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert "statistical verdict (another machine (cpu: Intel Xeon -> AMD EPYC)): init, latency, sweep, train" in out


def endpoint_row(out: str, metric: str) -> str:
    """The primary endpoints table's row of `metric`."""
    return next(line for line in out.splitlines() if line.startswith(f"| {metric} | ") and line.endswith(" |")
                and line.count(" | ") == 6)


def test_another_machine_moving_a_primary_endpoint_beyond_its_margin_fails(repo, live, capsys):
    """unscaled.loss_final, a primary endpoint (±0.2; reference seeds 5.14 ± 0.032): 0.76 up is far beyond
    its margin, DIFFERENT; 0.06 up is not."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", 5.9))
    rc, out = check(repo, capsys)
    assert rc == 1 and "1 problem(s)" in out.splitlines()[0], out
    assert ("- primary endpoint train.unscaled.loss_final: DIFFERENT from the reference, shift +0.76 (+24 sd) beyond "
            "its margin ±0.2 (p ") in out
    assert endpoint_row(out, "train.unscaled.loss_final") == \
        "| train.unscaled.loss_final | ±0.2 | 1, 5 | 5.9 | 5.14 | +0.76 (+24 sd) | DIFFERENT |"
    assert "  primary     2 endpoints: 0 SAME, 1 DIFFERENT, 1 INCONCLUSIVE" in out
    rc, out = check(repo, capsys, "--json")
    d = json.loads(out)
    assert rc == 1 and d["verdict"] == "FAIL"
    assert [(e["metric"], e["margin"], e["margin_is"], e["answer"], e["seeds"], e["reference_seeds"])
            for e in d["endpoints"]] == [("train.unscaled.loss_final", 0.2, "absolute", "DIFFERENT", 1, 5),
                                         ("train.unscaled.entropy", 2.0, "factor", "INCONCLUSIVE", 1, 5)]
    assert {k: d["endpoint_counts"][k] for k in ("SAME", "DIFFERENT", "INCONCLUSIVE")} == \
        {"SAME": 0, "DIFFERENT": 1, "INCONCLUSIVE": 1}
    rc, md = check(repo, capsys, "--md")
    assert rc == 1 and md.startswith("### check: FAIL") and str(repo) not in md
    block = md.split("```")[1]  # the summary's code block holds no heading, no table, no problem
    assert "#" not in block and "|" not in block and "primary endpoint" not in block.replace("primary     ", "")
    assert "#### problems" in md and "#### primary endpoints" in md and "- **SAME**: " in md
    assert md.count("```") == 2
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", 5.2))  # inside the margin
    rc, out = check(repo, capsys)
    assert rc == 0 and "DIFFERENT |" not in out, out


def test_another_machine_far_outside_the_band_of_a_metric_that_is_no_endpoint_is_informational(repo, live, capsys):
    """scaled.loss_final has seeds but is no primary endpoint: 11 seed sd out of its band, it is shown with its
    band and z, not gated (on the reference's machine the same move is a difference: exact)."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.9))
    rc, out = check(repo, capsys, "--all")
    assert rc == 0, out
    assert "| train.scaled.loss_final | 3.9 | 3.7 | 3.672 – 3.768 (n=5), z +11 | band, not gated | info |" in out
    assert "not gated: 4 with seeds (band and z shown)" in out
    live.update(INTEL)
    for f in ("train", "init", "latency", "sweep"):
        dump(repo / f"metrics/env/{f}.json", INTEL)
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric train.scaled.loss_final = 3.9 drifted from 3.7 (exact)" in out


def test_collapsed_entropy_is_judged_on_the_log_scale(repo, live, capsys):
    """unscaled.entropy, a primary endpoint with margin ×2, near zero: divided by 30 it moves by less than its
    seeds' absolute spread (0.00039 against an sd of 0.0003) but 2.6 orders of e beyond its margin on the log
    scale: DIFFERENT, its shift shown as a factor. A factor 1.5, inside the margin, is not."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", d["unscaled"]["entropy"] / 30))
    rc, out = check(repo, capsys)
    assert rc == 1 and "1 problem(s)" in out.splitlines()[0], out  # the collapse conclusion still holds
    assert "- primary endpoint train.unscaled.entropy: DIFFERENT from the reference, shift ×0.0197" in out
    assert "beyond its margin ×2" in out
    assert endpoint_row(out, "train.unscaled.entropy").endswith("| DIFFERENT |")
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", 0.0004 * 1.5))
    rc, out = check(repo, capsys)
    assert rc == 0, out


def test_one_run_judged_statistically_cannot_move_a_conclusion_with_seeds(repo, live, capsys):
    """The unscaled loss set to the scaled one breaks train.unscaled_worse on the run, whatever a stored field says.
    Judged statistically that one run cannot move a share (a run outside even a unanimous reference has p 1/(n+1)):
    the conclusion keeps the reference seeds' verdict and the run's own outcome is named; what fails is the loss, a
    primary endpoint. Judged exactly (--mode exact), the conclusion fails with the run."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", d["scaled"]["loss_final"]))
    rc, out = check(repo, capsys)
    assert rc == 1 and "conclusion train.unscaled_worse fails" not in out, out
    assert ("2 of these with seeds, judged statistically, keep the reference seeds' verdict (one run cannot move a "
            "share); this run's own outcome differs on train.unscaled_worse (does not hold on this run; the "
            "reference's seeds: 5 of 5 seeds (48–100%))") in out, out
    assert "- primary endpoint train.unscaled.loss_final: DIFFERENT from the reference" in out, out
    assert check(repo, capsys, "--json")[1].count('"train.unscaled_worse (does not hold on this run') == 1
    rc, out = check(repo, capsys, "--mode", "exact")
    assert rc == 1 and "conclusion train.unscaled_worse fails" in out, out


def reference_with_entropy(repo: Path, entropy: dict) -> None:
    """Commit a reference whose seeds' unscaled.entropy is `entropy[seed]` where given."""
    seeds = json.loads(json.dumps(SEEDS))
    for s, e in entropy.items():
        seeds[str(s)]["unscaled"]["entropy"] = e
    dump(repo / "metrics/dist/train.json", distribution({int(k): v for k, v in seeds.items()}))
    relock(repo)
    git(repo, "commit", "-qam", "a reference with seeds that do not collapse")


def test_a_conclusion_that_holds_on_most_reference_seeds_holds(repo, capsys):
    """train.collapse (entropy < 0.01) holds on the run and on 4 of the reference's 5 seeds: a majority, it holds,
    its share named."""
    reference_with_entropy(repo, {3: 0.02})
    rc, out = check(repo, capsys, "--mode", "statistical", "--all")
    assert rc == 0 and "conclusions 2 of 2 hold (the chapter's; " in out, out
    assert "| train.collapse | conclusion | pass | holds on 4 of 5 seeds (28–99%)" in out


def test_a_conclusion_that_fails_on_half_the_reference_seeds_or_more_fails(repo, capsys):
    """train.collapse holds on the run but on only 2 of the reference's 5 seeds: no majority, it fails."""
    reference_with_entropy(repo, {2: 0.02, 3: 0.02, 4: 0.03})
    rc, out = check(repo, capsys, "--mode", "statistical")
    assert rc == 1 and "conclusions 1 of 2 hold (the chapter's; " in out, out
    assert ("- conclusion train.collapse fails: the unscaled attention collapses — holds on 2 of 5 seeds "
            "(5–85%)") in out


def test_parameter_count_plus_one_fails_the_checksum(repo, live, capsys):
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("params", 1001))
    rc, out = check(repo, capsys)
    assert rc == 1 and "checksum train.params.scaled.params fails" in out


def test_published_values_are_reported_never_gated(repo, capsys):
    rc, out = check(repo, capsys)
    assert rc == 0 and "published   0 of 1 published values inside our band or tolerance; of the others 1 unexplained" in out


def test_metrics_without_a_distribution_use_their_drift_rule(repo, live, capsys):
    another_machine(repo, live)
    edit(repo, "init", lambda d: d.update(logit_std=0.0706, parity=8e-16))  # +0.14%, 4 eps
    assert check(repo, capsys)[0] == 0
    edit(repo, "init", lambda d: d.update(logit_std=0.0720))  # +2%
    rc, out = check(repo, capsys)
    assert rc == 1 and "init.logit_std = 0.072 drifted from 0.0705 (±1%)" in out
    edit(repo, "init", lambda d: d.update(logit_std=0.0705, parity=2e-14))
    rc, out = check(repo, capsys)
    assert rc == 1 and "init.parity" in out


def test_exact_mode_compares_sweep_summaries_and_distributions(repo, live, capsys):
    edit(repo, "sweep", lambda d: d.update(gap=0.25))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric sweep.gap = 0.25 drifted from 0.2 (exact)" in out
    another_machine(repo, live)
    assert check(repo, capsys)[0] == 0  # elsewhere a summary over seeds is reported, not gated
    for f in ("train", "init", "latency", "sweep"):
        dump(repo / f"metrics/env/{f}.json", INTEL)
    edit(repo, "sweep", lambda d: d.update(gap=0.2))
    seeds = json.loads(json.dumps(SEEDS))
    seeds["1"]["scaled"]["loss_final"] += 0.001
    dump(repo / "metrics/dist/train.json", distribution({int(k): v for k, v in seeds.items()}))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metrics/dist/train.json (the seed distribution) differs from HEAD's" in out


def test_timings_are_reported_not_gated(repo, capsys):
    edit(repo, "latency", lambda d: d.update(cpu_ms=30.0))
    rc, out = check(repo, capsys)
    assert rc == 0 and "gated metrics hold (" in out and "; not gated: 1 timings\n" in out
    assert "latency.cpu_ms" not in out
    rc, out = check(repo, capsys, "--all")
    assert "| latency.cpu_ms | 30 | 3 |" in out


def test_other_params_make_the_verdict_statistical(repo, capsys):
    (repo / "params.yaml").write_text(yaml.safe_dump({"train": {"lr": 0.001, "seed": 0}, "init": {"seed": 0}}),
                                      encoding="utf-8")
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.72))
    rc, out = check(repo, capsys)
    assert rc == 0 and "statistical verdict (other params (train)): train" in out
    assert "exact verdict (made as the reference's: same machine records and params): init, latency, sweep" in out


def shifted(by, seeds=None) -> dict:
    """The reference's seeds with unscaled.loss_final (a primary endpoint, ±0.2) moved by by(seed), renamed to
    `seeds` if given."""
    out = {}
    for i, (s, v) in enumerate(SEEDS.items()):
        v = json.loads(json.dumps(v))
        v["unscaled"]["loss_final"] += by(s)
        out[seeds[i] if seeds else s] = v
    return out


def test_a_rerun_with_its_own_seeds_is_judged_with_n_its_seeds(repo, live, capsys):
    """A statistically judged stage that remade metrics/dist/train.json: the primary endpoints compare its 5
    seeds' mean with the reference's 5 seeds (standard error sd sqrt(1/5 + 1/5)). A shift of 0.27 (margin 0.2,
    seed sd 0.032) is INCONCLUSIVE from one run, DIFFERENT from five seeds. The run's own value
    (metrics/train.json) is one of them where it is one of its seeds' values, a sixth value where it is not."""
    another_machine(repo, live)
    others = [11, 12, 13, 14, 15]  # none of the reference's seeds
    first = SEEDS[0]["unscaled"]["loss_final"]
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.001, others)))
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", first + 0.001))  # the run: seed 11
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert endpoint_row(out, "train.unscaled.loss_final") == \
        "| train.unscaled.loss_final | ±0.2 | 5, 5 | 5.141 | 5.14 | +0.001 (+0.032 sd) | SAME |"
    # the run's own 5.1 is none of its seeds' values: judged with them, n 6 (mean (5 * 5.141 + 5.1) / 6)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", first))
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert endpoint_row(out, "train.unscaled.loss_final") == \
        "| train.unscaled.loss_final | ±0.2 | 6, 5 | 5.134167 | 5.14 | -0.00583 (-0.18 sd) | SAME |"
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.27, others)))
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", first + 0.27))  # the run: seed 11
    rc, out = check(repo, capsys)
    assert rc == 1 and "- primary endpoint train.unscaled.loss_final: DIFFERENT from the reference, shift +0.27" in out
    assert endpoint_row(out, "train.unscaled.loss_final").startswith(
        "| train.unscaled.loss_final | ±0.2 | 5, 5 | 5.41 |")
    # the same shift from one run (the reference's seeds, not remade): too few seeds to tell
    git(repo, "checkout", "metrics/dist/train.json")
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", 5.14 + 0.27))
    rc, out = check(repo, capsys)
    assert rc == 0, out
    assert endpoint_row(out, "train.unscaled.loss_final").startswith(
        "| train.unscaled.loss_final | ±0.2 | 1, 5 | 5.41 | 5.14 | +0.27 (+8.5 sd) | INCONCLUSIVE: ")


def test_seeds_of_its_own_do_not_exempt_the_run_itself(repo, live, capsys):
    """The run's seeds remade and near the reference's, but its own metrics/train.json far off on a primary
    endpoint (a conclusion reading it still holds: unscaled - scaled > 0.5): the run's value is judged with its
    seeds (n 6). One seed far from five others is no shown shift: the six seeds' spread pools into the error
    (a faithful rerun can land one seed in a mode the reference's seeds missed), so INCONCLUSIVE, the spread
    named; the same value on every seed (the run itself seed 0 again: n 5) is DIFFERENT."""
    another_machine(repo, live)
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.001)))
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", 99.0))
    rc, out = check(repo, capsys)
    assert rc == 0 and endpoint_row(out, "train.unscaled.loss_final").startswith(
        "| train.unscaled.loss_final | ±0.2 | 6, 5 | 20.78417 | 5.14 | +15.6 (+4.9e+02 sd) | INCONCLUSIVE: no number of "
        "seeds up to 100 decides it: with the run's seeds the pooled sd is "), out
    assert "× the reference's (a seed far from the others)" in endpoint_row(out, "train.unscaled.loss_final")
    e = next(e for e in json.loads(check(repo, capsys, "--json")[1])["endpoints"] if e["metric"] == "train.unscaled.loss_final")
    assert e["pooled_sd"] > 2 * e["reference_sd"] > 0 and e["answer"] == "INCONCLUSIVE"
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 99.0 - SEEDS[s]["unscaled"]["loss_final"])))
    rc, out = check(repo, capsys)
    problems = out.split("\nproblems:\n", 1)[-1].split("\n\n", 1)[0].splitlines()
    mine = [p for p in problems if "train.unscaled.loss_final" in p]
    assert rc == 1 and len(mine) == 1, out
    assert mine[0].startswith("- primary endpoint train.unscaled.loss_final: DIFFERENT from the reference, shift +93.9")
    assert endpoint_row(out, "train.unscaled.loss_final").startswith("| train.unscaled.loss_final | ±0.2 | 5, 5 | 99 | ")


def test_a_runs_own_seeds_of_a_log_scale_endpoint_are_judged_as_a_factor(repo, live, capsys):
    """unscaled.entropy (log scale, margin ×2; seed log sd 0.41) ×8 on every one of the run's own seeds, the run
    itself (seed 0) among them: DIFFERENT, the shift a factor; ×1.02 on every seed is no finding. The run left at
    the reference's value, none of its seeds' values, is a sixth value: the shift 8^(5/6) (0.0004 / 0.000676)^(1/6)
    = ×5.18 (0.000676 the reference seeds' geometric mean), judged with the six values' spread: INCONCLUSIVE."""
    another_machine(repo, live)

    def entropy_times(factor):
        out = {}
        for s, v in SEEDS.items():
            v = json.loads(json.dumps(v))
            v["unscaled"]["entropy"] *= factor
            out[s] = v
        edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", out[0]["unscaled"]["entropy"]))
        return distribution(out)

    dump(repo / "metrics/dist/train.json", entropy_times(8))
    rc, out = check(repo, capsys)
    assert rc == 1 and "- primary endpoint train.unscaled.entropy: DIFFERENT from the reference, shift ×8 (" in out
    assert endpoint_row(out, "train.unscaled.entropy").startswith("| train.unscaled.entropy | ×2 | 5, 5 | ")
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", SEEDS[0]["unscaled"]["entropy"]))
    rc, out = check(repo, capsys)
    assert rc == 0 and endpoint_row(out, "train.unscaled.entropy").startswith(
        "| train.unscaled.entropy | ×2 | 6, 5 | 0.00350381 | 0.000676 | ×5.18 (+4 sd) | INCONCLUSIVE: "), out
    dump(repo / "metrics/dist/train.json", entropy_times(1.02))
    rc, out = check(repo, capsys)
    assert rc == 0 and "DIFFERENT |" not in out, out


def test_seeds_remade_by_a_stage_of_their_own_are_tested_though_the_metrics_are_the_references(repo, live, capsys):
    stages = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))
    stages["stages"]["train"]["outs"].remove("metrics/dist/train.json")
    stages["stages"]["seeds"] = {"cmd": "x", "params": ["train"], "metrics": ["metrics/seeds.json"],
                                 "outs": ["metrics/env/seeds.json", "metrics/dist/train.json"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(stages), encoding="utf-8")
    dump(repo / "metrics/seeds.json", {"n": 5})
    dump(repo / "metrics/env/seeds.json", INTEL)
    relock(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a seeds stage")
    dump(repo / "metrics/env/seeds.json", AMD)  # the seeds stage alone rerun, elsewhere, with a shift
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.5)))
    rc, out = check(repo, capsys, "--made-on", "an AMD machine")
    # metrics/train.json is judged exactly (the reference's own run, 5.1, not rerun): only the remade seeds count
    assert rc == 1 and "- primary endpoint train.unscaled.loss_final: DIFFERENT from the reference, shift +0.5" in out
    assert endpoint_row(out, "train.unscaled.loss_final").startswith("| train.unscaled.loss_final | ±0.2 | 5, 5 | ")
    assert "train: judged exactly, and its seeds, remade by the seeds stage, against the reference's" in out
    # the metrics file stays exact: its last digit moved is a difference, whatever the seeds say
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.0)))
    assert check(repo, capsys, "--made-on", "an AMD machine")[0] == 0
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.7000001))
    rc, out = check(repo, capsys, "--made-on", "an AMD machine")
    assert rc == 1 and "metric train.scaled.loss_final = 3.7 drifted from 3.7 (exact)" in out


def test_missing_metric_fails_and_gpu_only_is_skipped(repo, capsys):
    edit(repo, "init", lambda d: d.pop("logit_std"))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric init.logit_std is in HEAD but missing from this run" in out
    edit(repo, "init", lambda d: d.update(logit_std=0.0705))
    dump(repo / "metrics/latency.json", {"cpu_ms": 3.0, "gpu_ms": 0.1})
    git(repo, "commit", "-qam", "a GPU reference")
    dump(repo / "metrics/latency.json", {"cpu_ms": 3.0})
    rc, out = check(repo, capsys)
    assert rc == 0, out


def test_bad_revision_and_bad_files_are_one_line_errors(repo, capsys):
    rc, out = check(repo, capsys, "--rev", "nope")
    assert rc == 2 and out.strip() == f"error: --rev: 'nope' is not a commit in {repo.resolve()}"
    (repo / "metrics/train.json").write_bytes(b"\xff\xfe not utf-8")
    rc, out = check(repo, capsys)
    assert rc == 2 and out.strip().endswith("train.json: not UTF-8 text") and out.count("\n") == 1
    (repo / "metrics/train.json").write_text("{", encoding="utf-8")
    rc, out = check(repo, capsys)
    assert rc == 2 and "not valid JSON" in out and out.count("\n") == 1


@pytest.mark.parametrize("damage", ["missing", "broken"])
def test_a_missing_or_broken_params_file_is_one_line(repo, capsys, damage):
    """Once read as {} (31 problems instead of one line)."""
    p = repo / "params.yaml"
    p.unlink() if damage == "missing" else p.write_text("train: [unclosed\n", encoding="utf-8")
    rc, out = check(repo, capsys)
    expected = "params file not found" if damage == "missing" else "not valid YAML at line"
    assert rc == 2 and out.count("\n") == 1 and out.startswith(f"error: {p}") and expected in out, out


def test_a_sweep_summary_is_informational_and_its_conclusion_gated(repo, live, capsys):
    """Judged statistically, a sweep's summaries are shown, never gated (issue 42: only the primary endpoints,
    checksums and conclusions decide); the conclusion that reads them still must come out as on the reference."""
    dump(repo / "metrics/sweep.json", {"seeds": 3, "gap": 0.2, "cell": {"mean": 0.5, "sd": 0.05, "min": 0.45,
                                                                        "max": 0.55}})
    claims = CONCLUSIONS + [("sweep", "conclusion", "cell_positive", "the cell's gap is positive",
                                     'm["sweep.cell.min"] > 0')]
    (repo / "src/attnrepro/judge/conclusions.py").write_text(predicates(*claims), encoding="utf-8")
    relock(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a sweep cell and its conclusion")
    another_machine(repo, live)
    edit(repo, "sweep", lambda d: d["cell"].update(mean=0.9, min=0.85, max=0.95))  # far, but the conclusion holds
    rc, out = check(repo, capsys)
    assert rc == 0 and "sweep.cell.mean" not in out, out
    edit(repo, "sweep", lambda d: d["cell"].update(min=-0.1))  # the conclusion stops holding
    rc, out = check(repo, capsys)
    assert rc == 1 and "conclusion sweep.cell_positive fails" in out, out


def test_a_seed_distribution_is_judged_in_the_mode_of_the_stage_that_writes_it(repo):
    from attnrepro.provenance.lock import dist_producers

    assert dist_producers(repo) == {"train": "train"}
    d = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))
    d["stages"]["train"]["outs"].remove("metrics/dist/train.json")
    d["stages"]["sweep"]["outs"].append("metrics/dist/train.json")  # as the seeds stage writes dist/train
    (repo / "dvc.yaml").write_text(yaml.safe_dump(d), encoding="utf-8")
    assert dist_producers(repo) == {"train": "sweep"}


def test_results_keyed_under_other_numerics_are_not_this_codes(repo, capsys):
    edit(repo, "env/train", lambda d: d.update(numerics={"corpus_lm": 0}))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metrics/train.json comes from runs keyed under other numerics than the code at HEAD's " \
                       "(corpus_lm: 0 -> 1)" in out


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_primary_endpoint_that_is_not_a_number_fails_statistically(repo, live, capsys, bad):
    """The conclusions alone do not catch it: unscaled_worse (unscaled - scaled > 0.5) holds for inf. Its answer is
    NOT A NUMBER, a problem (its row, with seeds, is not gated)."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", bad))
    rc, out = check(repo, capsys)
    problems = out.split("\nproblems:\n", 1)[-1].split("\n\n", 1)[0].splitlines()
    assert rc == 1 and ("- primary endpoint train.unscaled.loss_final: this run's value is not a number its scale can "
                        "judge") in problems, out
    assert [p for p in problems if "train.unscaled.loss_final" in p and "primary endpoint" in p] == [
        "- primary endpoint train.unscaled.loss_final: this run's value is not a number its scale can judge"]
    assert endpoint_row(out, "train.unscaled.loss_final") == \
        "| train.unscaled.loss_final | ±0.2 | 1, 5 | — | — | — | NOT A NUMBER |"
    assert "  primary     2 endpoints: 0 SAME, 0 DIFFERENT, 1 INCONCLUSIVE, 1 not a number (" in out
    assert json.loads(check(repo, capsys, "--json")[1])["endpoints"][0]["answer"] == "NOT A NUMBER"


def test_a_log_scale_endpoint_at_zero_is_not_a_number_and_a_missing_one_is_named_once(repo, live, capsys):
    """unscaled.entropy (log scale) at 0 has no logarithm: NOT A NUMBER, a problem. A missing endpoint stays
    MISSING: its metric's row is the problem, listed once (no second line for the endpoint)."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", 0.0))
    rc, out = check(repo, capsys)
    assert rc == 1 and "- primary endpoint train.unscaled.entropy: this run's value is not a number its scale can " \
                       "judge" in out, out
    assert endpoint_row(out, "train.unscaled.entropy").endswith("| NOT A NUMBER |")
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", SEEDS[0]["unscaled"]["entropy"]))
    edit(repo, "train", lambda d: d["unscaled"].pop("loss_final"))
    rc, out = check(repo, capsys)
    problems = out.split("\nproblems:\n", 1)[-1].split("\n\n", 1)[0].splitlines()
    assert rc == 1 and "- metric train.unscaled.loss_final is in HEAD but missing from this run" in problems, out
    assert not any(p.startswith("- primary endpoint train.unscaled.loss_final") for p in problems), out
    assert endpoint_row(out, "train.unscaled.loss_final") == \
        "| train.unscaled.loss_final | ±0.2 | 0, 5 | — | — | — | MISSING |"
    assert "  primary     2 endpoints: 0 SAME, 0 DIFFERENT, 1 INCONCLUSIVE, 1 missing (" in out


def test_an_endpoint_that_drifted_on_the_reference_machine_is_listed_once(repo, capsys):
    """Judged exactly, a primary endpoint moved far beyond its margin is its metric's DRIFT, listed once: not again
    as a DIFFERENT endpoint (its table row still says DIFFERENT)."""
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", 5.9))
    rc, out = check(repo, capsys)
    problems = out.split("\nproblems:\n", 1)[-1].split("\n\n", 1)[0].splitlines()
    assert rc == 1 and [p for p in problems if "train.unscaled.loss_final" in p] == [
        "- metric train.unscaled.loss_final = 5.9 drifted from 5.1 (exact)"], out
    assert endpoint_row(out, "train.unscaled.loss_final").endswith("| DIFFERENT |")


def test_mode_exact_holds_another_machines_run_to_the_reference_bytes(repo, live, capsys):
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.72))  # inside the seed band
    rc, out = check(repo, capsys, "--mode", "exact")
    assert rc == 1 and "metric train.scaled.loss_final = 3.72 drifted from 3.7 (exact)" in out


def test_a_conclusion_the_reference_does_not_reproduce_is_kept_both_ways(repo, live, capsys):
    """The reference's run did not collapse (entropy 0.02 on every seed) and its report says so: a run that does not
    either passes, naming it; a run on which the conclusion starts to hold has moved, and fails."""
    seeds = {s: {**SEEDS[s], "unscaled": {**SEEDS[s]["unscaled"], "entropy": 0.02 + 0.001 * s}} for s in SEEDS}
    dump(repo / "metrics/train.json", seeds[0])
    dump(repo / "metrics/dist/train.json", distribution(seeds))
    from attnrepro.judge.claims import claims_json, evaluate_all, load, load_json_dir, load_metrics_dir

    m = repo / "metrics"  # the report's claims.json, as it makes it (the check makes it again)
    results = evaluate_all(load(repo / "claims.yaml"), load_metrics_dir(m), load_json_dir(m / "dist"),
                           load_json_dir(m / "env"))
    dump(m / "claims.json", claims_json(results))
    assert json.loads((m / "claims.json").read_text(encoding="utf-8"))["train.collapse"]["pass"] == 0
    d = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8"))
    d["stages"]["report"] = {"cmd": "x", "outs": ["metrics/claims.json"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(d), encoding="utf-8")
    relock(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a reference that does not reproduce the collapse")
    rc, out = check(repo, capsys)
    assert rc == 0 and "not reproduced, as on the reference: " in out and "train.collapse" in out, out
    edit(repo, "train", lambda m: m["unscaled"].__setitem__("entropy", 0.005))
    rc, out = check(repo, capsys)
    assert rc == 1 and "conclusion train.collapse holds on this run, but not on the reference's run" in out, out
    edit(repo, "train", lambda m: m["unscaled"].pop("entropy"))  # what it reads is gone: a problem, never dropped
    rc, out = check(repo, capsys)
    assert rc == 1 and "- conclusion train.collapse fails: " in out and "metric train.unscaled.entropy not found" in out


def test_decide_prints_its_looks_in_order_and_its_last_answers_decide(repo, live, capsys, monkeypatch):
    """--decide (reruns stubbed: judge.decide's looks at the reference's first 1 and 3 seeds, the reruns 0.35 above
    them on unscaled.loss_final): each look is a note of the first lines, in order, after what the working tree
    changes, and the last look's answers replace the one run's (SAME from the run itself; DIFFERENT at 3 seeds)."""
    from attnrepro.judge import endpoints as E
    from attnrepro.judge.claims import seed_values
    from attnrepro.judge.decide import Look

    asked = []

    def decide(family, ref_dists, params, engine, max_seeds):
        asked.append((engine, max_seeds))
        ref = {e.metric: seed_values(ref_dists, e.metric) for e in family}
        looks = []
        for n in (1, 3):
            run = {m: [v + 0.35 if m.endswith("loss_final") else v for v in vs[:n]] for m, vs in ref.items()}
            looks.append(Look(list(range(n)), E.judge(family, ref, run, looks=4), 2 * n, 2 * n - 2 * (n > 1), 60.0 * n))
        return looks

    monkeypatch.setattr("attnrepro.judge.check.decide", decide)
    monkeypatch.setattr("attnrepro.run.engine_settings.engine_config", lambda params: "the engine")  # no runs here
    another_machine(repo, live)
    (repo / "claims.yaml").write_text(yaml.safe_dump({**CLAIMS, "timings": ["latency.*", "init.*"]}), encoding="utf-8")
    rc, out = check(repo, capsys)
    assert rc == 0 and endpoint_row(out, "train.unscaled.loss_final").endswith("| SAME |"), out
    rc, out = check(repo, capsys, "--decide", "3")
    assert asked == [("the engine", 3)], out
    assert out.split("\n\n", 1)[0].splitlines()[1:] == [
        "  claims.yaml differs from HEAD's; the verdict uses HEAD's:",
        '    loosened  timings "init.*"',
        "  --decide: look at 1 seed [0]: 0 SAME, 0 DIFFERENT, 2 INCONCLUSIVE; 2 runs (2 trained now), 1.0 CPU-min",
        "  --decide: look at 3 seeds [0, 1, 2]: 0 SAME, 1 DIFFERENT, 1 INCONCLUSIVE; 6 runs (4 trained now), "
        "3.0 CPU-min"], out
    assert rc == 1 and "- primary endpoint train.unscaled.loss_final: DIFFERENT from the reference, shift +0.33" in out
    assert endpoint_row(out, "train.unscaled.loss_final").startswith(
        "| train.unscaled.loss_final | ±0.2 | 3, 5 | 5.47 | 5.14 | +0.33 ")
    rc, out = check(repo, capsys, "--decide", "3", "--json")  # the looks in order, for scripts (gate_power)
    assert rc == 1 and json.loads(out)["looks"] == [
        {"seeds": [0], "SAME": 0, "DIFFERENT": 0, "INCONCLUSIVE": 2, "MISSING": 0, "NOT A NUMBER": 0, "runs": 2,
         "trained": 2, "cpu_seconds": 60.0},
        {"seeds": [0, 1, 2], "SAME": 0, "DIFFERENT": 1, "INCONCLUSIVE": 1, "MISSING": 0, "NOT A NUMBER": 0, "runs": 6,
         "trained": 4, "cpu_seconds": 180.0}]


def test_decide_shows_the_conclusions_on_its_seeds_against_the_reference_share(repo, live, capsys, monkeypatch):
    """--decide through judge.decide (only the runs stubbed): the reruns are the reference's seeds but for seeds 3
    and 4, whose unscaled attention does not collapse. Each conclusion is shown on the rerun seeds against the
    reference's share, with Fisher's exact p and the shares it would show different; not gated."""
    from attnrepro.judge import decide as D

    def rerun(params, file, seeds, engine):
        runs = {s: json.loads(json.dumps(SEEDS[s])) for s in seeds}
        for s in {3, 4} & set(seeds):
            runs[s]["unscaled"]["entropy"] = 0.02
        return runs, (2 * len(seeds), 0, 60.0 * len(seeds))

    monkeypatch.setattr(D, "rerun_values", rerun)
    monkeypatch.setattr("attnrepro.run.engine_settings.engine_config", lambda params: "the engine")
    another_machine(repo, live)
    rc, out = check(repo, capsys, "--decide", "5")
    assert "--decide: look at 5 seeds [0, 1, 2, 3, 4]" in out, out
    table = out.split("the chapter's conclusions on --decide's seeds against the reference's (shown, not gated: "
                      "Fisher's exact test of the two shares)\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[2:] == ["| train.unscaled_worse | 5 of 5 | 5 of 5 seeds (48–100%) | 1 | ≤ 1 of 5 |",
                         "| train.collapse | 3 of 5 | 5 of 5 seeds (48–100%) | 0.44 | ≤ 1 of 5 |"], out
    assert rc == 0 and "problems:" not in out, out
    assert "keep the reference seeds' verdict (one run cannot move a share; --decide's seeds: below)" in out, out
    main(["check", "--root", str(repo), "--decide", "5", "--json"])
    shares = json.loads(capsys.readouterr().out)["conclusion_shares"]
    assert [(x["id"], x["held"], x["seeds"], x["reference_held"], x["reference_seeds"], x["shown_different_at"])
            for x in shares] == [("train.unscaled_worse", 5, 5, 5, 5, [0, 1]), ("train.collapse", 3, 5, 5, 5, [0, 1])]


def test_what_the_check_prints_while_it_works_goes_to_stderr(repo, capfd, monkeypatch):
    """stdout holds the verdict alone: --decide's sweeps print their progress, in this process and in their worker
    processes (straight to the file descriptor), and a script reading --json (gate_power) must not see it."""
    from attnrepro.judge.decide import Look

    def decide(family, ref_dists, params, engine, max_seeds):
        print("sweep check --decide (train): 8 runs, 0 in the store")
        os.write(1, b"a worker's line\n")
        return [Look([0], [], 8, 8, 60.0)]

    monkeypatch.setattr("attnrepro.judge.check.decide", decide)
    monkeypatch.setattr("attnrepro.run.engine_settings.engine_config", lambda params: "the engine")
    relock(repo)
    rc = main(["check", "--root", str(repo), "--decide", "1", "--json"])
    out, err = capfd.readouterr()
    assert json.loads(out)["looks"][0]["runs"] == 8 and rc == 0
    assert "8 runs, 0 in the store" in err and "a worker's line" in err
    main(["check", "--root", str(repo), "--decide", "1"])
    out, err = capfd.readouterr()
    assert out.startswith("check: PASS") and "a worker's line" not in out and "a worker's line" in err


def test_the_projects_own_findings_are_counted_apart_from_the_chapters_conclusions():
    """A conclusion registered with own=True (the sensitivity sweep's pre-registered entry, QK-norm's findings): its
    own "findings" line, never in the chapter's "conclusions" count; one the reference does not reproduce is named
    under its own line."""
    from attnrepro.judge.check import Outcome, render
    from attnrepro.judge.claims import Claim, ClaimResult

    def result(experiment, cid, status, own=False):
        return ClaimResult(Claim(f"{experiment}.{cid}", experiment, "conclusion", "t", own=own), status)

    results = [result("train", "a", "pass"), result("train", "b", "pass"), result("heads", "c", "fail"),
               result("kv_cache", "d", "skipped"), result("qknorm", "e", "pass", own=True),
               result("sensitivity", "f", "fail", own=True)]
    o = Outcome([], results, {}, {}, not_reproduced=["heads.c", "sensitivity.f"])
    lines = render(o).splitlines()
    conclusions = next(i for i, line in enumerate(lines) if line.startswith("  conclusions "))
    assert lines[conclusions:conclusions + 4] == [
        "  conclusions 2 of 3 hold (the chapter's; each on most of the reference's seeds where a stage has seeds, else "
        "on this run), 1 skipped (need a GPU)",
        "              1 not reproduced, as on the reference: heads.c",
        "  findings    1 of 2 hold (this project's own, not the chapter's: d_head 32's small gap, QK-norm's, the "
        "sensitivity sweep's pre-registered one)",
        "              1 not reproduced, as on the reference: sensitivity.f"]
    o = Outcome([], results[:4], {}, {})
    assert not any(line.startswith("  findings") for line in render(o).splitlines())  # none: no line


def test_a_committed_gpu_reference_judges_the_gpu_run(repo, live, capsys):
    """A GPU run of a GPU_FILES stage (its record: device cuda, the GPU's name) is judged against the GPU reference
    the revision holds for that GPU (metrics/gpu/<slug>/, as scripts/gpu_check.sh lays it out): its GPU-only
    metrics are compared with it (here timings: shown beside it, not gated); another GPU, whose reference is
    not committed: nothing to compare with."""
    h200 = {**INTEL, "device": "cuda", "gpu_name": "NVIDIA H200"}
    dump(repo / "metrics/gpu/nvidia-h200/latency.json", {"cpu_ms": 3.0, "sdpa_peak_bytes": 4096})
    dump(repo / "metrics/gpu/nvidia-h200/env_latency.json", h200)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a GPU reference")
    live.update(h200)
    dump(repo / "metrics/env/latency.json", h200)
    dump(repo / "metrics/latency.json", {"cpu_ms": 3.0, "sdpa_peak_bytes": 4096})
    rc, out = check(repo, capsys, "--all")
    assert rc == 0, out
    row = next(line for line in out.splitlines() if line.startswith("| latency.sdpa_peak_bytes |"))
    assert row.startswith("| latency.sdpa_peak_bytes | 4096 | 4096 |"), row  # the GPU reference's value beside it
    a100 = {**h200, "gpu_name": "NVIDIA A100-SXM4-80GB"}
    live.update(a100)
    dump(repo / "metrics/env/latency.json", a100)
    rc, out = check(repo, capsys, "--all")
    row = next(line for line in out.splitlines() if line.startswith("| latency.sdpa_peak_bytes |"))
    assert rc == 0 and row.startswith("| latency.sdpa_peak_bytes | 4096 | — |"), row  # no reference to compare with
