"""The battery: parity, invariants, numerics and scale, each returning a CheckResult.

Every call of the implementation goes through `Impl.call`, which turns NotImplementedError
into "unsupported" (reported, never a pass or a fail: the audit is INCOMPLETE), an output whose
shape is a permutation of SDPA's into a failure "output transposed", and any other exception
into a failure naming the input and the exception's first line (cause `raises:<Type>`), except
on the cases the contract leaves optional (is_causal with an attn_mask), which an
implementation may decline (NotImplementedError) or refuse as SDPA's math path does.
Grouped-query cases are passed enable_gqa=True, and only to a function whose signature takes it.
A check never stops at its first failure: the diagnosis needs the whole pattern (which cases
fail, which pass).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from attnrepro.audit.cases import DTYPES, Case, grid, logit_max, tolerance
from attnrepro.audit.float64_reference import HYPOTHESES, applies, reference

# what a finding's reading relies on (Finding.via): the weights read off through values = identity, a boolean attn_mask
IDENTITY, BOOL_MASK = "identity values", "boolean attn_mask"


class Unsupported(Exception):
    pass


class CallFailed(Exception):
    def __init__(self, message: str, cause: str = "", headline: str = ""):
        super().__init__(message)
        self.cause = cause  # "raises:<Type>", "output_transposed", "wrong_dtype", or "" (a wrong shape)
        self.headline = headline

    @property
    def data(self) -> dict:
        return {"headline": self.headline} if self.headline else {}


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}".rstrip(": ")


def raised(what: str, e: BaseException, where: str = "") -> CallFailed:
    line = first_line(e)
    return CallFailed(f"{what}: {where}raised {line}", f"raises:{type(e).__name__}",
                      f"raises {line}" + (f" (in {where.strip()})" if where else ""))


def layout(got: tuple, want: tuple, names=("B", "H", "L", "Ev")) -> str:
    """`got` read as a permutation of `want`'s dimensions, e.g. "(B, L, H, Ev)"; "" when it is none."""
    if len(got) != len(want) or sorted(got) != sorted(want) or got == want:
        return ""
    left = list(range(len(want)))
    order = []
    for i, n in enumerate(got):
        j = i if i in left and want[i] == n else next(j for j in left if want[j] == n)
        left.remove(j)
        order.append(names[j] if len(want) == len(names) else f"dim {j}")
    return "(" + ", ".join(order) + ")"


