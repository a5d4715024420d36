"""DVC stage `seeds`: the reference distribution of the controlled comparison over seeds.

Trains train.variants (the chapter's protocol, params section `train`) at every seed
of `seeds.seeds`. A seed drives the init draw and the batch order, so at each seed the
scaled and unscaled models of one shape start from the same weights and see the same
batches (paired). The seed train.seed is the train stage's own run: the run store
shares it. Every number of metrics/train.json gets n, mean, sd, min, max and 95%
intervals (log scale for attention statistics: attnrepro.stats), so `attnrepro check`
can tell a failure to reproduce from seed noise, and the claims are evaluated on every
seed.

Writes metrics/seeds.json (the headline: gaps and the gap ratio over seeds),
metrics/dist/train.json (every metric's distribution, and each seed's metrics),
plots/seeds/ (gaps.csv and per_seed.csv: each seed's gaps and headline metrics; curves.csv:
mean and range of each variant's training curves; runs.csv: every run's loss curve; bands.png,
gaps.png, points.png: every seed's headline values, runs.png: every run's loss curve).
Each variant's seeds are tested for two modes on seeds.mode_statistic (stats.find_modes):
metrics/seeds.json gives each mode's share of the seeds, and the distributions of a variant
with modes are per mode.
"""

from __future__ import annotations

from attnrepro.experiments.comparison import SeedsConfig, run_seeds
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.figures import seed_bands_figure, seed_gaps_figure, seed_points_figure, seed_runs_figure
from attnrepro.io import write_csv, write_json
from attnrepro.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(TrainConfig, "train")
    seeds = st.section(SeedsConfig, "seeds")
    device = st.pin(cfg.device, cfg.threads, "train.device")  # the environment record states the runs' threads
    result = run_seeds(cfg, seeds.seeds, seeds.mode_statistic, device, st.engine)

    write_json("metrics/dist/train.json", result.dist)
    write_json("metrics/seeds.json", result.headline)
    write_json("metrics/env/seeds.json", result.env)
    write_csv("plots/seeds/gaps.csv", result.gaps)
    write_csv("plots/seeds/curves.csv", result.curves)
    write_csv("plots/seeds/per_seed.csv", result.per_seed)
    write_csv("plots/seeds/runs.csv", result.histories)
    seed_bands_figure(result.curves, list(cfg.variants), "plots/seeds/bands.png", len(seeds.seeds))
    seed_gaps_figure(result.gaps, result.small, result.large, "plots/seeds/gaps.png")
    seed_points_figure(result.per_seed, list(cfg.variants), result.modes, "plots/seeds/points.png", seeds.mode_statistic)
    seed_runs_figure(result.histories, list(cfg.variants), "plots/seeds/runs.png")
    print(result.line())
    print("\n".join(result.mode_lines()))


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
