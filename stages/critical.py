"""DVC stage `critical`: the chapter's exercises 1 and 2 (§1.20.1-1.20.2), the critical d_head.

"When attention starts to break is a property of your system, not a universal constant":
the loss gap (unscaled - scaled) and the final layer-0 entropy against d_head, over seeds,
under the train stage's protocol (params section `train`). The model family keeps the
chapter's two models at its ends: d_model is the smallest multiple of d_head that is at
least `critical.min_d_model`, n_head = d_model / d_head (d_head 32 -> 128 x 4 heads, the
small model; 64 -> 128 x 2, exercise 1; 96 -> 192 x 2; 128 -> 128 x 1; 192 -> 192 x 1;
256 -> 256 x 1, the large model). So d_model moves with d_head between the ends; the
runs at d_head 32 and 256 are the seeds stage's own (the run store shares them).

The onset, at the grid's resolution (stats.onset_interval): the interval (previous grid
point, d_head] of the first d_head whose mean gap has a 95% lower confidence bound above the
upper bound of the d_head-32 gap: seed noise sets the threshold, and the answer is never
finer than the grid. Since d_model moves with d_head here, the curve mixes two variables:
plots/critical/gap_vs_logit_std.png shows every run's gap against the unscaled logit std at
init, which depends on both (the chapter's explanation of when it breaks).

Writes metrics/critical.json (per d_head: gap and entropies with seed statistics, the
exercise-1 logit-std ratio and gap, the onset interval), plots/critical/curve.csv (per
d_head: mean, min, max) and plots/critical/per_seed.csv, plots/critical/curve.png,
plots/critical/gap_vs_logit_std.png.
"""

from __future__ import annotations

from attnrepro.experiments import critical
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.figures import critical_figure, gap_vs_logit_std_figure
from attnrepro.io import write_csv, write_json
from attnrepro.stage import Stage, stage


def main(st: Stage) -> None:
    train = st.section(TrainConfig, "train")
    cfg = st.section(critical.CriticalConfig, "critical")
    device = st.pin(train.device, train.threads, "train.device")  # the environment record states the runs' threads
    result = critical.run(train, cfg, device, st.engine)

    write_json("metrics/critical.json", result.metrics)
    write_json("metrics/env/critical.json", result.env)
    write_csv("plots/critical/curve.csv", result.curve)
    write_csv("plots/critical/per_seed.csv", result.rows)
    critical_figure(result.curve, result.metrics["onset"], "plots/critical/curve.png", len(cfg.seeds))
    chapter = {(m["d_model"] // m["n_head"], m["d_model"]): f"the chapter's {name} model"
               for name, m in train.models.items()}
    gap_vs_logit_std_figure(result.rows, "plots/critical/gap_vs_logit_std.png", chapter)
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
