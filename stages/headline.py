"""DVC stage `headline`: the views a person reads in DVC (attnrepro.report.headline_metrics).

Writes metrics/headline.json, the pipeline's one declared DVC metric (what `dvc exp show` and
`dvc metrics diff` show): this run's values of claims.yaml's `headline:` metrics, the seed
summaries of the headline gaps (metrics/seeds.json) and the check's counts
(metrics/claims_summary.json); and plots/views/<view>/<line>.csv, the plots page's tables (x and
the plotted column of the step-wise tables, at most 500 rows per line). Reads only other stages'
outputs; trains nothing, times nothing: deterministic, in a second.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.report import headline_metrics as headline
from attnrepro.files import write_json
from attnrepro.staging import atomic_dir
from attnrepro.run.stage import Stage, stage


def options(ap) -> None:
    ap.add_argument("--claims", default="claims.yaml", help="the claims file (its primary endpoints and timings)")
    ap.add_argument("--metrics-dir", default="metrics", help="where the metrics files are (default metrics)")


def main(st: Stage) -> None:
    mdir = Path(st.args.metrics_dir)
    out = headline.headline_of(Path(st.args.claims), mdir)
    tables = headline.views()
    with atomic_dir(headline.VIEWS_DIR) as tmp:  # the whole folder: a view dropped leaves no stale file
        headline.write_tables(tmp, tables)
    write_json(mdir / "headline.json", out)
    print(f"{mdir / 'headline.json'}: {sum(1 for _ in _leaves(out))} numbers; "
          f"{headline.VIEWS_DIR}/: {len(headline.VIEWS)} views")


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    else:
        yield obj


if __name__ == "__main__":
    stage(main, __doc__, arguments=options)
