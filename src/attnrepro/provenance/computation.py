"""The check's first question, "is it the same computation?", answered on every machine in seconds.

The code's golden runs (run/golden.py: float32, at their float-order tolerance) and its fingerprint
(provenance/fingerprint.py: integer paths exactly, float64 paths at 1e-9) are computed here and compared with the
values committed at the reference revision, never with the working tree's: a change that regenerates
tests/golden/ (as a golden test's message invites after bumping NUMERICS) is a declared change of the
computation, which the check names and leaves to the second question, the chapter's endpoints, to judge.
A change of the computation that is not declared (the code's values differ from the reference's, the
golden files are the reference's) is a problem."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from attnrepro.config import UserError
from attnrepro.provenance import fingerprint
from attnrepro.provenance.lock import out_md5
from attnrepro.run import golden

GOLDEN_DIR = "tests/golden"
# outputs no float order can change (the corpus text, vocabulary, token ids and split), by their stage
CHECKSUMS = {"corpus": ("data/corpus", "metrics/corpus.json")}


@dataclass
class Computation:
    moved: list[str] = field(default_factory=list)  # what differs from the reference's values
    declared: list[str] = field(default_factory=list)  # golden files the working tree changed
    own: list[str] = field(default_factory=list)  # what differs from the working tree's own golden files
    runs: int = 0  # golden runs compared
    probes: int = 0  # fingerprint probes compared

    @property
    def answer(self) -> str:
        if not self.moved:
            return "unchanged"
        return "changed, declared" if self.declared and not self.own else "changed"

    def line(self, reference: str) -> str:
        if not self.runs + self.probes:  # a reference from before the golden files: nothing to say
            return ""
        head = {"unchanged": "yes", "changed": "no", "changed, declared": "no, a declared change"}[self.answer]
        text = (f"same computation: {head} ({self.runs} golden runs, {self.probes} fingerprint probes and the "
                f"corpus checksums against {reference})")
        if self.answer == "changed, declared":
            text += ("; the working tree regenerated " + ", ".join(self.declared)
                     + ": the primary endpoints judge whether the chapter still reproduces")
        return text

    def problems(self, reference: str) -> list[str]:
        """An undeclared change, or code that disagrees with its own golden files: each moved value, one line."""
        if self.moved and not self.declared:
            return [f"same computation: {m} (against {reference}'s {GOLDEN_DIR}: an undeclared change; if it is "
                    "meant, bump NUMERICS and regenerate: python scripts/golden.py)" for m in self.moved]
        return [f"same computation: {m} (against this tree's own {GOLDEN_DIR})" for m in self.own]


def _golden_lines(values: dict[str, dict], reference: dict[str, dict]) -> list[str]:
    out = []
    for name, expected in sorted(reference.items()):
        if name == fingerprint.NAME:
            out += [f"fingerprint {line}" for line in fingerprint.differences(expected, values[name])]
        elif name not in values:
            out.append(f"golden {name}: no such case in the code")
        else:
            worst, where = golden.largest_difference(expected, values[name])
            if worst > golden.RTOL:
                out.append(f"golden {name}: {where} (relative {worst:.2g} > {golden.RTOL:.0e})")
    return out


def checksum_lines(root: Path, reference_lock: dict, other_params: set[str]) -> list[str]:
    """Each float-order-free output present in the tree whose md5 is not the reference's dvc.lock's (where the stage
    ran with the reference's params: other params are a declared change, listed by the check apart)."""
    out = []
    for stage, paths in CHECKSUMS.items():
        if stage in other_params:
            continue
        recorded = {o.get("path"): o.get("md5") for o in ((reference_lock.get("stages") or {}).get(stage) or {}).get(
            "outs", [])}
        for path in paths:
            if (root / path).exists() and recorded.get(path) and out_md5(root / path) != recorded[path]:
                out.append(f"checksum {path}: md5 {out_md5(root / path)}, the reference's {recorded[path]} (no float "
                           f"order changes it: the {stage} stage computed something else)")
    return out


def current_values() -> dict[str, dict]:
    """The code's golden runs and fingerprint, as scripts/golden.py writes them."""
    values = {name: golden.run_case(spec) for name, spec in golden.cases().items()}
    values[fingerprint.NAME] = fingerprint.compute()
    return values


def _parsed(text: Optional[str], where: str) -> Optional[dict]:
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        raise UserError(f"{where} cannot be read as JSON: the reference is damaged") from None


def same_computation(read_reference, root: Path, reference_lock: dict, other_params: set[str] = frozenset(),
                     values: Optional[dict[str, dict]] = None) -> Computation:
    """`read_reference(path)` gives a committed file's text at the reference revision (None where it has none);
    `other_params`: the stages run with other params than the reference's."""
    names = sorted(golden.cases()) + [fingerprint.NAME]
    ref, tree = {}, {}
    for name in names:
        path = f"{GOLDEN_DIR}/{name}.json"
        if (parsed := _parsed(read_reference(path), f"the reference's {path}")) is not None:
            ref[name] = parsed
        own = root / path
        tree[name] = _parsed(own.read_text(encoding="utf-8") if own.is_file() else None, str(own))
    out = Computation(runs=len(set(ref) - {fingerprint.NAME}), probes=len(ref.get(fingerprint.NAME, {})))
    out.moved = checksum_lines(root, reference_lock, other_params)
    if not ref:
        return out
    values = values if values is not None else current_values()
    out.moved += _golden_lines(values, ref)
    out.declared = [f"{GOLDEN_DIR}/{n}.json" for n in names if tree[n] != ref.get(n)]
    out.own = _golden_lines(values, {n: v for n, v in tree.items() if v is not None})
    return out
