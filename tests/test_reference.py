"""The committed reference run, as CI sees it on a fresh clone.

- metrics/claims.json and claims_summary.json equal a fresh evaluation of claims.yaml on
  the committed metrics; every checksum holds, and every conclusion that does not is listed
  in REPORT.md as not reproduced;
- tampering with copies of the committed metrics is caught by `attnrepro check` in its
  statistical mode (the verdict a run from another machine gets: a primary endpoint moved far beyond its
  margin, a checksum broken; a conclusion the run alone breaks or starts to hold is named, as one run cannot
  move its share), and a change inside the seed band is not.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from pathlib import Path

import pytest

from attnrepro.judge.claims import claims_json, counts, evaluate_all, kind, load, load_json_dir, load_metrics_dir
from attnrepro.commands.main import main
from attnrepro.stats import from_summary
from test_check_lock import relock

REPO = Path(__file__).resolve().parents[1]


def evaluate():
    m = REPO / "metrics"
    return evaluate_all(load(REPO / "claims.yaml"), load_metrics_dir(m), load_json_dir(m / "dist"), load_json_dir(m / "env"))


def test_committed_claims_equal_a_fresh_evaluation():
    results = evaluate()
    committed = json.loads((REPO / "metrics/claims.json").read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(claims_json(results)))
    assert committed.keys() == fresh.keys()
    for k in fresh:
        for field, v in fresh[k].items():
            expected = pytest.approx(v, rel=1e-5) if isinstance(v, (int, float)) else v
            assert committed[k][field] == expected, (k, field)
    summary = json.loads((REPO / "metrics/claims_summary.json").read_text(encoding="utf-8"))
    assert summary == {k: v for k, v in counts(results).items()}


def test_every_checksum_holds_and_each_failing_conclusion_is_reported_not_reproduced():
    results = evaluate()
    assert not [(r.claim.id, r.detail) for r in results if r.claim.cls == "checksum" and r.gated_failure]
    report = (REPO / "report/REPORT.md").read_text(encoding="utf-8")
    listed = report.split("**Not reproduced, and why**", 1)[1].split("\n\n", 2)[1] if "**Not reproduced" in report else ""
    failing = [r.claim.id for r in results if kind(r.claim) == "conclusion" and r.gated_failure]
    assert all(f"`{c}`" in listed for c in failing) and listed.count("\n- ") + listed.startswith("- ") == len(failing)


@pytest.fixture
def reference(tmp_path, monkeypatch) -> Path:
    """A git repository holding a copy of the committed reference (metrics, params, claims and their
    predicates, dvc.yaml as HEAD has them, and a dvc.lock recording them); the check runs on the machine the
    reference was made on."""
    root = tmp_path / "ref"
    root.mkdir()
    # the committed files (git archive HEAD), not the working tree's: a faithful rerun on another machine
    # changes metrics/ there, and these tests are about the reference as committed
    files = ["claims.yaml", "params.yaml", "dvc.yaml", "src/attnrepro/judge/conclusions.py", "metrics"]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", *files], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    relock(root)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "reference"]):
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True)
    made_on = json.loads((root / "metrics/env/train.json").read_text(encoding="utf-8"))
    monkeypatch.setattr("attnrepro.judge.check.live_environment", lambda device: made_on)
    return root


def tamper(root: Path, variant: str, key: str, fn) -> None:
    p = root / "metrics" / "train.json"
    data = json.loads(p.read_text(encoding="utf-8"))
    data[variant][key] = fn(data)
    data["comparison"] = _comparison(root, data)  # as a run would write it: the gaps of its own losses
    p.write_text(json.dumps(data, indent=2), encoding="utf-8")
    rejudge(root)


def rejudge(root: Path) -> None:
    """metrics/claims.json, claims_summary.json and headline.json made again, as `dvc repro` remakes them after a
    stage's metrics moved (the report and headline stages' functions)."""
    from attnrepro.files import write_json
    from attnrepro.judge.claims import claims_json, counts, evaluate_all, load, load_json_dir, load_metrics_dir
    from attnrepro.report.headline_metrics import headline_of

    m = root / "metrics"
    results = evaluate_all(load(root / "claims.yaml"), load_metrics_dir(m), load_json_dir(m / "dist"),
                           load_json_dir(m / "env"))
    write_json(m / "claims.json", claims_json(results))
    write_json(m / "claims_summary.json", counts(results))
    write_json(m / "headline.json", headline_of(root / "claims.yaml", m))


def _comparison(root: Path, metrics: dict) -> dict:
    from attnrepro.config import from_dict
    from attnrepro.experiments.comparison import comparison, pairs_by_dhead
    from attnrepro.experiments.protocol import TrainConfig
    from attnrepro.files import json_ready, read_params

    cfg = from_dict(TrainConfig, read_params(root / "params.yaml")["train"], prefix="train")
    return json_ready(comparison(metrics, pairs_by_dhead(cfg)))


def check(root: Path, capsys) -> tuple[int, str]:
    relock(root)  # the tampered metrics as a run would record them: the check's other gates must catch it
    rc = main(["check", "--root", str(root), "--mode", "statistical"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_reference_passes_its_own_statistical_check(reference, capsys):
    rc, out = check(reference, capsys)
    assert rc == 0, out


def test_heads_judged_statistically_beside_their_seeds_judged_exactly(reference, capsys):
    """heads rerun under another float order (2 threads), its seeds (the seeds stage's) not: the heads are renamed
    by role for their bands, and the seed distribution is compared as written, equal to the reference's (compared
    renamed, it was a difference the renaming made, failing every such rerun)."""
    p = reference / "metrics/env/heads.json"
    p.write_text(json.dumps({**json.loads(p.read_text(encoding="utf-8")), "torch_threads": 2}), encoding="utf-8")
    relock(reference)
    rc = main(["check", "--root", str(reference)])
    out = capsys.readouterr().out
    assert "statistical verdict (another machine (torch_threads: 1 -> 2)): heads" in out, out
    assert rc == 0 and "dist/heads" not in out, out


def test_tamper_unscaled_loss_to_scaled_fails_the_endpoint_and_names_the_conclusion(reference, capsys):
    """The gap at d_head 256 is gone on this run: its endpoint is DIFFERENT; the conclusion that the gap grows
    does not hold on it, which one run cannot show of a share: named, the reference seeds' verdict kept."""
    tamper(reference, "d256_unscaled", "loss_final", lambda d: d["d256_scaled"]["loss_final"])
    tamper(reference, "comparison", "gap_d256_loss_final", lambda d: 0.0)
    rc, out = check(reference, capsys)
    assert rc == 1 and "- primary endpoint train.comparison.gap_d256_loss_final: DIFFERENT from the reference" in out, out
    assert "conclusion train.gap_grows_with_dhead fails" not in out
    assert "this run's own outcome differs on train.gap_grows_with_dhead (does not hold on this run;" in out, out


