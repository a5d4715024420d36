"""DVC stage `report`: published vs reproduced, for every claim of claims.yaml.

Reads metrics/*.json (every stage's metrics), metrics/dist/*.json (the seed
distributions), metrics/env/*.json (machine records), plots/train/<variant>.csv
(training curves) and every PNG under plots/<stage>/; writes metrics/claims.json
(per claim: class, verdict, value, published, band, z; a plain output),
metrics/claims_summary.json (counts per class: the DVC metric) and report/
(REPORT.md and the figures drawn here; the stages' own PNGs are linked). With
params attention.impl set, REPORT.md ends with that implementation's audit.
Deterministic: same metrics -> byte-identical outputs.

The report never fails because a claim fails: it records the verdicts. The gate
is `attnrepro check` (CI), which exits non-zero on a failed conclusion or checksum.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from attnrepro.audit.cli import report_section
from attnrepro.audit.load import BUILTIN, AttentionConfig
from attnrepro.experiments.comparison import pairs_by_dhead
from attnrepro.experiments.protocol import TrainConfig
from attnrepro.config import from_dict, load_section, read_params, run_stage
from attnrepro.io import atomic_dir, write_json
from attnrepro.report import ReportConfig, build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (sections `report` and `train`)")
    ap.add_argument("--out", default="report", help="report folder (default: report)")
    ap.add_argument("--claims-json", default="metrics/claims.json",
                    help="where the verdicts go (claims_summary.json is written beside it)")
    args = ap.parse_args()
    cfg = load_section(ReportConfig, "report", args.params)
    pairs = sorted(pairs_by_dhead(from_dict(TrainConfig, read_params(args.params).get("train"), prefix="train")).items())
    plots_href = Path(os.path.relpath(Path("plots").resolve(), Path(args.out).resolve())).as_posix()
    rep = build(Path(cfg.claims), Path("metrics"), Path("plots"), pairs, smooth=cfg.smooth, plots_href=plots_href)
    attn = load_section(AttentionConfig, "attention", args.params)
    if attn.impl not in BUILTIN:  # the builtin's report stays as it was
        rep.markdown += "\n" + report_section(attn.impl)
    with atomic_dir(args.out) as tmp:
        (tmp / "figures").mkdir()
        for name, data in sorted(rep.figures.items()):
            (tmp / "figures" / name).write_bytes(data)
        (tmp / "REPORT.md").write_text(rep.markdown, encoding="utf-8")
    write_json(args.claims_json, rep.claims_json)
    write_json(Path(args.claims_json).with_name("claims_summary.json"), rep.summary)
    s = rep.summary
    print(f"conclusions {s['conclusion']['passed']}/{s['conclusion']['n']} hold, checksums "
          f"{s['checksum']['passed']}/{s['checksum']['n']}, published values {s['value']['passed']}/{s['value']['n']} "
          f"inside our band ({s['value']['unexplained']} unexplained); {s['conclusion']['skipped'] + s['value']['skipped']} "
          f"skipped (need a GPU) -> {args.out}/REPORT.md")


if __name__ == "__main__":
    run_stage(main)
