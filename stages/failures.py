"""DVC stage `failures`: inject the four silent bugs of §1.11.7 and record their symptoms.

The small config is trained for `failures.steps` steps per variant (correct and each
attention.BUGS entry) with the same seed, the same initialization and the same batches;
the only difference is ModelConfig(bug=...). Symptoms are measured on fixed validation
batches after training. `entropy` is the normalized entropy of the row-renormalized weights (p / row sum) over
the keys the row can actually weight (all keys for mask_zero, whose mask leaks; the
causal count otherwise), so it is in [0, 1] for every variant (attnrepro.measure.probes);
`entropy_raw` keeps the naive value. The health checks of attnrepro.measure.health run on the attention
function with each variant's switches; which of them fire is the check-by-variant matrix.

The symptom table comes from `failures.seed`. Every variant is trained again with each
of `failures.spread_seeds` (each seed drives both the initialization and the batch
order; the validation batches stay fixed): metrics/dist/failures.json holds every
symptom's distribution over all the seeds (attnrepro.stats), which `attnrepro check`
and the claims use, as they do the train stage's.

A second measuring protocol for the diagonal weight, `diag_weight_all_rows_half_block`:
windows of half the model's block (32 tokens at block 64) of the same validation stream,
every row counted (row 0 included), as the source's published diagonal weights suggest it
measured.

Writes metrics/failures.json (<variant>.loss_final, .entropy, .max_row_sum, ...,
<variant>.check_<name> = 1 when the check fires), metrics/dist/failures.json,
plots/failures/<variant>.csv (per step), plots/failures/seeds.csv (one row per
variant and seed), plots/failures/checks.csv and plots/failures/training.png.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.envinfo import stage_environment
from attnrepro.experiments import failures
from attnrepro.experiments.failures import FailuresConfig
from attnrepro.figures import failures_figure
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(FailuresConfig, "failures")
    device = st.pin(cfg.device, cfg.threads, "failures.device")  # the health checks run here
    result = failures.run(cfg, device, st.engine)
    for bug, history in result.histories.items():
        write_csv(Path("plots/failures") / f"{bug}.csv", history)
    write_json("metrics/failures.json", result.metrics)
    write_json("metrics/dist/failures.json", result.dist)
    write_csv("plots/failures/seeds.csv", result.seed_rows)
    write_json("metrics/env/failures.json", stage_environment(device, result.records))
    write_csv("plots/failures/checks.csv", result.check_rows)
    failures_figure(result.histories, Path("plots/failures/training.png"))
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
