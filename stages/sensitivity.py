"""DVC stage `sensitivity`: which unstated choice accounts for which deviation from the chapter?

Only settings docs/PROTOCOL.md marks unstated are varied: the weight-decay value, the validation
split's position, and for the failures table only (its run settings are unstated, the case's are
stated) its schedule, block size and init. Each choice of `sensitivity.choices` (and each
combination of `sensitivity.combinations`) changes the baseline, the protocol as params state it
(`train`, `failures`), and is trained at every seed of `sensitivity.seeds` for every variant of
`sensitivity.metrics` its scope covers: train variants, and the failures table's models as
`failures_<variant>`. The baseline runs at the same seeds are the pairs (at shared seeds they are
the seeds and failures stages' own runs, from the run store).

Per (variant, metric, choice): the mean paired difference on the analysis scale (log for attention
statistics and scales), its standard error, t interval and p-value; Holm's adjusted p over all
cells. Per protocol and cell: its seed band (centre, sd, prediction interval). Nothing is read from
another stage's outputs: the unit and the SE come from the sweep's own seeds. Whether a choice
accounts for a published figure (experiments.sensitivity.accounts_for), the pre-registered
explanations (docs/sensitivity_preregistration.yaml) and the joint protocol table are judged
against claims.yaml by claims.py and the report.

Writes metrics/sensitivity.json (<variant>.<metric>.<protocol>: band; and for a choice its paired
effect, p, p_holm, significant, effect_sd; design: seeds, cells, runs) and
plots/sensitivity/effects.csv (one row per cell).
"""

from __future__ import annotations

from attnrepro.experiments import sensitivity
from attnrepro.experiments.failures import FailuresConfig
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    train = st.section(TrainConfig, "train")
    failures = st.section(FailuresConfig, "failures")
    cfg = st.section(sensitivity.SensitivityConfig, "sensitivity")
    device = st.pin(train.device, train.threads, "train.device")  # the environment record states the runs' threads
    result = sensitivity.run(train, failures, cfg, device, st.engine)

    write_json("metrics/sensitivity.json", result.metrics)
    write_json("metrics/env/sensitivity.json", result.env)
    write_csv("plots/sensitivity/effects.csv", result.rows)
    print(result.table())


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