def test_tamper_collapsed_entropy_far_beyond_the_seeds_fails(reference, capsys):
    """The collapse at step 222 is a primary endpoint (claims.yaml: the unscaled over the scaled model's entropy,
    margin ×4.1, judged on the log scale): the unscaled entropy at a hundred times the reference seeds' geometric
    mean, beyond the ×24 that one rerun seed detects with 80% power (the report's "Verdict power"), is DIFFERENT
    from the reference's seeds, whether or not a conclusion also fails."""
    collapse = "train.d256_unscaled.entropy_step222 / train.d256_scaled.entropy_step222"
    assert {e.metric: e.text for e in load(reference / "claims.yaml").primary}.get(collapse) == "×4.1"
    runs = json.loads((reference / "metrics/dist/train.json").read_text(encoding="utf-8"))["runs"]
    mean = math.exp(statistics.fmean(math.log(r["d256_unscaled"]["entropy_step222"]) for r in runs.values()))
    tamper(reference, "d256_unscaled", "entropy_step222", lambda d: 100 * mean)
    rc, out = check(reference, capsys)
    assert rc == 1 and "beyond its margin ×4.1" in out, out
    assert f"- primary endpoint {collapse}: DIFFERENT from the reference, shift ×" in out


def test_a_change_inside_the_seed_band_passes(reference, capsys):
    stats = json.loads((reference / "metrics/dist/train.json").read_text(encoding="utf-8"))["stats"]
    b = from_summary(stats["d256_scaled.loss_final"])
    lo, hi = b.prediction_interval()
    tamper(reference, "d256_scaled", "loss_final", lambda d: (d["d256_scaled"]["loss_final"] + hi) / 2)
    rc, out = check(reference, capsys)
    assert rc == 0, out


