"""DVC stage `sensitivity`: which unstated choice moves which deviating number, in seed sd?

The source leaves open its weight-decay value and grouping (its snippet is
`AdamW(model.parameters(), ...)`), its warm-up and schedule, the block size of the
failures table, its validation split and its init scheme. Each choice of
`sensitivity.choices` changes ONE of them on top of the train protocol (params `train`)
and is trained at `sensitivity.seeds` for the variants whose numbers deviate from the
published ones (`sensitivity.metrics`): train variants, and the failures table's models
as `failures_<variant>` (`failures_correct`, `failures_mask_zero`, ...; the failures
protocol, 300 steps). The effect of a choice on a metric is the mean over seeds
of its paired difference from the plain protocol at the same seed, in units of the
plain protocol's seed standard deviation (the reference distribution of the seeds and
failures stages; the log scale for attention statistics and scales).

Choice kinds: {optim: {OptimConfig fields}}, {model: {ModelConfig fields}} or
{split: first} (the first 10% of the token stream is the validation set instead of the
last). The failures symptoms are measured as in the failures stage (its summary's
`diag_weight`, rows 1-63 of 64); its second protocol, over rows 0-31 as the source likely
measured, needs no retraining and is a metric of the failures stage itself.

Writes metrics/sensitivity.json (<variant>.<metric>.<choice>: effect_sd, mean, baseline)
and plots/sensitivity/effects.csv (one row per variant, metric and choice).
"""

from __future__ import annotations

from attnrepro.experiments import sensitivity
from attnrepro.experiments.failures import FailuresConfig
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.io import write_csv, write_json
from attnrepro.stage import Stage, stage


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