def takes_gqa(fn: Callable) -> bool:
    """Whether fn accepts enable_gqa (SDPA's since torch 2.5): by name or **kwargs; a builtin without an
    introspectable signature (SDPA itself) is taken at its word."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "enable_gqa" or p.kind is p.VAR_KEYWORD for p in params)


@dataclass
class Finding:
    check: str
    severity: str  # fail | warn | unsupported | info
    symptom: str
    cause: str = ""  # a key of diagnose.CAUSES, "" when unknown
    smallest: str = ""  # the smallest input that shows it
    data: dict = field(default_factory=dict)
    via: tuple[str, ...] = ()  # IDENTITY, BOOL_MASK: what its reading relies on (a k/v swap spoils IDENTITY, ...)


@dataclass
class CheckResult:
    name: str
    findings: list[Finding] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        sev = {f.severity for f in self.findings}
        return "fail" if "fail" in sev else "pass"


@dataclass
class Impl:
    fn: Callable
    device: str = "cpu"
    gqa: bool = field(init=False)

    def __post_init__(self):
        self.gqa = takes_gqa(self.fn)

    def call(self, q, k, v, kw, what: str):
        try:
            out = self.fn(q, k, v, **kw)
        except NotImplementedError as e:
            raise Unsupported(f"{what}: {e or 'NotImplementedError'}") from None
        except Exception as e:
            raise raised(what, e) from None
        if isinstance(out, torch.Tensor) and not any(t.requires_grad for t in (q, k, v)):
            out = out.detach()  # a module's own parameters (nn.MultiheadAttention) need no graph here
        want = q.shape[:-1] + (v.shape[-1],)
        if not isinstance(out, torch.Tensor):
            raise CallFailed(f"{what}: returned {type(out).__name__}, expected a tensor")
        if out.shape != want:
            perm = layout(tuple(out.shape), tuple(want))
            if perm:
                head = f"output transposed: returned {perm} where SDPA returns (B, H, L, Ev)"
                raise CallFailed(f"{what}: {head}, shape {tuple(out.shape)} for {tuple(want)}", "output_transposed",
                                 head)
            raise CallFailed(f"{what}: returned shape {tuple(out.shape)}, expected {tuple(want)}")
        if out.dtype != q.dtype:
            raise CallFailed(f"{what}: returned {out.dtype} for {q.dtype} inputs", "wrong_dtype")
        return out


def _err(x: torch.Tensor, r: torch.Tensor) -> float:
    """max |x - r|, with a non-finite x where r is finite counting as infinite."""
    d = (x.double() - r).abs()
    d = torch.where(torch.isfinite(x.double()) | ~torch.isfinite(r), d, torch.full_like(d, math.inf))
    return torch.nan_to_num(d, nan=math.inf).max().item() if d.numel() else 0.0


# ---------------------------------------------------------------- (a) parity

def run_case(impl: Impl, case: Case) -> dict:
    """Forward (and backward) of one case against the float64 reference: error / tolerance ratios."""
    q, k, v, kw, d_out = case.inputs(impl.device)
    dt = DTYPES[case.dtype]
    lmax = logit_max(q, k, case.scale)
    tol = tolerance(dt, case.E, case.S, lmax, v.double().abs().max().item())
    ref = reference(q, k, v, **kw)
    leaves = [t.detach().requires_grad_(case.grad) for t in (q, k, v)]
    with torch.set_grad_enabled(case.grad):
        out = impl.call(*leaves, kw, case.label)
    row = {"case": case.label, "fwd": _err(out.detach(), ref) / tol, "out": out.detach()}
    if case.grad:
        if not out.requires_grad:
            raise CallFailed(f"{case.label}: the output does not require grad (no backward)")
        try:
            grads = torch.autograd.grad(out, leaves, d_out)
        except Exception as e:
            raise raised(case.label, e, "backward ") from None
        rleaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        rgrads = torch.autograd.grad(reference(*rleaves, **kw), rleaves, d_out.double())
        # R for a gradient: max|ref|, floored at max|d_out| max|v| (the size of d(weights)), as a gradient that
        # is exactly 0 in float64 (one visible key: the softmax is constant) is rounding noise in any other dtype
        floor = d_out.double().abs().max().item() * v.double().abs().max().item()
        row["bwd"] = max(_err(g, r) / tolerance(dt, case.E, case.S, lmax, max(r.abs().max().item(), floor))
                         for g, r in zip(grads, rgrads))
    return row


def hypothesis_ratios(out: torch.Tensor, case: Case, device: str, hypotheses=tuple(HYPOTHESES)) -> dict[str, float]:
    """error / tolerance of the output against each hypothesis (one of the chapter's bugs, ...)."""
    q, k, v, kw, _ = case.inputs(device)
    tol = tolerance(DTYPES[case.dtype], case.E, case.S, logit_max(q, k, case.scale), v.double().abs().max().item())
    return {h: _err(out, reference(q, k, v, **kw, variant=h)) / tol if applies(h, q, k, v) else math.inf
            for h in hypotheses}


def parity(impl: Impl, full: bool = False) -> CheckResult:
    res = CheckResult("parity")
    rows = []
    cases = grid(full)
    skipped = [c for c in cases if c.gqa and not impl.gqa]
    if skipped:
        res.findings.append(Finding("parity", "info", "grouped-query attention not supported: the signature takes "
                                    f"no enable_gqa, so the {len(skipped)} cases whose key/value have fewer heads than "
                                    "the query (1: multi-query, 2: grouped-query) did not run"))
    outcomes = dict.fromkeys(("raised", "wrong output", "unsupported", "optional"), 0)  # cases that gave no row
    for case in cases:
        if case in skipped:
            continue
        try:
            row = run_case(impl, case)
        except (Unsupported, CallFailed) as e:
            crashed = isinstance(e, CallFailed) and e.cause.startswith("raises:")
            if case.optional and (isinstance(e, Unsupported) or crashed):
                outcome = "optional"
                res.findings.append(Finding("parity", "info", (
                    f"declines is_causal with attn_mask ({e})" if isinstance(e, Unsupported) else
                    f"is_causal with attn_mask, which SDPA's math path refuses too ({e})") + ": optional, not checked"))
            elif isinstance(e, Unsupported):
                outcome = "unsupported"
                res.findings.append(Finding("parity", "unsupported", str(e)))
            else:
                outcome = "raised" if crashed else "wrong output"
                res.findings.append(Finding("parity", "fail", str(e), cause=e.cause, smallest=case.label, data=e.data))
            outcomes[outcome] += 1
            continue
        row["ok"] = row["fwd"] <= 1 and row.get("bwd", 0.0) <= 1
        row["case_obj"] = case
        rows.append(row)
    res.details["cases"] = [{k: v for k, v in r.items() if k not in ("case_obj", "out")} for r in rows]
    res.details.update(outcomes, grid_size=len(cases) - len(skipped), gqa_not_supported=len(skipped))
    bad = [r for r in rows if not r["ok"]]
    if bad:
        cause = consistent_hypothesis(rows, impl.device)
        worst = max(bad, key=lambda r: max(r["fwd"], r.get("bwd", 0.0)))
        smallest = shrink(impl, min(bad, key=lambda r: r["case_obj"].size)["case_obj"], cause)
        what = "forward" if any(r["fwd"] > 1 for r in bad) else "backward only"
        res.findings.append(Finding(
            "parity", "fail",
            f"{len(bad)} of {len(rows)} cases differ from the float64 reference ({what}; worst "
            f"{max(worst['fwd'], worst.get('bwd', 0.0)):.3g}x the tolerance, {worst['case']})",
            cause=cause, smallest=smallest,
            data={"failing": [r["case"] for r in bad], "hypothesis": cause}))
    return res


def consistent_hypothesis(rows: list[dict], device: str) -> str:
    """The bug whose float64 output every case's output matches (within tolerance), else "". Every hypothesis is
    computed on the failing cases, and only those that match them all on the passing ones (the bulk of the cost)."""
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        r["hyp"] = hypothesis_ratios(r["out"], r["case_obj"], device)
    fits = [h for h in HYPOTHESES if h != "correct" and all(r["hyp"][h] <= 1 for r in bad)]
    for r in rows:
        if r["ok"] and fits:
            ratios = hypothesis_ratios(r["out"], r["case_obj"], device, fits)
            fits = [h for h in fits if ratios[h] <= 1]
    if fits:
        return fits[0]
    failing = [r for r in bad if r["fwd"] > 1]
    votes: dict[str, int] = {}
    for r in failing:
        best = min(r["hyp"], key=r["hyp"].get)
        if r["hyp"][best] <= 1 and best != "correct":
            votes[best] = votes.get(best, 0) + 1
    return max(votes, key=votes.get) if votes and max(votes.values()) == len(failing) else ""


def _fails(impl: Impl, case: Case, cause: str) -> bool:
    try:
        row = run_case(impl, case.with_shape(grad=False))
    except (Unsupported, CallFailed):
        return False
    if row["fwd"] <= 1:
        return False
    return not cause or hypothesis_ratios(row["out"], case, impl.device)[cause] <= 1


def shrink(impl: Impl, case: Case, cause: str) -> str:
    """The smallest shape (greedy, one dimension at a time) at which the case still fails the same way."""
    if not _fails(impl, case, cause):
        return case.label
    tied = case.mask == "causal" and case.L == case.S
    for dim in ("B", "H", "L", "S", "E", "Ev"):
        if tied and dim == "S":
            continue
        for value in range(1, getattr(case, dim)):
            trial = case.with_shape(**{dim: value}, **({"S": value} if tied and dim == "L" else {}))
            if trial.valid and _fails(impl, trial, cause):
                case = trial
                break
    return case.label


# ---------------------------------------------------------------- (b) invariants

def _tol(q, k, v, scale=None) -> float:
    return tolerance(q.dtype, q.shape[-1], k.shape[-2], logit_max(q, k, scale), v.double().abs().max().item())


def future_influence(impl: Impl, T: int = 16, E: int = 16, explicit: bool = False) -> list[float]:
    """influence[d] (d = 1..T-1): the largest change of a causal row i, in tolerances, when the key and
    value at position i + d are perturbed."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, T, E, generator=g).to(impl.device) for _ in range(3))
    kw = ({"attn_mask": torch.ones(T, T, dtype=torch.bool, device=impl.device).tril()} if explicit
          else {"is_causal": True})
    what = f"causal rows, {'explicit tril mask' if explicit else 'is_causal'}, T={T}"
    base = impl.call(q, k, v, kw, what)
    tol = _tol(q, k, v)
    influence = [0.0] * T
    for j in range(1, T):
        k2, v2 = k.clone(), v.clone()
        k2[..., j, :] += 3 * torch.randn(E, generator=g).to(impl.device)
        v2[..., j, :] += 3 * torch.randn(E, generator=g).to(impl.device)
        out = impl.call(q, k2, v2, kw, what)
        for i in range(j):
            influence[j - i] = max(influence[j - i], _err(out[..., i, :], base[..., i, :].double()) / tol)
    return influence[1:]


def observed_weights(impl: Impl, q, k, kw, what: str) -> Optional[torch.Tensor]:
    """The weights an implementation applies, read off by passing the identity matrix as the values
    (out = W @ I = W); None when it is not linear in the values (then weights are not observable)."""
    S = k.shape[-2]
    eye = torch.eye(S, dtype=q.dtype, device=q.device).expand(*k.shape[:-2], S, S)
    w = impl.call(q, k, eye, kw, what + " (values = identity)")
    w2 = impl.call(q, k, 2 * eye, kw, what + " (values = 2 x identity)")
    if _err(w2, 2 * w.double()) > 1e-4 * max(1.0, w.double().abs().max().item()):
        return None
    return w


FILL_LADDER = [0.0] + [-(10.0 ** p) for p in range(0, 39)] + [-torch.finfo(torch.float32).max]  # its min: a common fill


def _masked_share(impl: Impl, xs: list[float]) -> torch.Tensor:
    """(w_visible, w_masked) per row: row r has one visible key with logit xs[r] and one masked key with
    logit 0 (E = 2 = Ev, the values being the identity: q = (x sqrt(2), 0), k = ((1, 0), (0, 0)))."""
    q = torch.tensor([[x * math.sqrt(2), 0.0] for x in xs], dtype=torch.float32).view(1, 1, -1, 2).to(impl.device)
    k = torch.tensor([[1.0, 0.0], [0.0, 0.0]]).view(1, 1, 2, 2).to(impl.device)
    mask = torch.tensor([True, False], device=impl.device).expand(len(xs), 2)
    w = observed_weights(impl, q, k, {"attn_mask": mask}, "a masked key's fill value")
    return torch.zeros(len(xs), 2) if w is None else w[0, 0].double().cpu()


def fill_value(impl: Impl, rounds: int = 40) -> Optional[float]:
    """The finite score a masked key gets (None when none is found down to -1e38): a masked key's weight
    over a visible one's is exp(fill - x), so fill = x + log(ratio) wherever both are positive; x is
    bracketed on a ladder from 0 to -1e38, then bisected (the masked weight is 0 while x >> fill, the
    visible one while x << fill)."""
    xs = FILL_LADDER
    for _ in range(rounds):
        w = _masked_share(impl, xs)
        both = (w > 0).all(-1)
        if both.any():
            r = int(torch.argmin((torch.log(w[:, 1] / w[:, 0]).abs() + ~both * math.inf)))
            fill = xs[r] + math.log(w[r, 1] / w[r, 0])
            return 0.0 if abs(fill) < 1e-3 else fill
        above = [x for x, row in zip(xs, w) if row[1] == 0 and row[0] > 0]  # x well above the fill
        below = [x for x, row in zip(xs, w) if row[0] == 0 and row[1] > 0]
        if not above or not below:
            return None
        hi, lo = min(above), max(below)
        if hi - lo <= max(1.0, 1e-6 * abs(lo)):
            return (hi + lo) / 2
        xs = [lo + (hi - lo) * t / 15 for t in range(16)]
    return None


def fully_masked_row(impl: Impl) -> list[Finding]:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g).to(impl.device) for _ in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask[2] = False  # row 2 sees nothing
    kw = {"attn_mask": mask.to(impl.device)}
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = impl.call(*leaves, kw, "a fully masked row")
    # the other rows, against the implementation's own output with row 2 given one key
    mask_one = mask.clone()
    mask_one[2, 0] = True
    own = impl.call(q, k, v, {"attn_mask": mask_one.to(impl.device)}, "the same rows, none fully masked")
    rows = [0, 1, 3, 4, 5]
    row, others, own_others = out[..., 2, :].detach(), out[..., rows, :].detach(), own[..., rows, :].double()
    smallest = "B=1 H=1 L=S=1 E=1, attn_mask=[[False]]"
    found = []
    if _err(others, own_others) > _tol(q, k, v):
        found.append(Finding("invariants", "fail", "a fully masked row changes the other rows' outputs",
                             smallest="L=S=6, one row of attn_mask all False", via=(BOOL_MASK,)))
    if torch.isfinite(row).all() and row.abs().max().item() > 0:
        fill = fill_value(impl)
        cause = "finite_fill" if fill is None else "mask_zero" if fill == 0 else f"mask_fill:{fill:.3g}"
        found.append(Finding("invariants", "fail", "a fully masked row returns a finite non-zero output: it "
                             "averages values it was told not to see (masked scores filled with "
                             + ("a finite value" if fill is None else f"{fill:.3g}") + ")",
                             cause=cause, smallest=smallest, data={"fill": fill}, via=(IDENTITY, BOOL_MASK)))
    elif not torch.isfinite(row).all():
        d_out = torch.ones_like(out)
        d_out[..., 2, :] = 0  # the masked row takes no part in the loss
        grads = torch.autograd.grad(out, leaves, d_out, allow_unused=True)
        poisoned = any(gr is not None and not torch.isfinite(gr).all() for gr in grads)
        found.append(Finding("invariants", "warn", "a fully masked row returns NaN (the softmax of an all -inf "
                             "row); SDPA returns 0" + ("; the NaN also reaches the gradients of k and v even "
                                                      "with no loss on that row" if poisoned else ""),
                             smallest=smallest))
    return found


def _leaks(impl: Impl, res: CheckResult) -> None:
    for explicit in (False, True):
        name = "explicit_mask" if explicit else "is_causal"
        infl = future_influence(impl, explicit=explicit)
        res.details[f"future_influence_{name}"] = infl
        leaks = [d + 1 for d, x in enumerate(infl) if x > 1]
        if leaks:
            how = (f"offset {leaks[0]}" if len(leaks) == 1 else
                   f"every offset 1-{leaks[-1]}" if leaks == list(range(1, len(infl) + 1)) else
                   "offsets " + ", ".join(map(str, leaks)))
            cause = "future_leak_all" if len(leaks) == len(infl) else f"future_leak_{leaks[-1]}"
            res.findings.append(Finding(
                "invariants", "fail", f"future leak at {how} ({'attn_mask=tril' if explicit else 'is_causal'}): "
                f"perturbing key/value i+{leaks[0]} changes causal row i by {infl[leaks[0] - 1]:.3g}x the tolerance",
                cause=cause, smallest=f"B=1 H=1 L=S={leaks[0] + 1}: row 0 changes with key {leaks[0]}",
                data={"offsets": leaks}, via=(BOOL_MASK,) if explicit else ()))


def _permutation(impl: Impl, res: CheckResult) -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=g).to(impl.device) for _ in range(3))
    base = impl.call(q, k, v, {}, "permutation, no mask")
    perm = torch.randperm(12, generator=g).to(impl.device)
    moved = impl.call(q, k[..., perm, :], v[..., perm, :], {}, "permutation of keys and values")
    qmoved = impl.call(q[..., perm, :], k, v, {}, "permutation of queries")
    e_kv = _err(moved, base.double()) / _tol(q, k, v)
    e_q = _err(qmoved, base[..., perm, :].double()) / _tol(q, k, v)
    res.details["permutation_kv"], res.details["permutation_q"] = e_kv, e_q
    if e_kv > 1 or e_q > 1:
        res.findings.append(Finding("invariants", "fail", "without a mask the output depends on the order of the "
                                    f"{'keys and values' if e_kv > 1 else 'queries'} ({max(e_kv, e_q):.3g}x the "
                                    "tolerance): a positional term the SDPA contract does not have",
                                    cause="not_equivariant", smallest="B=1 H=1 L=S=2, keys swapped"))


def _independence(impl: Impl, res: CheckResult) -> None:
    """Output (b, h, i) may depend on query (b, h, i) only: perturb one query and see which outputs move.
    Another head moving is a reshape that mixes heads; another row, one that mixes queries. Either makes
    the per-row checks (a future leak, a permutation) measure the mixing instead."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 3, 8, 8, generator=g).to(impl.device) for _ in range(3))
    base = impl.call(q, k, v, {}, "independence of heads and rows, no mask")
    q2 = q.clone()
    q2[1, 1, 5] += 3 * torch.randn(8, generator=g).to(impl.device)
    moved = (impl.call(q2, k, v, {}, "one query perturbed (batch 1, head 1, row 5)").double() - base.double()).abs()
    tol = _tol(q, k, v)
    heads = [h for h in range(3) if h != 1 and moved[1, h].max().item() > tol]
    rows = [i for i in range(8) if i != 5 and moved[1, 1, i].max().item() > tol]
    batches = moved[0].max().item() > tol
    res.details["moved_by_one_query"] = {"other_heads": heads, "other_rows": rows, "other_batch": batches}
    if heads or batches:
        res.findings.append(Finding("invariants", "fail", "perturbing one query (batch 1, head 1, row 5) moves the "
                                    "output of " + ("another batch element" if batches else f"head(s) {heads}")
                                    + ": heads (or batch elements) are mixed, a reshape or transpose of the "
                                    "(B, H, L, E) layout", cause="heads_mixed",
                                    smallest="B=2 H=3 L=S=8 E=8, query (1, 1, 5) perturbed"))
    elif rows:
        res.findings.append(Finding("invariants", "fail", f"perturbing query 5 moves output rows {rows}: queries "
                                    "are mixed (a reshape, or a softmax or normalisation across queries)",
                                    cause="queries_mixed", smallest="B=2 H=3 L=S=8 E=8, query (1, 1, 5) perturbed"))


def _row_sums(impl: Impl, res: CheckResult) -> None:
    g = torch.Generator().manual_seed(9)
    bad_sums: dict[str, tuple[float, float]] = {}
    columns_sum_to_one = True
    for mask in ("none", "causal"):
        q, k = (torch.randn(1, 2, 16, 16, generator=g).to(impl.device) for _ in range(2))
        w = observed_weights(impl, q, k, {"is_causal": True} if mask == "causal" else {}, f"weights, {mask} mask")
        if w is None:
            res.findings.append(Finding("invariants", "info", "not linear in the values: weights not observable"))
            return
        sums = w.double().sum(-1)
        tol = _tol(q, k, torch.ones(1))
        res.details[f"row_sum_{mask}"] = [sums.min().item(), sums.max().item()]
        res.details[f"min_weight_{mask}"] = w.double().min().item()
        if (sums - 1).abs().max().item() > tol:
            bad_sums[mask] = (sums.min().item(), sums.max().item())
        columns_sum_to_one &= (w.double().sum(-2) - 1).abs().max().item() <= tol or mask == "causal"
        if w.double().min().item() < -tol:
            res.findings.append(Finding("invariants", "fail", f"negative weights (min {w.min().item():.3g}, "
                                        f"{mask} mask)", via=(IDENTITY,)))
    if bad_sums:
        lo, hi = next(iter(bad_sums.values()))
        after = all(abs(x * math.sqrt(16) - 1) < 0.01 for pair in bad_sums.values() for x in pair)
        axis = columns_sum_to_one and not after
        sums = f"{lo:.4g}" if after else f"{lo:.3g}..{hi:.3g}"
        res.findings.append(Finding(
            "invariants", "fail", f"rows of the weights sum to {sums}, not 1 ("
            + " and ".join(f"{m} mask" for m in bad_sums)
            + ("; 1/sqrt(d_k) at d_k = 16)" if after else "; each column sums to 1: the softmax ran over the "
               "queries)" if axis else ")"),
            cause="scale_after_softmax" if after else "softmax_axis" if axis else "",
            smallest=f"B=1 H=1 L=S=1 E=16: the single weight is {lo:.4g}" if after else
            "B=1 H=1 L=S=2: the rows of the weights do not sum to 1", via=(IDENTITY,)))


def _kv_swap(impl: Impl, res: CheckResult) -> None:
    """Key and value swapped (softmax(q v^T) k): with the identity as the value a correct function returns the
    weights W = softmax(q k^T s); a swapped one returns them when the identity is passed as the key and k as the
    value instead. With values of another width than the keys, a swapped function cannot even run."""
    g = torch.Generator().manual_seed(12)
    q, k = (torch.randn(1, 2, n, 8, generator=g).to(impl.device) for n in (6, 8))
    eye = torch.eye(8, device=impl.device).expand(1, 2, 8, 8)
    weights = reference(q, k, eye)
    tol = _tol(q, k, eye)
    as_value = _err(impl.call(q, k, eye, {}, "values = identity"), weights) / tol
    as_key = _err(impl.call(q, eye, k, {}, "keys = identity, values = k"), weights) / tol
    res.details["kv_swap_probe"] = {"identity_as_value": as_value, "identity_as_key": as_key}
    if as_value <= 1 or as_key > 1:
        return
    try:
        impl.call(q, k, torch.randn(1, 2, 8, 3, generator=g).to(impl.device), {}, "values 3 wide, keys 8")
        wide = ""
    except (CallFailed, Unsupported) as e:
        wide = f"; with values 3 wide for keys 8 wide it fails ({str(e).partition(': ')[2]})"
    res.findings.append(Finding("invariants", "fail", "with the identity as the value the output is not the weights "
                                f"({as_value:.3g}x the tolerance), with the identity as the key and k as the value it "
                                f"is: key and value swapped{wide}", cause="kv_swapped",
                                smallest="B=1 H=1 L=1 S=E=Ev=2, values = identity"))


def guarded(res: CheckResult, part: Callable[[], object]) -> None:
    """Run one part of a check: an unsupported case is noted, a call that raises is a failure."""
    try:
        part()
    except Unsupported as e:
        res.findings.append(Finding(res.name, "unsupported", str(e)))
    except CallFailed as e:
        res.findings.append(Finding(res.name, "fail", str(e), cause=e.cause, smallest=str(e).split(": ")[0],
                                    data=e.data))


def invariants(impl: Impl) -> CheckResult:
    res = CheckResult("invariants")
    for part in (_independence, _leaks, _permutation, _row_sums, _kv_swap):
        guarded(res, lambda: part(impl, res))
    guarded(res, lambda: res.findings.extend(fully_masked_row(impl)))
    return res


# ---------------------------------------------------------------- (c) numerics

LADDER = (2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 300.0, 1e3, 3e3, 1e4, 3e4)


def logit_inputs(logit: float, dtype: torch.dtype, device: str, E: int = 16, T: int = 8):
    """q, k, v whose largest scaled logit is `logit` (q_0 . k_0 = E, others spread in [-E, E])."""
    g = torch.Generator().manual_seed(6)
    u = torch.randint(0, 2, (1, 1, T, E), generator=g).double() * 2 - 1
    w = torch.randint(0, 2, (1, 1, T, E), generator=g).double() * 2 - 1
    w[..., 0, :] = u[..., 0, :]
    c = math.sqrt(logit * math.sqrt(E) / E)  # scale 1/sqrt(E): scaled logit of (q_0, k_0) = c^2 E / sqrt(E)
    v = torch.randn(1, 1, T, E, generator=g)
    return (c * u).to(dtype).to(device), (c * w).to(dtype).to(device), v.to(dtype).to(device)


def _overflows(impl: Impl, logit: float, dtype: torch.dtype) -> tuple[bool, float]:
    """(non-finite output where the reference is finite, error / tolerance) at this logit, with and
    without a causal mask."""
    bad, ratio = False, 0.0
    for kw in ({}, {"is_causal": True}):
        q, k, v = logit_inputs(logit, dtype, impl.device)
        out = impl.call(q, k, v, kw, f"logits up to {logit:g}, {dtype}")
        bad |= not torch.isfinite(out).all().item()
        ratio = max(ratio, _err(out, reference(q, k, v, **kw)) / _tol(q, k, v))
    return bad, ratio


def numerics(impl: Impl, dtypes=("fp32", "fp16", "bf16")) -> CheckResult:
    res = CheckResult("numerics")
    for name in dtypes:
        guarded(res, lambda: _numerics(impl, name, res))
    return res


def _numerics(impl: Impl, name: str, res: CheckResult) -> None:
    dt = DTYPES[name]
    first, worst, base = None, 0.0, None
    for logit in LADDER:
        bad, ratio = _overflows(impl, logit, dt)
        base = ratio if base is None else base
        worst = max(worst, ratio) if not bad else worst
        if bad:
            first = logit
            break
    res.details[name] = {"largest_logit_tested": LADDER[-1], "first_non_finite": first,
                         "worst_error_ratio": worst}
    if first is None:
        if worst > 1 and base <= 1:  # wrong already at small logits: parity's finding, not a numerical one
            res.findings.append(Finding("numerics", "fail", f"{name}: finite but wrong at large logits "
                                        f"({worst:.3g}x the tolerance)"))
        return
    lo, hi = ([x for x in LADDER if x < first] or [0.0])[-1], first
    for _ in range(14):  # bisect the threshold
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _overflows(impl, mid, dt)[0] else (mid, hi)
    ln_max = math.log(torch.finfo(dt).max)
    cause = ("no_stable_softmax" if abs(hi / ln_max - 1) < 0.15 else
             "scores_overflow" if hi * math.sqrt(16) > 0.3 * torch.finfo(dt).max else "")
    res.details[name]["threshold"] = hi
    head = f"{name} overflow above logit {hi:.4g}"
    what = {"no_stable_softmax": f" (ln of {name}'s max is {ln_max:.4g}: exp without max-subtraction; fix: "
                                 "subtract the row maximum before exp)",
            "scores_overflow": f": q k^T (logit x sqrt(16) = {hi * math.sqrt(16):.3g}) exceeds {name}'s max "
                               f"{torch.finfo(dt).max:.5g} before the scale; fix: scale q before q k^T, or "
                               "compute q k^T in float32"}.get(cause, "")
    res.findings.append(Finding(
        "numerics", "fail", f"{head}: inf/nan where the float64 reference is finite{what}",
        cause=cause, smallest=f"B=1 H=1 L=S=8 E=16, largest logit {hi:.4g}, {name}",
        data={"dtype": name, "threshold": hi, "headline": f"{head}: q k^T exceeds {name}'s range before the "
              "scale (fix: scale q before q k^T, or compute q k^T in float32)" if cause == "scores_overflow"
              else ""}))


# ---------------------------------------------------------------- (d) scale

def effective_scale(w: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> float:
    """The multiplier the implementation applies to q.k before its softmax: the slope of log w
    against the raw dot products, per row (over weights that did not underflow), median over rows."""
    logw = torch.log(w.double().clamp_min(1e-300))
    raw = (q.double() @ k.double().transpose(-2, -1))
    ok = w.double() > 1e-30
    slopes = []
    for r in range(w.shape[-2]):
        x, y = raw[0, 0, r][ok[0, 0, r]], logw[0, 0, r][ok[0, 0, r]]
        if len(x) >= 3 and x.std() > 0:
            slopes.append(float(np.polyfit(x.numpy(), y.numpy(), 1)[0]))
    return float(np.median(slopes)) if slopes else math.nan


def scale_check(impl: Impl, d_heads=(16, 32, 64, 128, 256)) -> CheckResult:
    """The logit std as d_head grows, with scale=None and scale=1: which power of d_k divides the logits,
    and whether the `scale` argument is honoured. The weights are read off with values = identity
    (S = d_head keys, so the value width equals the key width)."""
    res = CheckResult("scale")
    guarded(res, lambda: _scale(impl, d_heads, res))
    for f in res.findings:
        f.via = f.via or (IDENTITY,)
    return res


def _scale(impl: Impl, d_heads, res: CheckResult) -> None:
    g = torch.Generator().manual_seed(8)
    rows = []
    for d in d_heads:
        q, k = torch.randn(1, 1, 8, d, generator=g), torch.randn(1, 1, d, d, generator=g)
        row = {"d_head": d, "raw_std": (q @ k.transpose(-2, -1)).std().item()}
        for label, scale in (("default", None), ("scale1", 1.0)):
            w = observed_weights(impl, q.to(impl.device), k.to(impl.device), {"scale": scale},
                                 f"scale probe d_head={d} scale={scale}")
            if w is None:
                res.findings.append(Finding("scale", "info", "not linear in the values: the scale is not observable"))
                return
            a = effective_scale(w.cpu(), q, k)
            row[f"{label}_multiplier"] = a
            row[f"{label}_logit_std"] = a * row["raw_std"]
            row[f"{label}_row_sum"] = w.double().sum(-1).mean().item()
            row[f"{label}_row_sum_spread"] = (w.double().sum(-1).amax() - w.double().sum(-1).amin()).item()
        rows.append(row)
    res.details["rows"] = rows
    d = np.array(d_heads, float)
    mult = np.array([r["default_multiplier"] for r in rows])
    p = -float(np.polyfit(np.log(d), np.log(mult), 1)[0])  # multiplier ~ d^-p
    res.details["exponent"] = p
    sums = np.array([r["default_row_sum"] for r in rows])
    after = bool(np.allclose(sums, d ** -0.5, rtol=0.02))
    tol = 0.05
    if not after and max(abs(r["default_row_sum"] - 1) + r["default_row_sum_spread"] for r in rows) > 0.02:
        res.findings.append(Finding("scale", "info", "the rows of the weights do not sum to 1 (see invariants): "
                                    "no single multiplier of q.k explains them, the scale is not read"))
        res.details["exponent_not_read"] = res.details.pop("exponent")
        return
    if after:
        res.findings.append(Finding("scale", "fail", f"the logits are divided by d_k^{p:.2f} before the softmax and "
                                    f"the weights sum to 1/sqrt(d_k) after it ({sums[0]:.4g} at d_k={d_heads[0]}): "
                                    "the scale is applied after the softmax", cause="scale_after_softmax",
                                    smallest=f"B=1 H=1 L=1 S=E={d_heads[0]}: the weights sum to {sums[0]:.4g}"))
    elif abs(p - 1) < tol:
        res.findings.append(Finding("scale", "fail", f"the logits are divided by d_k^{p:.2f}, not sqrt(d_k): logit std "
                                    f"{rows[-1]['default_logit_std']:.3g} at d_k={d_heads[-1]} (correct: about 1)",
                                    cause="dk_not_sqrt", smallest="B=1 H=1 L=1 S=E=16"))
    elif abs(p) < tol:
        res.findings.append(Finding("scale", "fail", f"the logits are not scaled (logit std "
                                    f"{rows[-1]['default_logit_std']:.3g} at d_k={d_heads[-1]}, growing as sqrt(d_k))",
                                    cause="unscaled", smallest="B=1 H=1 L=1 S=E=16"))
    elif abs(p - 0.5) > tol or abs(mult[0] * math.sqrt(d_heads[0]) - 1) > 0.02:
        res.findings.append(Finding("scale", "fail", f"the logits are multiplied by {mult[0]:.4g} at d_k={d_heads[0]} "
                                    f"(d_k^-{p:.2f}); expected 1/sqrt(d_k) = {d_heads[0] ** -0.5:.4g}"))
    s1 = np.array([r["scale1_multiplier"] for r in rows])
    if not after and not np.allclose(s1, 1.0, rtol=0.02):
        res.findings.append(Finding("scale", "fail", f"scale=1.0 gives a multiplier of {s1[0]:.4g} at "
                                    f"d_k={d_heads[0]}: the `scale` argument is not honoured",
                                    cause="scale_ignored", smallest=f"B=1 H=1 L=1 S=E={d_heads[0]}, scale=1.0"))
