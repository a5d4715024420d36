"""Benchmark: would pairing seeds decide the primary endpoints sooner? (issue 42's matrix, read again)

`attnrepro check --decide` compares a rerun's seeds with the reference's as two samples. A rerun at
seed s starts from the same initialisation and batches as the reference's seed s, so the two could be
paired: the error would come from the sd of the n differences (n - 1 degrees of freedom) instead of
both samples' spread. This reads the train runs that `benchmarks/gate_power.py --decide` left in
.gate_power_stores/ (training nothing) and judges each case's 12 train endpoints at its first 3, 5 and
10 seeds both ways, at --decide's alpha per look with Holm over those 12 (the judge's own family has
the failures table's 3 more: a sketch of the design, not the verdict). Writes
benchmarks/results/paired_seeds.json.

    python benchmarks/paired_seeds.py [--rev 112d461] [--cases avx2,adam_default_betas,...]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from scipy.stats import ttest_1samp

import gate_power  # beside this script
from attnrepro.experiments.comparison import comparison, pairs_by_dhead
from attnrepro.judge import endpoints
from attnrepro.judge.revision import Revision
from attnrepro.provenance.records import run_config
from attnrepro.stats import ALPHA, LOOKS, flatten, holm_adjusted

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "paired_seeds.json"


def case_runs(case, rev: str, params: dict, seeds: list[int]) -> dict[int, dict]:
    """{seed: train's flat metrics at that seed} for the seeds whose four runs the case's --decide store holds,
    found by their labels ("d32_scaled seed 3"): a case that changes the corpus has other run keys."""
    cfg = run_config(params, "train")
    by_label = {}
    for spec in gate_power.case_store(case, rev, "decide").glob("*/*/spec.json"):
        if (spec.parent / "summary.json").is_file():
            by_label[json.loads(spec.read_text())["label"]] = json.loads((spec.parent / "summary.json").read_text())
    out = {}
    for s in seeds:
        m = {v: by_label.get(f"{v} seed {s}") for v in cfg.variants}
        if all(m.values()):
            m["comparison"] = comparison(m, pairs_by_dhead(cfg))
            out[s] = flatten(m, "train.")
    return out


def paired_answers(family, ref: dict[int, dict], run: dict[int, dict], alpha: float) -> dict[str, int]:
    """SAME and DIFFERENT counts when each endpoint's shift is the mean of the paired differences: one-sample
    t tests against the margin's nearer edge (TOST for SAME, beyond it for DIFFERENT), Holm over the family."""
    p_same, p_diff = [], []
    for e in family:
        f = math.log if e.log else float
        d = [f(run[s][e.metric]) - f(ref[s][e.metric]) for s in run]
        edge = math.copysign(e.margin, sum(d))
        inside, beyond = ("less", "greater") if edge > 0 else ("greater", "less")
        p_same.append(float(ttest_1samp(d, edge, alternative=inside).pvalue))
        p_diff.append(float(ttest_1samp(d, edge, alternative=beyond).pvalue))
    return {"SAME": sum(p < alpha for p in holm_adjusted(p_same)),
            "DIFFERENT": sum(p < alpha for p in holm_adjusted(p_diff))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="112d461", help="the reference revision the matrix ran against")
    ap.add_argument("--cases", default="", help="comma-separated (default: every case with a --decide store)")
    args = ap.parse_args(argv)
    rev = Revision(args.rev, ROOT)
    params, dist = rev.yaml("params.yaml"), rev.json("metrics/dist/train.json")
    family = [e for e in rev.expectations("claims.yaml").primary if e.metric.startswith("train.")]
    seeds = [int(s) for s in dist["seeds"]]
    ref = {int(s): flatten(m, "train.") for s, m in dist["runs"].items()}
    reference = {e.metric: [ref[s][e.metric] for s in seeds] for e in family}
    names = args.cases.split(",") if args.cases else [c for c in gate_power.CASES
                                                      if gate_power.case_store(gate_power.CASES[c], args.rev,
                                                                               "decide").is_dir()]
    alpha = ALPHA / len(LOOKS)
    rows = []
    for name in names:
        runs = case_runs(gate_power.CASES[name], args.rev, params, seeds)
        for n in (3, 5, 10):
            at = {s: runs[s] for s in seeds[:n] if s in runs}
            if len(at) < n:
                continue
            two = endpoints.summary(endpoints.judge(family, reference, {e.metric: [m[e.metric] for m in at.values()]
                                                                        for e in family}, looks=len(LOOKS)))
            rows.append({"case": name, "expect": gate_power.CASES[name].expect, "seeds": n,
                         "two_samples": {k: two[k] for k in ("SAME", "DIFFERENT")},
                         "paired": paired_answers(family, ref, at, alpha)})
            r = rows[-1]
            print(f"{name:22s} {r['expect']:9s} {n:2d} seeds: two samples {two['SAME']:2d} SAME {two['DIFFERENT']} "
                  f"DIFFERENT; paired {r['paired']['SAME']:2d} SAME {r['paired']['DIFFERENT']} DIFFERENT "
                  f"(of {len(family)})")
    OUT.write_text(json.dumps({"rev": rev.commit, "endpoints": [e.metric for e in family], "alpha_per_look": alpha,
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
