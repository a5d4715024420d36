"""The audit's two outputs: one terminal page, verdict first, and a JSON record."""

from __future__ import annotations

import math

from attnrepro.audit.cases import C_TOL, DTYPES, unit_roundoff
from attnrepro.audit.checks import CheckResult, Finding
from attnrepro.audit.cost import mib_text
from attnrepro.audit.diagnose import SPOILS, Diagnosis, cause_text, crash, rank
from attnrepro.formatting import md_table

EVIDENCE_LINES = 4
TOLERANCE_NOTE = (f"tolerance: max|x - ref| <= {C_TOL:g} * R * (1 + max|logit|) * (u + u_fp32 * sqrt(E + S)); "
                  "u = eps/2 of the dtype (" + ", ".join(f"{n} {unit_roundoff(DTYPES[n]):.1e}" for n in
                                                          ("fp32", "fp16", "bf16")) + "), R = max|v| (output) or "
                  "max(max|ref|, max|d_out| max|v|) (gradients)")
CONVENTIONS = [
    "conventions: SDPA's. is_causal aligns the mask top-left (query i sees keys j <= i, also when L < S); a "
    "bottom-right (KV-cache) alignment is a FAIL: pass an explicit attn_mask for that",
    "NotImplementedError on an input = not supported (not run: INCOMPLETE, never a pass); any other exception on an "
    "input the signature allows is a FAIL; grouped-query cases (key/value with fewer heads) are passed "
    "enable_gqa=True, and only where the signature takes it",
]
NIE_HINT = ("(an input you do not support: raise NotImplementedError and the audit reports it as not supported, "
            "not as a FAIL)")


def _summary(r: CheckResult) -> str:
    d = r.details
    if r.name == "parity":
        cases = d.get("cases", [])
        ok = sum(c["fwd"] <= 1 and c.get("bwd", 0) <= 1 for c in cases)
        worst = max((max(c["fwd"], c.get("bwd", 0)) for c in cases), default=0.0)
        aside = ", ".join(f"{d[k]} {k}" for k in ("raised", "wrong output", "unsupported", "optional") if d.get(k))
        if d.get("gqa_not_supported"):
            aside += ("; " if aside else "") + f"{d['gqa_not_supported']} grouped-query not supported (no enable_gqa)"
        return (f"{ok} of {d.get('grid_size', len(cases))} cases within tolerance, forward and backward (worst "
                f"{worst:.2g}x)" + (f"; {aside}" if aside else ""))
    if r.name == "determinism":
        if "keep_rate" not in d:
            return "repeat " + ("bit-identical" if d.get("repeat_max_diff") == 0 else
                                f"differs by {d.get('repeat_max_diff', math.nan):.2g}")
        return (f"repeat bit-identical; dropout_p={d['dropout_p']:g} keeps {d['keep_rate']:.3f} "
                f"(expected {d['keep_rate_expected']:.3f}), kept weights x{d['kept_weight_ratio']:.4g} "
                f"(expected x{d['expected_kept_weight_ratio']:.4g})")
    if r.name == "invariants":
        leak = max(d.get("future_influence_is_causal", [0.0]) + d.get("future_influence_explicit_mask", [0.0]))
        sums = d.get("row_sum_none") or d.get("row_sum_causal")
        sums = "not observable" if not sums else f"{sums[0]:.3g}..{sums[1]:.3g}"
        return (f"future keys' influence {leak:.2g}x tol; key permutation {d.get('permutation_kv', math.nan):.2g}x; "
                f"weight row sums {sums}")
    if r.name == "numerics":
        parts = [f"{k} " + (f"overflow above {v['threshold']:.4g}" if v.get("first_non_finite") is not None
                            else f"finite to {v['largest_logit_tested']:g}") for k, v in d.items()]
        return "; ".join(parts)
    if r.name == "scale":
        if "exponent" not in d:
            return "not read: the rows of the weights do not sum to 1" if "exponent_not_read" in d else \
                "not observable"
        return f"logits divided by d_k^{d['exponent']:.2f} (sqrt: 0.50)"
    if r.name == "cost":
        rows = d.get("rows") or []
        if not rows:
            return ""
        last = rows[-1]
        floor = d.get("memory_resolution_mib", 0.0)
        mem = "" if last.get("impl_peak_mib") is None else \
            f", peak {mib_text(last['impl_peak_mib'], floor)} vs {mib_text(last['sdpa_peak_mib'], floor)}"
        return f"n={last['n']}: {last['impl_ms']:.3g} ms vs SDPA {last['sdpa_ms']:.3g} ms{mem}"
    return ""


