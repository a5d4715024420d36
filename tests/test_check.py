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
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from attnrepro.commands.main import main
from attnrepro.stats import Band, distribution
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
CLAIMS = {"headline": ["train.unscaled.loss_final", "train.unscaled.entropy"],
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
    return rc, out.out + out.err


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


def test_the_reference_itself_passes_exactly_and_the_verdict_comes_first(repo, capsys):
    rc, out = check(repo, capsys)
    assert rc == 0
    assert out.splitlines()[0].startswith("check: PASS")
    assert "exact verdict (same machine and params as the reference): init, latency, sweep, train" in out
    assert "| train.unscaled.loss_final | 5.1 | 5.1 |" in out  # headline rows: value, reference, band


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


def test_another_machine_outside_the_seed_band_fails(repo, live, capsys):
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.9))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric train.scaled.loss_final = 3.9 is outside the reference band" in out


def test_bands_are_family_wise_so_a_rerun_that_moves_a_few_sd_passes(repo, live, capsys):
    """Measured here: the same seed on another CPU moved single metrics by up to 4 seed sd, so each
    band is the prediction interval at alpha 0.05 / (metrics in its family), Bonferroni."""
    from attnrepro.stats import Band

    another_machine(repo, live)
    d = Band.of([v["scaled"]["entropy"] for v in SEEDS.values()], log=True)
    edit(repo, "train", lambda m: m["scaled"].__setitem__("entropy", math.exp(d.mean + 4.5 * d.sd)))
    rc, out = check(repo, capsys)
    assert rc == 0, out  # 4.5 sd: outside the uncorrected 3.04 sd, inside the family-wise band


def test_collapsed_entropy_is_judged_on_the_log_scale(repo, live, capsys):
    """x10 on a value near zero is far outside; an absolute tolerance of 0.02 would have let it pass."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", d["unscaled"]["entropy"] * 10))
    rc, out = check(repo, capsys)
    assert rc == 1 and "train.unscaled.entropy" in out and "outside the reference band" in out


def test_tampered_loss_fails_the_recomputed_conclusion(repo, live, capsys):
    """Setting the unscaled loss to the scaled one breaks the conclusion, whatever a stored field says."""
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", d["scaled"]["loss_final"]))
    rc, out = check(repo, capsys)
    assert rc == 1 and "conclusion train.unscaled_worse fails" in out


def test_a_conclusion_that_fails_on_one_reference_seed_fails(repo, capsys):
    seeds = json.loads(json.dumps(SEEDS))
    seeds["3"]["unscaled"]["entropy"] = 0.02
    dump(repo / "metrics/dist/train.json", distribution({int(k): v for k, v in seeds.items()}))
    relock(repo)
    git(repo, "commit", "-qam", "a reference with one seed that does not collapse")
    rc, out = check(repo, capsys, "--mode", "statistical")
    assert rc == 1 and "conclusion train.collapse fails" in out and "holds on 4 of 5 seeds" in out


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
    assert rc == 0 and "1 timings and 0 informational metrics not gated" in out and "latency.cpu_ms" not in out
    rc, out = check(repo, capsys, "--all")
    assert "| latency.cpu_ms | 30 | 3 |" in out


def test_other_params_make_the_verdict_statistical(repo, capsys):
    (repo / "params.yaml").write_text(yaml.safe_dump({"train": {"lr": 0.001, "seed": 0}, "init": {"seed": 0}}),
                                      encoding="utf-8")
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.72))
    rc, out = check(repo, capsys)
    assert rc == 0 and "statistical verdict (other params (train)): train" in out
    assert "exact verdict (same machine and params as the reference): init, latency, sweep" in out


def shifted(by, seeds=None) -> dict:
    """The reference's seeds with scaled.loss_final moved by by(seed), renamed to `seeds` if given."""
    out = {}
    for i, (s, v) in enumerate(SEEDS.items()):
        v = json.loads(json.dumps(v))
        v["scaled"]["loss_final"] += by(s)
        out[seeds[i] if seeds else s] = v
    return out