def test_parameter_count_plus_one_fails(reference, capsys):
    tamper(reference, "d32_scaled", "params", lambda d: d["d32_scaled"]["params"] + 1)
    rc, out = check(reference, capsys)
    assert rc == 1 and "checksum train.params.d32_scaled.params fails" in out
    # the same on every seed, so no band: judged exactly at full precision (the distribution's
    # summary keeps 6 significant digits, 1,376,256 reads 1.37626e6 there)
    n = json.loads((REPO / "metrics/train.json").read_text(encoding="utf-8"))["d32_scaled"]["params"]
    assert f"metric train.d32_scaled.params = {n + 1:,} drifted from {n:,} (exact)" in out, out


def test_a_conclusion_the_reference_does_not_reproduce_holding_on_one_run_is_named(reference, capsys):
    """The chapter's four orders of magnitude are not reproduced here; a run on which the Jacobian falls 10^5-fold
    holds the conclusion, but one run judged statistically cannot move a share: named, not gated (the reference
    seeds' 0 of 10 kept; a seed distribution edited in the working tree is never read). The fall is a primary
    endpoint too: 10^5 against the reference's 10^2.3 lies past its ×7.8 margin, DIFFERENT, and that fails."""
    claims = json.loads((reference / "metrics/claims.json").read_text(encoding="utf-8"))
    assert claims["train.d256_jacobian_vanishes"]["pass"] == 0  # the chapter's four orders: not reproduced here
    rc, out = check(reference, capsys)
    assert rc == 0 and "not reproduced, as on the reference: " in out and "train.d256_jacobian_vanishes" in out
    assert "differs on train.d256_jacobian_vanishes" not in out, out
    for f in ("metrics/train.json", "metrics/dist/train.json"):  # the Jacobian now falls 10^5-fold on every seed
        p = reference / f
        data = json.loads(p.read_text(encoding="utf-8"))
        for run in ([data] if f.endswith("/train.json") and "dist" not in f else data["runs"].values()):
            u = run["d256_unscaled"]
            u["jacobian_fro_step1480"] = u["jacobian_fro_step0"] * 1e-5
        if "stats" in data:  # and the seed mean the conclusion is evaluated on
            data["stats"]["d256_unscaled.jacobian_fro_step1480"]["mean"] = 3e-6
        p.write_text(json.dumps(data), encoding="utf-8")
    rejudge(reference)
    rc, out = check(reference, capsys)
    assert rc == 1 and "holds on this run, but not on the reference" not in out, out
    assert "- primary endpoint train.d256_unscaled.jacobian_fro_step1480 / train.d256_unscaled.jacobian_fro_step0: " \
           "DIFFERENT" in out, out
    assert "this run's own outcome differs on " in out, out
    assert "train.d256_jacobian_vanishes (holds on this run; the reference's seeds: 0 of 10 seeds" in out, out


def test_after_a_run_that_remade_seeds_the_check_counts_what_the_report_counts(reference, capsys):
    """Issue 66: a default run on another CPU rewrites metrics/dist/failures.json (the failures stage's seeds); the
    report counts the published values on the working tree's seeds, and the check, judging that run, on the same
    seeds (its conclusions keep the reference's seeds: one run's seed files never move one; test_check_tamper)."""
    from attnrepro.report.assemble import build
    from attnrepro.stats import distribution

    p = reference / "metrics/dist/failures.json"
    dist = json.loads(p.read_text(encoding="utf-8"))
    published = {c.metric: c.published for c in load(reference / "claims.yaml").claims
                 if c.id.startswith("failures.symptoms.") and isinstance(c.published, float)}
    for i, run in enumerate(dist["runs"].values()):  # seeds that now sit on the chapter's table
        for key, value in published.items():
            variant, metric = key.split(".")[1:]
            run[variant][metric] = value * (1 + 0.01 * i)
    p.write_text(json.dumps(distribution({int(s): r for s, r in dist["runs"].items()})), encoding="utf-8")
    relock(reference)
    rc = main(["check", "--root", str(reference), "--mode", "statistical", "--json"])
    checked = json.loads(capsys.readouterr().out)["claims"]
    reported = counts(build(reference / "claims.yaml", reference / "metrics", reference / "plots", pairs=[]).results)
    assert checked == reported, (checked, reported)
    assert reported != json.loads((reference / "metrics/claims_summary.json").read_text(encoding="utf-8"))
    assert rc in (0, 1)
