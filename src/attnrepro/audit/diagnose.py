"""From failed checks to the likely cause, in the chapter's terms.

Each failing finding carries the cause its own evidence points to: parity names the bug
whose float64 output every case matches (reference.HYPOTHESES), invariants the offsets of
a future leak or what a fully masked row does, numerics the logit where each dtype
overflows, scale the power of d_k that divides the logits. A symptom can fit several
causes (a leak at every offset: a mask filled with 0, or no mask at all); `SUPPORTS` says
which, and the cause most findings support is the verdict's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnrepro.audit.checks import CheckResult, Finding
from attnrepro.audit.float64_reference import HYPOTHESES

CAUSES: dict[str, str] = {
    **{h: text for h, text in HYPOTHESES.items() if h != "correct"},
    "no_stable_softmax": "exp without subtracting the row maximum (the chapter's no_stable_softmax)",
    "scores_overflow": "the scores themselves exceed the dtype's range (compute q.k in float32)",
    "not_equivariant": "a positional term: the output depends on the order of the keys",
}

# a symptom -> the causes it fits (a cause always supports itself)
SUPPORTS: dict[str, tuple[str, ...]] = {
    "future_leak_all": ("mask_zero", "causal_ignored"),
    "finite_fill": ("mask_zero",),
}


def cause_text(cause: str) -> str:
    if cause in CAUSES:
        return CAUSES[cause]
    if cause.startswith("future_leak_"):
        return f"causal mask off by {cause.rsplit('_', 1)[1]}: future leak at offsets 1-{cause.rsplit('_', 1)[1]}"
    return cause


@dataclass
class Diagnosis:
    verdict: str  # PASS | FAIL | INCOMPLETE (nothing failed, but some cases could not run)
    cause: str = ""  # the most supported cause ("" when the failures match none)
    evidence: list[Finding] = field(default_factory=list)  # the failing findings that support it
    others: list[str] = field(default_factory=list)  # further causes, less supported
    smallest: str = ""
    unsupported: int = 0

    @property
    def headline(self) -> str:
        extra = f" ({self.unsupported} cases unsupported)" if self.unsupported else ""
        if self.verdict == "PASS":
            return "PASS: matches the float64 reference; invariants, numerics and scale hold"
        if self.verdict == "INCOMPLETE":
            return (f"INCOMPLETE: nothing failed, but {self.unsupported} cases could not run (unsupported): "
                    "the audit vouches only for what ran")
        if not self.cause:
            return "FAIL: differs from the reference in a way that matches none of the known bugs" + extra
        return f"FAIL: {cause_text(self.cause)}" + extra


def diagnose(results: list[CheckResult]) -> Diagnosis:
    findings = [f for r in results for f in r.findings]
    fails = [f for f in findings if f.severity == "fail"]
    unsupported = sum(f.severity == "unsupported" for f in findings)
    if not fails:  # an unsupported case is not evidence: a leak in a mode that never ran is still possible
        return Diagnosis("INCOMPLETE" if unsupported else "PASS", unsupported=unsupported)
    score: dict[str, list[Finding]] = {}
    for f in fails:
        if f.cause:
            for c in SUPPORTS.get(f.cause, (f.cause,)):
                score.setdefault(c, []).append(f)
    if not score:
        return Diagnosis("FAIL", evidence=fails, smallest=fails[0].smallest, unsupported=unsupported)
    # most findings first; on a tie the cause parity's hypothesis matching named
    parity_cause = next((f.cause for f in fails if f.check == "parity" and f.cause), "")
    ranked = sorted(score, key=lambda c: (-len(score[c]), c != parity_cause))
    best = ranked[0]
    evidence = score[best]
    smallest = next((f.smallest for f in evidence if f.check == "parity" and f.smallest),
                    next((f.smallest for f in evidence if f.smallest), ""))
    others = [c for c in ranked[1:] if not set(map(id, score[c])) <= set(map(id, evidence))]
    return Diagnosis("FAIL", best, evidence, others, smallest, unsupported)