def test_a_multi_seed_rerun_is_judged_by_welch(repo, live, capsys):
    another_machine(repo, live)
    others = [11, 12, 13, 14, 15]  # none of the reference's seeds: nothing to pair
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.001, others)))
    assert check(repo, capsys)[0] == 0
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.1, others)))
    rc, out = check(repo, capsys)
    assert rc == 1 and "train.scaled.loss_final: this run's seeds differ from the reference's (Welch p =" in out
    near = shifted(lambda s: 0.001)
    # seeds of its own do not exempt the run itself from the band
    dump(repo / "metrics/dist/train.json", distribution(near))
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 99.0))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric train.scaled.loss_final = 99 is outside the reference band" in out


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
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.1)))
    rc, out = check(repo, capsys, "--made-on", "an AMD machine")
    assert rc == 1 and "train.scaled.loss_final: this run's seeds differ from the reference's" in out
    assert "train: judged exactly, and its seeds, remade by the seeds stage, against the reference's" in out
    # the metrics file stays exact: its last digit moved is a difference, whatever the seeds say
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.0)))
    assert check(repo, capsys, "--made-on", "an AMD machine")[0] == 0
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.7000001))
    rc, out = check(repo, capsys, "--made-on", "an AMD machine")
    assert rc == 1 and "metric train.scaled.loss_final = 3.7 drifted from 3.7 (exact)" in out


def test_a_rerun_at_the_reference_seeds_is_paired_by_seed(repo, live, capsys):
    """0.6 seed sd, the same on every seed but for float-order jitter: hidden in the spread of the seeds
    from Welch, plain to the paired test, which the check uses where the reference measured the metric's
    drift between float orders small enough; a consistent shift under a tenth of a seed sd is no finding."""
    another_machine(repo, live)
    shift = lambda s: 0.01 + 0.0005 * (-1) ** s  # noqa: E731 - the seed sd of scaled.loss_final is 0.0158
    dump(repo / "metrics/dist/train.json", distribution(shifted(shift)))
    assert check(repo, capsys)[0] == 0  # no drift measured: Welch, p 0.35
    dump(repo / "docs/float_order.json", {"ratio": {"train.scaled.loss_final": 0.05}})
    git(repo, "add", "docs/float_order.json")
    git(repo, "commit", "-qm", "the float-order profile")
    dump(repo / "metrics/dist/train.json", distribution(shifted(shift, [11, 12, 13, 14, 15])))
    assert check(repo, capsys)[0] == 0  # other seeds: nothing to pair, Welch
    dump(repo / "metrics/dist/train.json", distribution(shifted(shift)))
    rc, out = check(repo, capsys)
    assert rc == 1 and ("train.scaled.loss_final: this run's seeds differ from the reference's (paired t-test at "
                        "the reference's seeds p =") in out
    dump(repo / "metrics/dist/train.json", distribution(shifted(lambda s: 0.001)))  # 0.06 sd on every seed
    rc, out = check(repo, capsys)
    assert rc == 0, out
    # a metric whose seeds training scrambles (drift as large as the seeds' spread): Welch, the stronger there
    dump(repo / "docs/float_order.json", {"ratio": {"train.scaled.loss_final": 1.4}})
    git(repo, "add", "docs/float_order.json")
    git(repo, "commit", "-qm", "a chaotic metric")
    dump(repo / "metrics/dist/train.json", distribution(shifted(shift)))
    rc, out = check(repo, capsys)
    assert rc == 0, out


def test_the_seeds_of_a_metric_on_its_float_order_tolerance_are_tested_on_the_log_scale(repo, live, capsys):
    """unscaled.entropy (log scale; seed log sd 0.41) drifts 0.005 sd between float orders: held to 0.1 sd
    in one run, and its seeds paired with the reference's, below MIN_PAIRS shared seeds by Welch."""
    dump(repo / "docs/float_order.json", {"ratio": {"train.unscaled.entropy": 0.005}})
    git(repo, "add", "docs/float_order.json")
    git(repo, "commit", "-qm", "the float-order profile")
    another_machine(repo, live)

    def entropy_times(factor, seeds=None):
        out = {}
        for i, (s, v) in enumerate(SEEDS.items()):
            v = json.loads(json.dumps(v))
            v["unscaled"]["entropy"] *= factor
            out[seeds[i] if seeds else s] = v
        return distribution(out)

    dump(repo / "metrics/dist/train.json", entropy_times(1.2))  # 0.44 seed sd on every seed
    rc, out = check(repo, capsys)
    assert rc == 1 and ("train.unscaled.entropy: this run's seeds differ from the reference's (paired t-test at "
                        "the reference's seeds p =") in out
    dump(repo / "metrics/dist/train.json", entropy_times(1.02))  # 0.05 seed sd: under the margin
    assert check(repo, capsys)[0] == 0
    dump(repo / "metrics/dist/train.json", entropy_times(1.2, [0, 1, 12, 13, 14]))  # 2 pairs: Welch, too weak
    rc, out = check(repo, capsys, "--all")
    assert rc == 0 and "| train.unscaled.entropy | 0.0004 | 0.0004 |" in out and "+welch" in out


