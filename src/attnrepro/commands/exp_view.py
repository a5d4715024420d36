"""`attnrepro exp`: the headline of the workspace, HEAD and every DVC experiment, one row each, in 80
columns (`dvc exp show` has a column per param and dependency, about 500, which DVC cannot hide).

Read from `dvc exp show --json`: each row's metrics/headline.json (the reference run's numbers): the
final-loss gap the scaling makes at d_head 32 and 256 and their ratio, the unscaled d_head-256
layer-0 entropy at step 222, how far the unscaled d_head-256 softmax Jacobian falls over training (step 0
over step 1480: the primary endpoint), and the chapter's conclusions that hold.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Optional

from attnrepro.commands import tool
from attnrepro.config import ArgumentParser, UserError
from attnrepro.formatting import dig

HEADER = f"{'experiment':<18} {'gap d32':>8} {'gap d256':>9} {'ratio':>6} {'H d256u@222':>12} {'J fall':>8} {'conclusions':>11}"


def _number(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def row(name: str, headline: dict) -> str:
    """One experiment's line (— where its headline lacks a number)."""
    run = dig(headline, "run.train") or {}
    gap32, gap256 = _number(dig(run, "comparison.gap_d32_loss_final")), _number(dig(run, "comparison.gap_d256_loss_final"))
    start_j = _number(dig(run, "d256_unscaled.jacobian_fro_step0"))
    end_j = _number(dig(run, "d256_unscaled.jacobian_fro_step1480"))
    ratio = gap256 / gap32 if gap32 and gap256 is not None else None
    fall = start_j / end_j if start_j is not None and end_j else None
    concl = dig(headline, "claims.conclusion") or {}
    held = f"{concl['passed']}/{concl['n']}" if "passed" in concl and "n" in concl else None  # n: those tested
    cells = [(gap32, ".3f", "", 8), (gap256, ".3f", "", 9), (ratio, ".1f", "", 6),
             (_number(dig(run, "d256_unscaled.entropy_step222")), ".2e", "", 12), (fall, ".0f", "x", 8),
             (held, "", "", 11)]
    text = " ".join(f"{'—' if v is None else format(v, spec) + unit:>{width}}" for v, spec, unit, width in cells)
    return f"{name[:18]:<18} {text}"


def _label(entry: dict) -> str:
    rev = str(entry.get("rev", ""))
    return entry.get("name") or (rev[:7] if len(rev) == 40 else rev)


def rows(exp_show: list) -> list[str]:
    """The lines of `dvc exp show --json`'s entries: the workspace, each branch or commit, each experiment."""
    out = []

    def add(name: str, data: dict) -> None:
        headline = ((data.get("metrics") or {}).get("metrics/headline.json") or {}).get("data") if data else None
        if isinstance(headline, dict):
            out.append(row(name, headline))

    for entry in exp_show:
        data = entry.get("data") or {}
        add(_label(entry), data)
        for exp in entry.get("experiments") or []:
            for rev in exp.get("revs") or []:
                add(_label(rev), rev.get("data") or {})
    return out


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="attnrepro exp", description=__doc__.split("\n\n")[0],
                        epilog="gap: final training loss unscaled minus scaled (nats); ratio: gap d256 / gap d32; "
                               "H d256u@222: the unscaled d_head-256 model's layer-0 attention entropy at step 222 "
                               "(normalised; the chapter: 0.0022); J fall: the scaled model's softmax Jacobian norm "
                               "over the unscaled one's at the last step (the chapter: four orders of magnitude).")
    ap.parse_args(argv)
    proc = subprocess.run([tool("dvc"), "exp", "show", "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UserError(f"`dvc exp show --json` failed: {last[-1] if last else proc.returncode}")
    lines = rows(json.loads(proc.stdout[proc.stdout.index("["):]))
    sys.stdout.write("\n".join([HEADER, *lines]) + "\n")
    return 0
