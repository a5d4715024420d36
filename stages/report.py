"""DVC stage `report`: published vs reproduced, for every claim of claims.yaml.

Reads metrics/*.json (every stage's metrics), metrics/dist/*.json (the seed
distributions), metrics/env/*.json (machine records), plots/train/<variant>.csv
(training curves), plots/critical/per_seed.csv and qk_per_seed.csv (runs on the choices arms'
machine: report/crossing.py), benchmarks/results/gate_power.json (report/collapse.py) and every
PNG under plots/<stage>/; writes metrics/claims.json
(per claim: class, verdict, value, published, band, z; a plain output),
metrics/claims_summary.json (counts per class: the DVC metric) and report/
(REPORT.md, laid out like a paper in the chapter's order, with the figures drawn here
and links to the stages' own PNGs; APPENDIX.md, the tables behind it; REPORT.html, the same report with every figure
embedded). With params attention.impl set, the report ends with that implementation's audit.
Deterministic: same metrics -> byte-identical outputs.

The report never fails because a claim fails: it records the verdicts. The gate
is `attnrepro check` (CI), which exits non-zero on a failed conclusion or checksum.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.report import assemble as report
from attnrepro.model.attention_impl import AttentionConfig
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.files import write_json
from attnrepro.staging import atomic_dir
from attnrepro.report.assemble import ReportConfig
from attnrepro.run.stage import Stage, stage


def options(ap) -> None:
    ap.add_argument("--out", default="report", help="report folder (default: report)")
    ap.add_argument("--claims-json", default="metrics/claims.json",
                    help="where the verdicts go (claims_summary.json is written beside it)")


def main(st: Stage) -> None:
    cfg = st.section(ReportConfig, "report")
    rep = report.run(cfg, st.section(TrainConfig, "train"), st.section(AttentionConfig, "attention"), st.args.out)
    with atomic_dir(st.args.out) as tmp:
        (tmp / "figures").mkdir()
        for name, data in sorted(rep.figures.items()):
            (tmp / "figures" / name).write_bytes(data)
        (tmp / "REPORT.md").write_text(rep.markdown, encoding="utf-8")
        (tmp / "APPENDIX.md").write_text(rep.appendix, encoding="utf-8")
        (tmp / "REPORT.html").write_text(rep.html, encoding="utf-8")
    write_json(st.args.claims_json, rep.claims_json)
    write_json(Path(st.args.claims_json).with_name("claims_summary.json"), rep.summary)
    for line in rep.lines(st.args.out):
        print(line)


if __name__ == "__main__":
    stage(main, __doc__, arguments=options)