def test_the_paired_test_is_chosen_where_it_detects_less_than_welch():
    from attnrepro.judge.check import paired_shift, welch_shift

    from scipy.stats import t

    df = 0.3 ** 2 / (0.2 ** 2 / 4 + 0.1 ** 2 / 9)  # Welch-Satterthwaite, 5 and 10 seeds of equal sd
    assert welch_shift(5, 10, 0.05) == pytest.approx(t.ppf(0.975, df) * 0.3 ** 0.5, rel=1e-9)
    # the margin: the drift measured on one seed, at least 0.1 seed sd
    assert paired_shift(5, 0.5, 0.05) == pytest.approx(0.5 + t.ppf(0.975, 4) * 0.5 / 5 ** 0.5, rel=1e-9)
    assert paired_shift(5, 0.02, 0.05) == pytest.approx(0.1 + t.ppf(0.975, 4) * 0.02 / 5 ** 0.5, rel=1e-9)
    assert paired_shift(5, 0.133, 0.05 / 300) < welch_shift(5, 10, 0.05 / 300)  # a weight norm: paired
    assert paired_shift(5, 1.4, 0.05 / 300) > welch_shift(5, 10, 0.05 / 300)  # a scrambled metric: Welch


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


def test_float_order_tolerance_holds_a_rerun_of_the_same_run_far_tighter_than_the_seed_band(repo, live, capsys):
    """docs/float_order.json at the reference says the same seed drifts < 0.01 seed sd between float orders:
    a rerun on another machine must then land within 0.1 seed sd of the reference run (issue 18, 5a)."""
    dump(repo / "docs/float_order.json", {"ratio": {"train.scaled.loss_final": 0.002, "train.unscaled.loss_final": 0.5}})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "float-order profile")
    sd = Band.of([SEEDS[s]["scaled"]["loss_final"] for s in SEEDS]).sd  # 0.0158
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.70 + 0.05 * sd))
    rc, out = check(repo, capsys)
    assert rc == 0, out
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", 3.70 + 0.5 * sd))  # inside the seed band
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric train.scaled.loss_final" in out and "float order: within ±0.00158 (0.1 seed sd)" in out
    dump(repo / "docs/float_order.json", {"ratio": {}})  # the run's tree drops the tolerance: named, not used
    rc, out = check(repo, capsys)
    assert rc == 1 and "docs/float_order.json differs from HEAD's (its float-order tolerances)" in out, out
    # a metric that drifts more between float orders keeps its seed band; other params: another run, the band again
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("loss_final", 5.13))
    (repo / "params.yaml").write_text(yaml.safe_dump({"train": {"lr": 0.003, "seed": 1}, "init": {"seed": 0}}),
                                      encoding="utf-8")
    rc, out = check(repo, capsys)
    assert rc == 0 and "float order" not in out, out


def test_float_order_tolerance_of_a_log_scale_metric_is_a_factor(repo, live, capsys):
    """A collapsed entropy is judged on the log scale: the float-order tolerance is a factor of the reference run's."""
    dump(repo / "docs/float_order.json", {"ratio": {"train.unscaled.entropy": 0.002}})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "float-order profile")
    log_sd = Band.of([math.log(SEEDS[s]["unscaled"]["entropy"]) for s in SEEDS]).sd  # 0.415
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", 0.0004 * math.exp(0.05 * log_sd)))
    rc, out = check(repo, capsys)
    assert rc == 0, out
    edit(repo, "train", lambda d: d["unscaled"].__setitem__("entropy", 0.0004 * math.exp(0.5 * log_sd)))
    rc, out = check(repo, capsys)  # inside the seed band, 5 float-order tolerances away
    assert rc == 1 and "metric train.unscaled.entropy" in out
    assert f"float order: within ×{math.exp(0.1 * log_sd):.4g} (0.1 seed sd, log scale)" in out


def test_the_paired_test_is_a_minimum_effect_test():
    from scipy import stats as sp

    from attnrepro.judge.check import paired_shift_p
    from attnrepro.stats import paired_t_p

    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [1.3, 2.1, 3.6, 4.2, 5.9]
    assert paired_shift_p(a, b, 0.0) == pytest.approx(paired_t_p(a, b), rel=1e-12)
    # with a margin: twice the one-sided p of the mean difference beyond it, whichever its sign
    one_sided = sp.ttest_1samp([y - x for x, y in zip(a, b)], 0.1, alternative="greater").pvalue
    assert paired_shift_p(a, b, 0.1) == pytest.approx(2 * one_sided, rel=1e-9)
    assert paired_shift_p(b, a, 0.1) == pytest.approx(2 * one_sided, rel=1e-9)
    assert paired_shift_p(a, b, 1.0) == 1.0  # a mean shift of 0.42 inside a margin of 1
    x = [1.0, 2.0, 3.0, 4.0]
    assert paired_shift_p(x, [v + 0.5 for v in x], 0.0) == 0.0  # a consistent shift: no spread at all
    assert paired_shift_p(x, [v + 0.5 for v in x], 0.6) == 1.0  # ... under the margin: no finding


