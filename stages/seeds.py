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
with modes are per mode. Also metrics/dist/heads.json: the heads stage's portraits of the
variant it analyses (heads.checkpoint, data/train/<variant>/model.pt) at every seed, each
seed's heads named after the train.seed checkpoint's head they play (experiments.heads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from attnrepro.experiments import heads
from attnrepro.experiments.comparison import SeedsConfig, gap_d_heads, pairs_by_dhead, run_seeds
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.figures import seed_bands_figure, seed_gaps_figure, seed_points_figure, seed_runs_figure
from attnrepro.files import as_written, read_csv, read_json, write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(TrainConfig, "train")
    seeds = st.section(SeedsConfig, "seeds")
    hcfg = st.section(heads.HeadsConfig, "heads")
    variant = Path(hcfg.checkpoint).parent.name  # data/train/<variant>/model.pt, the train stage's run
    device = st.pin(cfg.device, cfg.threads, "train.device")  # the environment record states the runs' threads
    result = run_seeds(cfg, seeds.seeds, seeds.mode_statistic, device, st.engine)

    write_json("metrics/dist/train.json", result.dist)
    if Path(hcfg.checkpoint).parts[:2] == ("data", "train") and variant in cfg.variants and cfg.seed in seeds.seeds:
        write_json("metrics/dist/heads.json", heads.seed_portraits(
            hcfg, {s: result.checkpoints[(variant, s)] for s in seeds.seeds}, cfg.seed))
    else:  # the heads stage analyses no run of this sweep: no seed distribution for it
        write_json("metrics/dist/heads.json", {"seeds": [], "stats": {}, "runs": {}})
        print(f"note: heads.checkpoint {hcfg.checkpoint} is not a train variant's run at train.seed among "
              "seeds.seeds: metrics/dist/heads.json is empty, and the heads are judged by their tolerances")
    write_json("metrics/seeds.json", result.headline)
    write_json("metrics/env/seeds.json", result.env)
    tables = {"gaps": result.gaps, "curves": result.curves, "per_seed": result.per_seed, "runs": result.histories}
    for name, rows in tables.items():
        write_csv(f"plots/seeds/{name}.csv", rows)
    figures(st, {name: as_written(rows) for name, rows in tables.items()},
            {v: m.groups for v, m in result.modes.items()})
    print(result.line())
    print("\n".join(result.mode_lines()))


def figures(st: Stage, tables: Optional[dict] = None, groups: Optional[dict] = None) -> None:
    """The PNGs, drawn from the tables as written (plots/seeds/*.csv) and each variant's modes
    (metrics/dist/train.json): with --figures-only, from those files alone."""
    cfg = st.section(TrainConfig, "train")
    seeds = st.section(SeedsConfig, "seeds")
    if tables is None:
        tables = {name: read_csv(f"plots/seeds/{name}.csv") for name in ("gaps", "curves", "per_seed", "runs")}
    if groups is None:
        groups = {v: [m["seeds"] for m in e["modes"]] for v, e in read_json("metrics/dist/train.json")["modes"].items()}
    variants = list(cfg.variants)
    seed_bands_figure(tables["curves"], variants, "plots/seeds/bands.png", len(seeds.seeds))
    seed_gaps_figure(tables["gaps"], *gap_d_heads(pairs_by_dhead(cfg)), "plots/seeds/gaps.png")
    seed_points_figure(tables["per_seed"], variants, groups, "plots/seeds/points.png", seeds.mode_statistic)
    seed_runs_figure(tables["runs"], variants, "plots/seeds/runs.png")


if __name__ == "__main__":
    stage(main, __doc__, engine=True, figures=figures)
