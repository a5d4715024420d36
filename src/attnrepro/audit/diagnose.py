"""From failed checks to the likely cause, in the chapter's terms.

Each failing finding carries the cause its own evidence points to: parity names the bug
whose float64 output every case matches (reference.HYPOTHESES), invariants the offsets of
a future leak or what a fully masked row does, numerics the logit where each dtype
overflows, scale the power of d_k that divides the logits. A symptom can fit several
causes (a leak at every offset: a mask filled with 0, or no mask at all); `SUPPORTS` says
which. Causes are ranked before they are counted: a random output (dropout left on, a
nondeterministic kernel) or a transposed one first, as it turns every other comparison into
noise; then outputs whose heads or rows are mixed; then the functional ones (masking, scale,
softmax axis, normalisation, head mapping); the numerical-range ones (an overflow above some
logit) last, so fixing what is named first never leaves a wrong cause or a false PASS behind
it. Within a rank the cause most findings support is the verdict's.

One cause unless two are shown: a further cause is named ("also") only when a probe the first
cause does not spoil supports it (a random or transposed output spoils every comparison, a
key/value swap every reading of the weights through values = identity, an inverted or ignored
boolean mask every probe that masks with one). An exception on an
allowed input is the verdict only when nothing else failed; beside other failures it is
listed with its input, as evidence, never as the cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnrepro.audit.checks import BOOL_MASK, IDENTITY, CheckResult, Finding
from attnrepro.audit.float64_reference import HYPOTHESES

CAUSES: dict[str, str] = {
    **{h: text for h, text in HYPOTHESES.items() if h != "correct"},
    "no_stable_softmax": "exp without subtracting the row maximum (the chapter's no_stable_softmax)",
    "scores_overflow": "q k^T exceeds the dtype's range before the scale (fix: scale q before q k^T, or compute "
                       "q k^T in float32)",
    "not_equivariant": "a positional term: the output depends on the order of the keys",
    "finite_fill": "a fully masked row averages the values it must not see (a finite fill, or a special case)",
    "dropout_on": "dropout applied with dropout_p=0: the output is random",
    "heads_mixed": "heads mixed: one head's query moves another head's output (a reshape or transpose of the "
                   "(B, H, L, E) layout)",
    "queries_mixed": "queries mixed: one query moves other rows' outputs (a reshape, or a softmax across queries)",
    "nondeterministic": "nondeterministic: two identical calls with dropout_p=0 differ",
    "dropout_ignored": "dropout_p ignored: no weight is ever dropped",
    "dropout_rate": "dropout drops weights at another rate than dropout_p",
    "dropout_unscaled": "dropout keeps weights without rescaling them by 1/(1 - dropout_p)",
    "output_transposed": "output transposed: its dimensions are not in SDPA's order (B, H, L, Ev)",
    "wrong_dtype": "the output's dtype is not the inputs'",
}
# outputs no check can read: random, or another layout than (B, H, L, Ev)
RANDOM = ("dropout_on", "nondeterministic", "output_transposed")
# outputs no per-row check can read: heads or rows mixed (softmax over the queries is one way)
MIXED = ("heads_mixed", "queries_mixed", "softmax_axis")
NUMERICAL = ("no_stable_softmax", "scores_overflow")
# a cause -> the readings it makes meaningless (RANDOM: all of them)
SPOILS = {"kv_swapped": {IDENTITY}, "mask_inverted": {BOOL_MASK}, "mask_ignored": {BOOL_MASK}}


def rank(cause: str) -> int:
    """0 an output no check can read (random, transposed), 1 one no per-row check can read (heads or rows
    mixed), 2 functional, 3 numerical range."""
    return 0 if cause in RANDOM else 1 if cause in MIXED else 3 if cause in NUMERICAL else 2

# a symptom -> the causes it fits (a cause always supports itself)
SUPPORTS: dict[str, tuple[str, ...]] = {
    "future_leak_all": ("mask_zero", "causal_ignored"),
    "dk_not_sqrt": ("dk_not_sqrt", "scale_squared"),
    "queries_mixed": ("queries_mixed", "softmax_axis"),
}


def crash(f: Finding) -> bool:
    """An exception on an input the signature allows (cause raises:<Type>)."""
    return f.cause.startswith("raises:")


def cause_text(cause: str) -> str:
    if cause in CAUSES:
        return CAUSES[cause]
    if cause.startswith("mask_fill:"):
        return f"masked scores filled with {cause.partition(':')[2]} instead of -inf (a finite fill)"
    if cause.startswith("raises:"):
        return f"raises {cause.partition(':')[2]} on an input the signature allows"
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
    crashes: list[Finding] = field(default_factory=list)  # exceptions beside other failures: evidence, listed

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
        own = next((f.data["headline"] for f in self.evidence if f.data.get("headline")), "")
        where = f" (on {self.smallest})" if self.cause.startswith("raises:") and self.smallest else ""
        return f"FAIL: {own or cause_text(self.cause)}{where}" + extra


def diagnose(results: list[CheckResult]) -> Diagnosis:
    findings = [f for r in results for f in r.findings]
    fails = [f for f in findings if f.severity == "fail"]
    unsupported = sum(f.severity == "unsupported" for f in findings)
    if not fails:  # an unsupported case is not evidence: a leak in a mode that never ran is still possible
        return Diagnosis("INCOMPLETE" if unsupported else "PASS", unsupported=unsupported)
    crashes = [f for f in fails if crash(f)]
    if len(crashes) < len(fails):  # other cases ran and failed: they say what the bug is
        fails = [f for f in fails if not crash(f)]
    else:
        crashes = []
    score: dict[str, list[Finding]] = {}
    for f in fails:
        if f.cause:
            for c in SUPPORTS.get(f.cause, (f.cause,)):
                score.setdefault(c, []).append(f)
    if not score:
        return Diagnosis("FAIL", evidence=fails, smallest=fails[0].smallest, unsupported=unsupported, crashes=crashes)
    # most findings first; on a tie the cause parity's hypothesis matching named
    parity_cause = next((f.cause for f in fails if f.check == "parity" and f.cause), "")
    ranked = sorted(score, key=lambda c: (rank(c), -len(score[c]), c != parity_cause))
    best = ranked[0]
    evidence = score[best]
    smallest = next((f.smallest for f in evidence if f.check == "parity" and f.smallest),
                    next((f.smallest for f in evidence if f.smallest), ""))
    others = [c for c in ranked[1:] if not set(map(id, score[c])) <= set(map(id, evidence)) and shown(c, best, score[c])]
    return Diagnosis("FAIL", best, evidence, others, smallest, unsupported, crashes)


def shown(cause: str, best: str, findings: list[Finding]) -> bool:
    """Whether `cause` is shown independently of `best`: beside a random or transposed output nothing is, beside
    mixed heads or rows only another mixing, and otherwise by a finding whose reading `best` does not spoil."""
    if rank(best) == 0 or (rank(best) == 1 and rank(cause) > 1):
        return False
    return any(not SPOILS.get(best, set()) & set(f.via) for f in findings)
