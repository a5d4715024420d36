"""DVC stage `report`: published vs reproduced, for every claim of claims.yaml.

Reads metrics/*.json (every stage's metrics), metrics/env/*.json (machine
fingerprints), plots/train/<variant>.csv (training curves) and every PNG under
plots/<stage>/; writes metrics/claims.json (per claim: value, published,
tolerance, pass, gate, skipped; plus totals) and report/ (REPORT.md and the
figures drawn here, figures/*.png; the stages' own PNGs are linked, not copied).
Deterministic: same metrics -> byte-identical outputs.

The report never fails because a claim fails: it records the verdicts. The gate
is `attnrepro check` (CI), which exits non-zero on a failed gated claim.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from attnrepro.config import ConfigError, load_section, read_params, require, run_stage
from attnrepro.io import atomic_dir, write_json
from attnrepro.report import build


@dataclass
class ReportConfig:
    claims: str = "claims.yaml"   # the only place published numbers live
    smooth: int = 20              # moving-average window of the training-loss figure

    def validate(self, prefix: str = "report") -> None:
        require(self.smooth > 0, f"{prefix}.smooth", self.smooth, "a positive integer")
        require(Path(self.claims).is_file(), f"{prefix}.claims", self.claims, "an existing claims file")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (sections `report` and `train`)")
    ap.add_argument("--out", default="report", help="report folder (default: report)")
    ap.add_argument("--claims-json", default="metrics/claims.json", help="where the verdicts go")
    args = ap.parse_args()
    cfg = load_section(ReportConfig, "report", args.params)
    train = read_params(args.params).get("train") or {}
    if not isinstance(train, dict):
        raise ConfigError("train: expected a mapping (the report reads train.variants and train.models)")
    plots_href = Path(os.path.relpath(Path("plots").resolve(), Path(args.out).resolve())).as_posix()
    rep = build(Path(cfg.claims), Path("metrics"), Path("plots"), train, smooth=cfg.smooth, plots_href=plots_href)
    with atomic_dir(args.out) as tmp:
        tmp.chmod(0o755)  # mkdtemp makes it private; the report is for reading
        (tmp / "figures").mkdir()
        for name, data in sorted(rep.figures.items()):
            (tmp / "figures" / name).write_bytes(data)
        (tmp / "REPORT.md").write_text(rep.markdown, encoding="utf-8")
    write_json(args.claims_json, rep.claims_json)
    t = rep.claims_json["totals"]
    print(f"claims: {t['n']} evaluated, {t['passed']} passed, {t['failed']} failed "
          f"({t['missing']} missing), {t['skipped']} skipped; gated {t['gated_passed']}/{t['gated']} passed "
          f"-> {args.out}/REPORT.md")


if __name__ == "__main__":
    run_stage(main)