def test_detectable_shifts_follow_the_prediction_interval_welch_and_the_float_order_tolerance():
    from attnrepro.judge.check import detectable_shifts

    dists = {"train": distribution(SEEDS)}  # n = 5
    rows = {r["metric"]: r for r in detectable_shifts(dists, ["train.scaled.loss_final"],
                                                      {"train.unscaled.loss_final": 0.003,
                                                       "train.scaled.loss_final": 0.5})}
    head = rows["train.scaled.loss_final"]  # a family of one: alpha 0.05
    assert head["one_seed_sd"] == pytest.approx(2.7764 * (1 + 1 / 5) ** 0.5, rel=1e-4)
    assert head["five_seeds_sd"] == pytest.approx(2.3060 * (2 / 5) ** 0.5, rel=1e-4)  # Welch df 8
    # at the reference's seeds: paired (margin 0.5 + t(0.975, 4) 0.5 / sqrt 5 = 1.12) where below Welch's 1.46
    assert head["five_reference_seeds_sd"] == pytest.approx(0.5 + 2.7764 * 0.5 / 5 ** 0.5, rel=1e-4) and head["paired"]
    entropy = rows["train.unscaled.entropy"]  # no drift measured: Welch
    assert entropy["five_reference_seeds_sd"] == entropy["five_seeds_sd"] and not entropy["paired"]
    tight = rows["train.unscaled.loss_final"]
    assert tight["one_seed_sd"] == 0.1 and tight["paired"] and 0.1 < tight["five_reference_seeds_sd"] < 0.12
    others = [r for r in rows.values() if not r["headline"] and not r["float_order"]]
    assert others and all(r["one_seed_sd"] > head["one_seed_sd"] for r in others)  # a larger family: stricter
    assert "train.scaled.params" not in rows  # no spread: not banded


def test_a_sweep_mean_that_a_conclusion_reads_is_gated_by_welch(repo, live, capsys):
    """Sweep summaries are informational, except those a gated conclusion reads (issue 18, 5c)."""
    dump(repo / "metrics/sweep.json", {"seeds": 3, "gap": 0.2, "cell": {"mean": 0.5, "sd": 0.05, "min": 0.45,
                                                                        "max": 0.55}})
    claims = CONCLUSIONS + [("sweep", "conclusion", "cell_positive", "the cell's gap is positive",
                                     'm["sweep.cell.min"] > 0')]
    (repo / "src/attnrepro/judge/conclusions.py").write_text(predicates(*claims), encoding="utf-8")
    relock(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a sweep cell and its conclusion")
    another_machine(repo, live)
    edit(repo, "sweep", lambda d: d["cell"].update(mean=0.56, min=0.5))  # within its seeds' noise
    rc, out = check(repo, capsys)
    assert rc == 0 and "1 sweep means read by a conclusion" in out, out
    edit(repo, "sweep", lambda d: d["cell"].update(mean=0.9, min=0.85, max=0.95))  # the conclusion still holds
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric sweep.cell.mean: this run's seeds differ from the reference's (Welch p" in out, out
    edit(repo, "sweep", lambda d: d.update(gap=5.0))  # read by no conclusion: still informational
    edit(repo, "sweep", lambda d: d["cell"].update(mean=0.5, min=0.45, max=0.55))
    assert check(repo, capsys)[0] == 0


def test_a_seed_distribution_is_judged_in_the_mode_of_the_stage_that_writes_it(repo):
    from attnrepro.judge.check import dist_producers

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
def test_a_metric_that_is_not_a_number_fails_statistically(repo, live, capsys, bad):
    another_machine(repo, live)
    edit(repo, "train", lambda d: d["scaled"].__setitem__("loss_final", bad))
    rc, out = check(repo, capsys)
    assert rc == 1 and "metric train.scaled.loss_final" in out and "is outside the reference band" in out


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
    dump(repo / "metrics/claims.json", {"train.collapse": {"pass": 0, "skipped": 0}})
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