def page(target: str, identity: str, diag: Diagnosis, results: list[CheckResult], seconds: float) -> str:
    lines = [diag.headline, f"  audited: {target} ({identity.rpartition('@')[2] or 'no source file'}), "
                            f"{seconds:.1f} s"]
    if diag.verdict == "FAIL":
        if diag.evidence:
            lines.append("  evidence:")
            lines += [f"    - {f.check}: {f.symptom}" for f in diag.evidence[:EVIDENCE_LINES]]
            if len(diag.evidence) > EVIDENCE_LINES:
                lines.append(f"    - and {len(diag.evidence) - EVIDENCE_LINES} more like these (--json has them all)")
        if rank(diag.cause) <= 1 or any(SPOILS.get(diag.cause, set()) & set(f.via) for f in _rest(diag, results)):
            lines.append("  (the other checks' failures below follow from this one; fix it first)")
        if diag.smallest:
            lines.append(f"  smallest input that shows it: {diag.smallest}")
        if diag.others:
            lines.append("  also: " + "; ".join(cause_text(c) for c in diag.others))
        if diag.crashes:
            lines.append(f"  raised an exception on {len(diag.crashes)} inputs (evidence; the cases that ran name "
                         "the cause):")
            lines += [f"    - {f.check}: {f.symptom}" for f in diag.crashes[:EVIDENCE_LINES]]
            if len(diag.crashes) > EVIDENCE_LINES:
                lines.append(f"    - and {len(diag.crashes) - EVIDENCE_LINES} more (--json has them all)")
        if any(crash(f) for f in diag.evidence + diag.crashes):
            lines.append("  " + NIE_HINT)
    lines.append("")
    lines.append(f"  {'check':<13}{'status':<8}{'time':>7}  summary")
    for r in results:
        status = "info" if r.name == "cost" else r.status
        lines.append(f"  {r.name:<13}{status:<8}{r.seconds:>6.1f}s  {_summary(r)}")
    rest = _rest(diag, results)
    if rest:
        lines.append("")
        lines += [f"  [{f.severity}] {f.check}: {f.symptom}" for f in rest]
    lines.append("")
    lines += [f"  {line}" for line in CONVENTIONS + [TOLERANCE_NOTE]]
    return "\n".join(lines) + "\n"


def _rest(diag: Diagnosis, results: list[CheckResult]) -> list[Finding]:
    """The findings the verdict's lines above do not show."""
    shown = {id(f) for f in diag.evidence + diag.crashes}
    return [f for r in results for f in r.findings if id(f) not in shown]


def markdown(target: str, identity: str, diag: Diagnosis, results: list[CheckResult]) -> str:
    """The report's section on a user's attention (params attention.impl): verdict, evidence, checks."""
    lines = ["## Attention implementation (params `attention.impl`)", "",
             f"The train, init_sweep and heads stages ran with `{target}` (source sha256 "
             f"`{identity.rpartition('@')[2] or 'n/a'}`) instead of `attnrepro.model.attention`; the entropy and "
             "Jacobian diagnostics are of its own weights (read off with the identity matrix as the values), the "
             "logits are q.k times the scale. `attnrepro check` judges its metrics against the builtin's seed "
             f"distributions. Its audit (`attnrepro audit {target}`, without the timings):", "",
             f"**{diag.headline}**", ""]
    if diag.verdict == "FAIL":
        lines += [f"- {f.check}: {f.symptom}" for f in diag.evidence]
        lines += [f"- raised (evidence, not the cause): {f.check}: {f.symptom}" for f in diag.crashes]
        if diag.smallest:
            lines.append(f"- smallest input that shows it: {diag.smallest}")
        lines.append("")
    lines += md_table(["check", "status", "summary"], [[r.name, r.status, _summary(r)] for r in results])
    return "\n".join(lines) + "\n"


def _clean(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def record(target: str, identity: str, source: str, diag: Diagnosis, results: list[CheckResult],
           seconds: float, env: dict) -> dict:
    return _clean({
        "target": target, "identity": identity, "source": source, "verdict": diag.verdict,
        "headline": diag.headline, "cause": diag.cause, "cause_text": cause_text(diag.cause) if diag.cause else "",
        "other_causes": diag.others, "smallest_input": diag.smallest, "seconds": seconds, "environment": env,
        "raised_beside": [{"check": f.check, "symptom": f.symptom, "cause": f.cause} for f in diag.crashes],
        "checks": {r.name: {"status": r.status, "seconds": r.seconds, "details": r.details,
                            "findings": [{"severity": f.severity, "symptom": f.symptom, "cause": f.cause,
                                          "smallest": f.smallest} for f in r.findings]} for r in results},
        "tolerance": TOLERANCE_NOTE,
    })
