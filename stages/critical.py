"""DVC stage `critical`: the chapter's exercises 1 and 2 (§1.20.1-1.20.2), the critical width.

"When attention starts to break is a property of your system, not a universal constant":
the loss gap (unscaled - scaled), each arm's final loss and the final layer-0 and layer-1
entropies against the width, over seeds, under the train stage's protocol (params section
`train`). Two designs, one sweep; docs/CRITICAL.md argues them and what they cost:

  one variable (critical.one_variable): the large model (d_model 256, 1 head, value width
  256) with only its per-head q/k width d_qk moving (params: 8 to 256): the d_k of
  1/sqrt(d_k), nothing else. 5 paired seeds; its d_qk-256 runs are the seeds stage's
  own d_head-256 runs (the run store shares them). Each arm's seeds at each d_qk are tested
  for two modes (stats.find_modes), as the seeds stage tests its variants.
  mixed width (critical.d_heads, min_d_model, seeds): d_model = the smallest multiple of
  d_head >= 128 and n_head = d_model / d_head, so d_model and n_head move with d_head (the
  chapter's suggested grid; exercise 1 is its d_head-64 point). Labelled as such.

Each curve read as it is (critical.reading; docs/CRITICAL.md, "Reading the curve"): the paired
onset (the first grid point whose gap exceeds the first point's by a one-sided paired t-test, Holm
over the grid; never finer than the grid), the shape after it and the trends per doubling of the
gap and of each arm's loss; the earlier, unpaired onset (stats.onset_interval) is kept beside
it. plots/critical/gap_vs_logit_std.png shows every
seed's gap against the unscaled logit std at init for both designs, with the chapter's two
models (its train.variants at the one-variable seeds) as separate reference points.

Writes metrics/critical.json (the mixed-width curve at the top level, the one-variable curve
under d_qk: per point the gap, both arms' metrics with seed statistics and modes; the onsets
and each curve's reading; exercise 1), plots/critical/curve.csv and per_seed.csv (mixed width), qk_curve.csv and
qk_per_seed.csv (one variable), references.csv (the chapter's models per seed),
plots/critical/curve.png and plots/critical/gap_vs_logit_std.png.
"""

from __future__ import annotations

from attnrepro.experiments import critical
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.figures import critical_figure, gap_vs_logit_std_figure
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    train = st.section(TrainConfig, "train")
    cfg = st.section(critical.CriticalConfig, "critical")
    device = st.pin(train.device, train.threads, "train.device")  # the environment record states the runs' threads
    result = critical.run(train, cfg, device, st.engine)

    write_json("metrics/critical.json", result.metrics)
    write_json("metrics/env/critical.json", result.env)
    write_csv("plots/critical/curve.csv", result.curve)
    write_csv("plots/critical/per_seed.csv", result.rows)
    write_csv("plots/critical/qk_curve.csv", result.qk_curve)
    write_csv("plots/critical/qk_per_seed.csv", result.qk_rows)
    write_csv("plots/critical/references.csv", result.references)
    q = result.metrics["d_qk"]
    qk_title = (f"ONE VARIABLE ({q['seeds']} seeds): the {q['model']} model, d_model {q['d_model']}, "
                f"{q['n_head']} head, v width {q['d_head']}; only d_qk moves")
    critical_figure(result.qk_curve, q["reading"]["paired_onset"], qk_title, result.curve,
                    result.metrics["reading"]["paired_onset"],
                    "plots/critical/curve.png", len(cfg.seeds), sorted({r["d_model"] for r in result.rows}))
    designs = {f"one variable: d_qk at d_model {q['d_model']}, {q['n_head']} head": ("d_qk", result.qk_rows),
               "mixed width: d_head with d_model, n_head moving": ("d_head", result.rows)}
    gap_vs_logit_std_figure(designs, result.references, "plots/critical/gap_vs_logit_std.png")
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
