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
plots/seeds/ (gaps.csv per seed, curves.csv: mean and range of each variant's training
curves, bands.png, gaps.png).
"""

from __future__ import annotations

from attnrepro.experiments.comparison import SeedsConfig, run_seeds
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.figures import seed_bands_figure, seed_gaps_figure
from attnrepro.io import write_csv, write_json
from attnrepro.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(TrainConfig, "train")
    seeds = st.section(SeedsConfig, "seeds").seeds
    device = st.pin(cfg.device, cfg.threads, "train.device")  # the environment record states the runs' threads
    result = run_seeds(cfg, seeds, device, st.engine)

    write_json("metrics/dist/train.json", result.dist)
    write_json("metrics/seeds.json", result.headline)
    write_json("metrics/env/seeds.json", result.env)
    write_csv("plots/seeds/gaps.csv", result.gaps)
    write_csv("plots/seeds/curves.csv", result.curves)
    seed_bands_figure(result.curves, list(cfg.variants), "plots/seeds/bands.png", len(seeds))
    seed_gaps_figure(result.gaps, result.small, result.large, "plots/seeds/gaps.png")
    print(result.line())


if __name__ == "__main__":
    stage(main, __doc__, engine=True)
