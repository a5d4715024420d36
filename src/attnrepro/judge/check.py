"""`attnrepro check`: does this run reproduce the committed reference run?

The reference is what a git revision holds (default HEAD; attnrepro.judge.revision): claims.yaml
and the predicates of src/attnrepro/judge/conclusions.py, metrics/*.json, the seed distributions metrics/dist/*.json, the machine records
metrics/env/*.json, params.yaml and metrics/claims.json. The working tree supplies only the
run: its metrics, which must still be what dvc.lock recorded (else "edited after the run"),
and its env records, which must describe this machine (the live one) unless the user says
where the run was made (--made-on). Claims, predicates or params edited in the working tree are
listed in the first lines and never used. Each stage's metrics file gets one of two verdicts:

  exact        the run was made on the reference's kind of machine (same CPU model, torch,
               Python, device as the reference's record, by the live machine; the thread
               count the stage ran with) with the same params: every metric must be identical
               (timings aside), as reruns on one machine are byte-identical.
  statistical  otherwise (another CPU changes the float order; other params): a metric with
               a seed distribution must fall in its prediction interval for one new run at
               alpha = 0.05 family-wise (Holm's step-down over the headline metrics, and again over
               the others; `families`), on the log scale for attention statistics
               (attnrepro.stats); where this run has seeds of its own (the seeds rerun), they
               must also pass a test against the reference's seeds, as MLPerf judges convergence:
               paired by seed where they are the reference's seeds and the reference's float-order
               profile makes pairing the stronger test (a shift beyond the drift measured between
               float orders, at least a tenth of a seed sd; `seeds_test`), else Welch's t-test of
               their recomputed summary; a metric without a distribution stays within its drift
               tolerance in the reference's claims.yaml. Seeds remade by a stage judged
               statistically are tested so even where the metrics file they belong to is judged
               exactly (its own stage not rerun: `remade_seeds`).

Then the reference's claims, recomputed from the raw metrics of this run and of the
reference's seeds: every checksum must hold; every conclusion must come out as on the
reference (its metrics/claims.json): one the reference reproduces must hold, one it reports
"not reproduced" must not start to hold on this run unnoticed (something moved). Values are
reported, never gated. The first line of the output is the verdict.
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from attnrepro.config import UserError
from attnrepro.envinfo import environment
from attnrepro.files import dvc_entry, dvc_stages, read_json, read_params, read_yaml_or_none
from attnrepro.formatting import fmt_number
from attnrepro.judge.claims import (CONCLUSIONS, ClaimResult, Expectations, Tol, band, counts, cuda_run, evaluate_all,
                                    evaluate_claim, load, load_dists, load_envs, load_metrics_dir, seed_values)
from attnrepro.judge.revision import (FLOAT_ORDER, Reference, Revision, claims_changes, get_leaf, key_leaves, listed,
                                      lock_findings, norm_param, params_changes, reference)
from attnrepro.measure.head_matching import heads_renamed, seeds_renamed
from attnrepro.run.execute import NUMERICS
from attnrepro.stats import (ALPHA, FLOAT_ORDER_RATIO, FLOAT_ORDER_TOL, Band, flatten, holm_step_down, paired_t_p,
                             t_quantile)
from attnrepro.store.run_store import recorded_key

# what decides whether a rerun must be byte-identical: the machine's float order and the software
MACHINE_KEYS = ("cpu", "cpu_capability", "torch", "python", "torch_threads", "device", "cuda_available", "cuda_version",
                "cudnn_version", "gpu_name", "runs_on")
# what says which machine and build made an env record: the live machine's must agree
IDENTITY_KEYS = ("cpu", "cpu_capability", "torch", "python")
# how a stage ran on that machine: only its env record knows
RUN_KEYS = ("torch_threads", "device", "runs_on")


def _resolve(text: str, params: dict) -> str:
    """dvc.yaml templating: ${a.b} from params (left as is when params lack it)."""
    def look(m):
        v = params
        for k in m.group(1).split("."):
            v = v.get(k) if isinstance(v, dict) else None
        return m.group(0) if v is None or isinstance(v, (dict, list)) else str(v)
    return re.sub(r"\$\{([^}]+)\}", look, text)


def dist_producers(root: Path, metrics_dir: str = "metrics") -> dict[str, str]:
    """{seed distribution's file stem: the metrics file of the stage that writes it} (dvc.yaml)."""
    out = {}
    for st in dvc_stages(root, required=False).values():
        st = st.get("do", st)
        paths = [dvc_entry(o)[0] for k in ("outs", "metrics") for o in st.get(k) or []]
        own = [Path(p).stem for p in paths if p.startswith(f"{metrics_dir}/") and p.count("/") == 1]
        for p in paths:
            if p.startswith(f"{metrics_dir}/dist/") and own:
                out[Path(p).stem] = own[0]
    return out


def file_stages(root: Path, params: dict) -> dict[str, set[str]]:
    """{metrics file: its stage and the stages upstream of it} (dvc.yaml)."""
    stages = dvc_stages(root, required=False)
    outs, deps = {}, {}
    for name, st in stages.items():
        st = st.get("do", st)
        outs[name] = [dvc_entry(o)[0] for k in ("outs", "metrics", "plots") for o in st.get(k) or []]
        deps[name] = [_resolve(dvc_entry(d)[0], params) for d in st.get("deps") or []]

    def upstream(name, seen):
        for other, paths in outs.items():
            if other not in seen and any(d == p or d.startswith(p + "/") for d in deps[name] for p in paths):
                seen.add(other)
                upstream(other, seen)
        return seen

    out: dict[str, set[str]] = {}
    for name in stages:
        for p in outs[name]:
            if p.startswith("metrics/") and p.endswith(".json") and p.count("/") == 1:
                out[Path(p).stem] = upstream(name, {name})
    return out


def made_with_other_params(root: Path, params: dict, reference_lock: dict, reference_params: dict) -> dict[str, list[str]]:
    """{metrics file: the params sections its stage, or a stage upstream of it, ran with otherwise than the
    reference's run of that stage}, read from the two dvc.lock files: the params the outputs were made with,
    never an edit of params.yaml no stage ran with. Only params.yaml's leaves, dotted keys split as nested
    ones; a leaf one lock lacks (a key added to a stage's params, an entry absent) counts with that
    revision's params.yaml value. A thread count is the machine's (torch_threads in the records), not the
    protocol's: a run on 2 threads keeps its float-order tolerances."""
    lock = read_yaml_or_none(root / "dvc.lock")
    lock = lock if isinstance(lock, dict) else {}

    def ran(d: dict, stage: str) -> dict:
        got = ((((d.get("stages") or {}).get(stage) or {}).get("params") or {}).get("params.yaml") or {})
        return {leaf: norm_param(v) for key, val in got.items()
                for leaf, v in key_leaves(val, tuple(str(key).split("."))).items()}

    differ: dict[str, set[str]] = {}
    out = {}
    for file, stages in file_stages(root, params).items():
        sections = set()
        for st in stages:
            if st not in differ:
                a, b = ran(lock, st), ran(reference_lock, st)
                differ[st] = {k[0] for k in set(a) | set(b) if k and k[-1] != "threads"
                              and a.get(k, norm_param(get_leaf(params, k)))
                              != b.get(k, norm_param(get_leaf(reference_params, k)))}
            sections |= differ[st]
        out[file] = sorted(sections)
    return out


# ---------------------------------------------------------------- the machine the run was made on

def live_environment(device: str) -> dict:
    """This machine, as envinfo records it (tests replace it)."""
    return environment(device)


def machine(env: Optional[dict]) -> dict:
    return {k: (env or {}).get(k) for k in MACHINE_KEYS}


def _described(env: dict, live: dict) -> Optional[str]:
    """Where an env record does not describe the live machine: "cpu AMD EPYC; this machine: Intel Xeon"."""
    keys = IDENTITY_KEYS + (("cuda_available", "gpu_name") if str(env.get("device", "")).startswith("cuda") else ())
    k = next((k for k in keys if env.get(k) != live.get(k)), None)
    return None if k is None else f"{k} {env.get(k)}; this machine: {live.get(k)}"


@dataclass
class Machines:
    of: dict[str, dict]  # metrics file -> the machine its results come from (MACHINE_KEYS)
    problems: list[str]
    notes: list[str]  # for the first lines (--made-on)


def machines(files, envs: dict, ref_envs: dict, made_on: Optional[str], live: Callable[[str], dict],
             env_dir: str) -> Machines:
    """The machine each metrics file's results come from. An env record equal to the reference's is
    the reference's own (its stage was not rerun): its machine. Another record must describe the
    live machine (cpu, capability, torch, python; CUDA and the GPU for a CUDA stage), whose values are used, with the threads,
    device and store provenance of the record; unless --made-on says the run was made elsewhere:
    then the records are taken as they are. A stage without a record is a problem, and judged as
    made like the reference (never the lenient mode by default). Raises UserError for a record
    of another machine without --made-on."""
    out = Machines({}, [], [])
    elsewhere = {}
    for f, env in sorted(envs.items()):
        why = None if env == ref_envs.get(f) else _described(env, live(str(env.get("device", "cpu"))))
        if why:
            elsewhere[f] = why
    first = next(iter(elsewhere.items()), None)
    if made_on is None and first:
        raise UserError(f"{env_dir}/{first[0]}.json says the run was made on another machine ({first[1]}"
                        + (f"; and {len(elsewhere) - 1} more records" if len(elsewhere) > 1 else "")
                        + '): judge it here only by saying where it was made: --made-on "<machine>"')
    if made_on is not None:
        out.notes.append(f"made on: {made_on} (--made-on): " + (f"its env records name another machine ({first[1]})"
                                                               if first else "its env records describe this machine"))
    for f in sorted(files):
        env = envs.get(f)
        if env is None and f in ref_envs:
            out.problems.append(f"{env_dir}/{f}.json is missing: the machine {f} ran on is unknown (judged as the "
                                "reference's)")
        if env is None or env == ref_envs.get(f) or made_on is not None:
            out.of[f] = machine(env if env is not None else ref_envs.get(f))
        else:
            out.of[f] = {**machine(live(str(env.get("device", "cpu")))), **{k: env.get(k) for k in RUN_KEYS}}
    return out


def decide_modes(files, m: Machines, ref: Reference, other_params: dict[str, list[str]], mode: str):
    """Per metrics file: exact or statistical, and why statistical."""
    modes, why = {}, {}
    for file in sorted(files):
        reasons = []
        if mode == "statistical":
            reasons.append("asked for (--mode statistical)")
        elif mode == "auto":
            mine, theirs = m.of[file], machine(ref.envs.get(file))
            diff = [k for k in MACHINE_KEYS if mine[k] != theirs[k]]
            if diff:
                reasons.append("another machine (" + ", ".join(f"{k}: {theirs[k]} -> {mine[k]}" for k in diff) + ")")
            changed = other_params.get(file, [])
            if changed:
                reasons.append("other params (" + ", ".join(changed) + ")")
        modes[file] = "statistical" if reasons else "exact"
        if reasons:
            why[file] = "; ".join(reasons)
    return modes, why


# ---------------------------------------------------------------- verdicts per metric

@dataclass
class Row:
    key: str
    ref: Optional[float]
    cur: Optional[float]
    how: str  # exact | band | band+welch | band+paired | the drift tolerance's text | not gated
    verdict: str  # ok | OUTSIDE | DRIFT | MISSING | new | skipped | info
    band: Optional[Band] = None
    alpha: float = ALPHA  # the per-metric alpha of the band (family-wise ALPHA: Holm's threshold for this row)
    p: Optional[float] = None  # Welch's or the paired test's p-value, when this run has seeds of its own
    seeds: str = ""  # that test (paired | welch), where this run's own seeds are tested

    @property
    def failure(self) -> bool:
        return self.verdict in ("OUTSIDE", "DRIFT", "MISSING")

    @property
    def file(self) -> str:
        return self.key.split(".", 1)[0]

    def band_text(self) -> str:
        if self.band is None:
            return "—"
        lo, hi = self.band.prediction_interval(self.alpha)
        return f"{lo:.4g} – {hi:.4g} (n={self.band.n})"


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def families(keys, ref: "Reference", headline: list[str]) -> dict[str, float]:
    """The per-metric alpha of every banded metric before Holm's step-down (`holm`): ALPHA over the
    size of its family, the headline metrics or all the other banded metrics. Measured here: a
    faithful rerun on another CPU moved single metrics up to 4 seed sd (Intel -> AMD, same seed), so
    an uncorrected per-metric interval would fail faithful reruns by chance."""
    banded = [k for k in keys if band(ref.dists, k) is not None]
    head = [k for k in banded if k in headline]
    rest = [k for k in banded if k not in headline]
    return {**{k: ALPHA / len(head) for k in head}, **{k: ALPHA / len(rest) for k in rest}}


def detectable_shifts(dists: dict, headline: list[str], float_order: dict[str, float],
                      timing: Callable[[str], bool] = lambda k: False) -> list[dict]:
    """The gate's power per banded metric: the smallest shift of a rerun's expected value that the check
    fails at least half the time, in seed sd and in the metric's units, for a one-seed rerun (its
    value against the prediction interval: t(1 - a/2, n - 1) sqrt(1 + 1/n) sd) and a five-seed rerun
    (Welch's test of its seeds' mean: welch_shift), a = ALPHA / m at
    the first step of Holm's within the metric's family of m (the headline, or all other banded
    metrics of a complete rerun). A five-seed rerun at the reference's first seeds is paired by seed
    where docs/float_order.json measured the metric's drift r (seed sd, one seed) and the paired test
    detects less than Welch's (seeds_test): `five_reference_seeds_sd`, the smaller of paired_shift and
    welch_shift (`paired`: which). A one-seed rerun of a metric on its float-order tolerance is held to
    FLOAT_ORDER_TOL sd; its seeds are tested as any other's. Seeds split into modes are not modelled."""
    keys = sorted(f"{file}.{k}" for file, d in dists.items() for k, s in (d.get("stats") or {}).items()
                  if s and s.get("n", 0) >= 2 and s.get("sd", 0) > 0 and not timing(f"{file}.{k}"))
    head = [k for k in keys if k in headline]
    rest = [k for k in keys if k not in headline]
    out = []
    for family in (head, rest):
        for key in family:
            b = band(dists, key)
            a, n = ALPHA / len(family), b.n
            one = t_quantile(1 - a / 2, n - 1) * math.sqrt(1 + 1 / n)
            five = welch_shift(5, n, a)
            r = float_order.get(key)
            at_ref = five if r is None else min(five, paired_shift(5, r, a))  # the test seeds_test picks
            tight = r is not None and r <= FLOAT_ORDER_RATIO
            if tight:
                one = FLOAT_ORDER_TOL
            out.append({"metric": key, "headline": key in headline, "n": n, "sd": b.sd, "log": b.log,
                        "float_order": tight, "one_seed_sd": one, "five_seeds_sd": five,
                        "five_reference_seeds_sd": at_ref, "paired": at_ref < five})
    return out


def holm(rows: list["Row"], headline: list[str]) -> None:
    """Holm's step-down within each family (the headline metrics; the other banded metrics): sorted
    by p-value, the i-th of m is outside while p < ALPHA / (m - i). Family-wise error ALPHA as
    Bonferroni, with the same PASS or FAIL (both reject something exactly when the smallest p is
    below ALPHA / m), but it names every metric it can once one is outside. A row's p is its band's (one new run: Band.p_new), or the
    smaller of that and its seeds' test's (seeds_test) where this run has seeds of its own; its alpha becomes the threshold
    it was judged at, so its band text is the interval it was held to."""
    banded = [r for r in rows if r.how.startswith("band") or r.seeds]
    for family in ([r for r in banded if r.key in headline], [r for r in banded if r.key not in headline]):
        if not family:
            continue
        m = max(round(ALPHA / r.alpha) for r in family)  # the family's size as `families` counted it
        # a row held exactly or to its float-order tolerance (and passing it) is in the family by its seeds alone
        ps = {id(r): min(r.band.p_new(r.cur), r.p if r.p is not None else 1.0) if r.how.startswith("band") else r.p
              for r in family}
        for r, (threshold, rejected) in zip(family, holm_step_down([ps[id(r)] for r in family], ALPHA, m)):
            r.alpha = threshold
            r.verdict = "OUTSIDE" if rejected else "ok"


def compare(cur: dict, ref: Reference, cur_dists: dict, exp: Expectations, modes: dict[str, str],
            envs: dict, why: Optional[dict[str, str]] = None, producers: Optional[dict[str, str]] = None,
            remade: Sequence[str] = ()) -> list[Row]:
    """Every metric's row; `remade` (remade_seeds): the seed distributions whose seeds are tested."""
    rows = []
    keys = sorted(set(ref.metrics) | set(cur))
    alphas = families([k for k in keys if k in cur and k in ref.metrics and not exp.is_timing(k)], ref, exp.headline)
    for key in keys:
        file = key.split(".", 1)[0]
        if exp.is_timing(key):
            rows.append(Row(key, ref.metrics.get(key), cur.get(key), "timing, not gated", "info"))
            continue
        if key not in cur:
            skip = exp.is_gpu_only(key) and cuda_run(file, envs) is not True
            rows.append(Row(key, ref.metrics[key], None, "—", "skipped" if skip else "MISSING"))
            continue
        if key not in ref.metrics:
            rows.append(Row(key, None, cur[key], "—", "new"))
            continue
        r, c = ref.metrics[key], cur[key]
        b, alpha = band(ref.dists, key), alphas.get(key, ALPHA)
        ratio, rule = ref.float_order.get(key), exp.drift_rule(key)
        info = rule is not None and rule.tol.kind == "info"
        # this run's own seeds of the metric, where a stage judged statistically remade them
        mine = own_seeds(cur_dists, key, b.log) if b is not None and b.sd > 0 and file in remade and not info \
            else None
        if modes.get(file) == "exact":  # the values exactly, and the seeds too where they were remade elsewhere
            rows.append(with_seeds(Row(key, r, c, "exact", "ok" if _same(r, c) else "DRIFT", b, alpha), b, mine,
                                   cur_dists, ref.dists, ratio))
            continue
        if info:  # reported, never gated, whatever its seeds
            rows.append(Row(key, r, c, "not gated", "info"))
            continue
        if b is not None and ratio is not None and ratio <= FLOAT_ORDER_RATIO and "other params" not in (why or {}).get(file, ""):
            row = float_order_row(key, r, c, b)
            row.alpha = alpha
            rows.append(with_seeds(row, b, mine, cur_dists, ref.dists, ratio))
            continue
        if b is not None and b.sd == 0:  # the same on every seed (a count, a row sum): its drift rule, or exact,
            b = None  # against the full-precision value (the stored summary keeps 6 significant digits, too few for a 7-digit count)
        if b is not None:
            row = Row(key, r, c, "band", "ok" if b.contains(c, alpha) else "OUTSIDE", b, alpha)
            rows.append(with_seeds(row, b, mine, cur_dists, ref.dists, ratio))
        else:
            tol = rule.tol if rule is not None else Tol("exact")
            rows.append(Row(key, r, c, tol.text(), "ok" if tol.ok(c, r) else "DRIFT"))
    for file in sorted({k.split(".", 1)[0] for k in keys}):
        # a seed distribution is exact where the stage that writes it is (seeds writes dist/train and dist/heads)
        if modes.get((producers or {}).get(file, file)) == "exact" and file in ref.dists \
                and cur_dists.get(file) != ref.dists[file]:
            rows.append(Row(f"dist/{file}", None, None, "exact", "DRIFT" if file in cur_dists else "MISSING"))
    holm(rows, exp.headline)
    return rows


def remade_seeds(cur_dists: dict, ref_dists: dict, modes: dict[str, str], producers: dict[str, str]) -> list[str]:
    """The seed distributions this run has of its own, made by a stage judged statistically (seeds writes
    dist/train): their seeds are tested against the reference's, even where the metrics file they belong
    to is judged exactly (its own stage not rerun)."""
    return sorted(f for f in cur_dists if modes.get(producers.get(f, f)) == "statistical"
                  and _runs(cur_dists, f) != _runs(ref_dists, f))


def float_order_row(key: str, r: float, c: float, b: Band) -> Row:
    """Power from structure: the same seed under other float orders moved this metric by at most
    FLOAT_ORDER_RATIO seed sd (docs/float_order.json at the reference), so a rerun of the same run on
    another machine must land within FLOAT_ORDER_TOL seed sd of the reference run, ten times that
    drift, instead of anywhere in the seed band."""
    tol = FLOAT_ORDER_TOL * b.sd
    if b.log:
        ok = r > 0 and c > 0 and abs(math.log(c) - math.log(r)) <= tol
        how = f"float order: within ×{math.exp(tol):.4g} ({FLOAT_ORDER_TOL:g} seed sd, log scale)"
    else:
        ok = abs(c - r) <= tol
        how = f"float order: within ±{tol:.3g} ({FLOAT_ORDER_TOL:g} seed sd)"
    return Row(key, r, c, how, "ok" if ok else "DRIFT")


MIN_PAIRS = 3  # seeds a run shares with the reference for the paired test (2 degrees of freedom)


def with_seeds(row: Row, b: Optional[Band], mine: Optional[Band], cur_dists: dict, ref_dists: dict,
               drift: Optional[float]) -> Row:
    """`row`, and where this run has seeds of its own (`mine`; the reference's: `b`) and the row holds,
    their test too: outside where p < its alpha (Holm's step-down then sets the threshold)."""
    if mine is None or row.verdict != "ok":
        return row
    row.seeds, row.p = seeds_test(row.key, b, mine, cur_dists, ref_dists, drift, row.alpha)
    row.how += f"+{row.seeds}"
    row.verdict = "ok" if row.p >= row.alpha else "OUTSIDE"
    return row


def seeds_test(key: str, b: Band, mine: Band, cur_dists: dict, ref_dists: dict, drift: Optional[float],
               alpha: float) -> tuple[str, float]:
    """How a run's own seeds of a metric are tested against the reference's (paired | welch), and the
    p-value. Paired by seed where MIN_PAIRS or more of the reference's seeds have the metric in this run
    and the metric's measured drift between float orders (`drift`, seed sd: docs/float_order.json) makes
    the paired test the more powerful (paired_shift below welch_shift; a choice from the reference alone,
    never from the run): the same seed drifts far less than seeds differ on what training does not
    scramble (a weight norm moves 0.13 seed sd), so a consistent shift that the seed spread hides from
    Welch stands out (issue 18: cosine_to_zero moved d32_scaled ||W_qkv|| by 1.2 seed sd on 5 seeds). A
    shift within the drift measured on one seed, or under FLOAT_ORDER_TOL seed sd, is never a finding (a
    minimum-effect test: a float order may shift every seed alike by that much). Otherwise Welch against
    all the reference's seeds. A log-scale metric at or below 0 fails (no band's scale fits)."""
    if mine.log != b.log:
        return "welch", 0.0
    f = math.log if b.log else float
    file, _, rest = key.partition(".")
    ours, theirs = _runs(cur_dists, file) or {}, _runs(ref_dists, file) or {}
    pairs = [(flatten(theirs[s]).get(rest), flatten(ours[s]).get(rest)) for s in sorted(set(ours) & set(theirs))]
    pairs = [(a, c) for a, c in pairs if a is not None and c is not None]
    if len(pairs) >= MIN_PAIRS and drift is not None \
            and paired_shift(len(pairs), drift, alpha) < welch_shift(mine.n, b.n, alpha):
        return "paired", paired_shift_p([f(a) for a, _ in pairs], [f(c) for _, c in pairs], paired_margin(drift) * b.sd)
    return "welch", b.welch(mine)


def welch_shift(m: int, n: int, a: float) -> float:
    """The shift, in seed sd, that Welch's test of m new seeds against n reference seeds detects half the
    time at alpha a (equal sd): t(1 - a/2, df) sqrt(1/m + 1/n)."""
    va, vb = 1 / m, 1 / n
    df = (va + vb) ** 2 / (va ** 2 / (m - 1) + vb ** 2 / (n - 1))
    return t_quantile(1 - a / 2, df) * math.sqrt(va + vb)


def paired_margin(drift: float) -> float:
    """The shift, in seed sd, below which the paired test finds nothing: the drift measured on one seed
    between float orders, at least FLOAT_ORDER_TOL."""
    return max(FLOAT_ORDER_TOL, drift)


def paired_shift(m: int, drift: float, a: float) -> float:
    """The shift, in seed sd, that the paired test of m seeds detects half the time at alpha a, taking the
    sd of a paired difference as the drift measured between float orders on one seed (rough):
    paired_margin + t(1 - a/2, m - 1) drift / sqrt(m)."""
    return paired_margin(drift) + t_quantile(1 - a / 2, m - 1) * drift / math.sqrt(m)


def paired_shift_p(a: list[float], b: list[float], margin: float) -> float:
    """Two-sided p-value of the paired t-test (a[i], b[i] share seed i) of |mean(b - a)| <= margin: a
    minimum-effect test, so that a shift below the margin (a float order's systematic last bits) is never
    a finding, however consistent over the seeds; conservative (twice the one-sided p beyond the margin:
    level at most alpha): stats.paired_t_p of the differences moved back by the margin."""
    mean = sum(y - x for x, y in zip(a, b)) / len(a)
    if abs(mean) <= margin:
        return 1.0
    return paired_t_p(a, [y - math.copysign(margin, mean) for y in b])


def _runs(dists: dict, file: str) -> Optional[dict]:
    return (dists.get(file) or {}).get("runs")


def heads_as_judged(cur: dict, cur_dists: dict, reference: dict, mode: str,
                    seeds_remade: bool = False) -> tuple[dict, dict]:
    """The run's metrics and seed distributions with its heads (and its own seeds' heads) named after the
    reference's heads they play, where heads.json is judged statistically: another float order trains
    other heads, and their indices carry no meaning. Judged exactly, the same run must give the same
    heads in the same order, so a permutation stays a difference; its seeds, if another stage remade
    them elsewhere (`seeds_remade`: remade_seeds), are renamed all the same."""
    dists = {**cur_dists, "heads": seeds_renamed(cur_dists["heads"], reference)} \
        if "heads" in cur_dists and (mode != "exact" or seeds_remade) else cur_dists
    return (cur if mode == "exact" else heads_renamed(cur, reference)), dists


def own_seeds(dists: dict, key: str, log: bool) -> Optional[Band]:
    """This run's own seeds of a metric, summarised from its per-seed values (never its stored summary)."""
    vals = seed_values(dists, key)
    if len(vals) < 2:
        return None
    return Band.of(vals, log=log and all(v > 0 for v in vals))


# ---------------------------------------------------------------- the check

@dataclass
class Outcome:
    rows: list[Row]
    results: list[ClaimResult]
    modes: dict[str, str]  # metrics file -> exact | statistical
    why: dict[str, str]  # metrics file -> why statistical
    headline: list[str]
    label: str = "HEAD"  # the reference revision, as the verdict names it
    notes: list[str] = field(default_factory=list)  # the first lines: where the run was made, what the tree changes
    problems: list[str] = field(default_factory=list)
    not_reproduced: list[str] = field(default_factory=list)  # conclusions the reference does not reproduce either
    provenance: list[str] = field(default_factory=list)  # which code made each stage's results

    @property
    def ok(self) -> bool:
        return not self.problems


def run_record_findings(root: Path, metrics_dir: str = "metrics") -> list[str]:
    """The metrics of a stage that keeps its runs' folders (data/<stage>/<name>/: spec.json and
    summary.json, as the run store wrote them) against those records: each folder's spec.json must
    hash to its key, and every number its summary shares with metrics/<stage>.json[<name>] must be
    the same. A metric edited together with dvc.lock is caught here; without data/ (not pulled, not
    rerun) there is nothing to read."""
    problems = []
    for folder in sorted((root / "data").glob("*/*/")):
        stage, name = folder.parent.name, folder.name
        if not ((folder / "summary.json").is_file() and (folder / "spec.json").is_file()):
            continue
        where = f"data/{stage}/{name}"
        record = read_json(folder / "spec.json")
        if recorded_key(record) != record.get("key"):
            problems.append(f"{where}/spec.json does not hash to its key: the run's record was edited")
            continue
        metrics_file = root / metrics_dir / f"{stage}.json"
        mine = read_json(metrics_file).get(name) if metrics_file.is_file() else None
        if not isinstance(mine, dict):
            continue
        for key, recorded in sorted(read_json(folder / "summary.json").items()):
            if key in mine and mine[key] != recorded:
                problems.append(f"{metrics_dir}/{stage}.json {name}.{key} = {fmt_number(mine[key])}, but the run that "
                                f"made it ({where}, run {record['key'][:12]}) recorded {fmt_number(recorded)}")
    return problems


def checkout_root(root: Path) -> Path:
    """The checkout to judge: `root` itself, or (run from a folder inside it) the git work tree above
    that holds params.yaml; a root that is no folder, or no checkout, is one line."""
    if not root.is_dir():
        raise UserError(f"--root: {root} is not a folder")
    if (root / "params.yaml").is_file():
        return root
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode == 0:
        top_dir = Path(top.stdout.strip())
        return top_dir if (top_dir / "params.yaml").is_file() else root  # at the top already: params' own error
    raise UserError(f"{root.resolve()}: no params.yaml here or at the top of its git checkout: run attnrepro check "
                    "in an attnrepro checkout (or give --root)")


def run_check(rev: str = "HEAD", root: str | Path = ".", metrics_dir: str = "metrics",
              claims_path: str | Path = "claims.yaml", mode: str = "auto", made_on: Optional[str] = None,
              base: Optional[str] = None) -> Outcome:
    root, claims_path = checkout_root(Path(root)), Path(claims_path).as_posix()
    revision = Revision(rev, root, base)
    ref = reference(revision, metrics_dir, claims_path)
    exp = ref.expectations
    cur = load_metrics_dir(root / metrics_dir)
    cur_dists = load_dists(root / metrics_dir / "dist")
    envs = load_envs(root / metrics_dir / "env")
    params = read_params(root / "params.yaml")
    files = {k.split(".", 1)[0] for k in set(cur) | set(ref.metrics)}
    seen: dict[str, dict] = {}

    def live(device: str) -> dict:
        if device not in seen:
            seen[device] = live_environment(device)
        return seen[device]

    m = machines(files, envs, ref.envs, made_on, live, f"{metrics_dir}/env")
    ref_lock = revision.yaml("dvc.lock")
    lock_probs, lock_notes = lock_findings(root, metrics_dir, ref_lock)
    modes, why = decide_modes(files, m, ref, made_with_other_params(root, params, ref_lock, ref.params), mode)
    producers = dist_producers(root, metrics_dir)
    remade = remade_seeds(cur_dists, ref.dists, modes, producers)

    cur, judged_dists = heads_as_judged(cur, cur_dists, ref.metrics, modes.get("heads", "exact"), "heads" in remade)
    rows = compare(cur, ref, judged_dists, exp, modes, envs, why, producers, remade)
    results = evaluate_all(exp, cur, ref.dists, envs)  # conclusions: on this run and the reference's seeds
    gate_sweep_means(rows, results, cur, ref.metrics)
    out = Outcome(rows, results, modes, why, exp.headline, ref.label)
    out.notes = m.notes + changes(revision, ref, root, claims_path, params, cur_dists, metrics_dir)
    out.notes += [f"{f}: judged exactly, and its seeds, remade by the {producers.get(f, f)} stage, against the reference's"
                  for f in remade if modes.get(f) == "exact"]
    out.provenance, numerics = provenance(envs)
    out.notes += lock_notes
    out.problems = (lock_probs + run_record_findings(root, metrics_dir) + m.problems + numerics
                    + metric_problems(rows, ref.name))
    for res in results:
        c = res.claim
        if c.cls == "conclusion" and not_reproduced(c.id, ref.verdicts):
            if starts_to_hold(c, cur, envs, ref):  # a finding of the reference changed: something moved
                out.problems.append(f"conclusion {c.id} holds on this run, but not on the reference's run "
                                    f"({ref.name}), which reports it not reproduced: {c.text}")
            elif res.status == "fail":
                out.not_reproduced.append(c.id)
        elif res.gated_failure:
            detail = res.detail or (f"{fmt_number(res.value)} vs published {fmt_number(c.published)} ({c.tol.text()})"
                                    if c.is_cell else "is false")
            out.problems.append(f"{c.cls} {c.id} fails: {c.text} — {detail}" + _what_it_read(res, cur))
    return out


def _what_it_read(res: ClaimResult, metrics: dict) -> str:
    """The metrics a failing predicate read on this run, and their values."""
    shown = [f"{k} = {fmt_number(metrics.get(k))}" for k in res.read[:6]]
    return f" (it read {', '.join(shown)}{' and more' if len(res.read) > 6 else ''})" if shown else ""


def gate_sweep_means(rows: list[Row], results: list[ClaimResult], cur: dict, ref: dict) -> None:
    """A sweep's summaries are informational, except the ones a gated conclusion reads (issue 18, 5c):
    for each statistic it reads of a sweep cell (its mean, min, max or sd over the sweep's seeds), the
    cell's mean is judged by Welch's test of this run's seeds against the reference's, from the two
    summaries (mean, sd, and the sweep's seed count, `<prefix>.seeds`), at ALPHA over the number of
    such means (Bonferroni: they are few)."""
    read = {k for r in results if r.claim.cls == "conclusion" for k in r.read}
    cells = {k.rsplit(".", 1)[0] for k in read if k.rsplit(".", 1)[-1] in ("mean", "min", "max", "sd")}
    targets = [r for r in rows if r.how == "not gated" and r.key.endswith(".mean") and r.key[:-5] in cells]
    for row in targets:
        cell = row.key[:-5]
        n_ref, n_cur = _sweep_seeds(ref, cell), _sweep_seeds(cur, cell)
        if None in (n_ref, n_cur, ref.get(f"{cell}.sd"), cur.get(f"{cell}.sd")) or min(n_ref, n_cur) < 2:
            continue
        theirs = Band(int(n_ref), row.ref, ref[f"{cell}.sd"])
        row.p = theirs.welch(Band(int(n_cur), row.cur, cur[f"{cell}.sd"]))
        row.alpha = ALPHA / len(targets)
        row.how, row.verdict = "sweep mean (Welch)", "OUTSIDE" if row.p < row.alpha else "ok"


def _sweep_seeds(metrics: dict, cell: str) -> Optional[float]:
    """The seed count of a sweep cell: `<prefix>.seeds` for the longest prefix of the cell that has one."""
    parts = cell.split(".")
    return next((metrics[f"{'.'.join(parts[:i])}.seeds"] for i in range(len(parts) - 1, 0, -1)
                 if f"{'.'.join(parts[:i])}.seeds" in metrics), None)


def metric_problems(rows: list[Row], label: str) -> list[str]:
    out = []
    for r in rows:
        if r.key.startswith("dist/") and r.failure:
            out.append(f"metrics/{r.key}.json (the seed distribution) "
                       + ("is missing" if r.verdict == "MISSING" else f"differs from {label}'s"))
        elif r.verdict == "MISSING":
            out.append(f"metric {r.key} is in {label} but missing from this run")
        elif r.verdict == "OUTSIDE" and r.p is not None and r.p < r.alpha:
            test = "paired t-test at the reference's seeds" if r.seeds == "paired" else "Welch"
            out.append(f"metric {r.key}: this run's seeds differ from the reference's ({test} p = {r.p:.3g}, "
                       f"alpha {r.alpha:.2g})")
        elif r.verdict == "OUTSIDE":
            out.append(f"metric {r.key} = {fmt_number(r.cur)} is outside the reference band {r.band_text()}")
        elif r.verdict == "DRIFT":
            out.append(f"metric {r.key} = {fmt_number(r.cur)} drifted from {fmt_number(r.ref)} ({r.how})")
    return out


def changes(revision: Revision, ref: Reference, root: Path, claims_path: str, params: dict, cur_dists: dict,
            metrics_dir: str) -> list[str]:
    """The first lines: what the working tree (and HEAD's commits, against an older revision) change of the
    reference. The verdict uses the revision's files whatever they say."""
    lines = []
    preds = (Path(claims_path).parent / CONCLUSIONS).as_posix()
    try:
        tree = load(root / claims_path)
    except UserError as e:
        tree = None
        if (root / claims_path).exists():
            bad = preds if str(e).startswith(str(root / preds)) else claims_path
            lines.append(f"{bad} in the working tree does not load ({e}); the verdict uses {ref.name}'s")
    diff = claims_changes(ref.expectations, tree) if tree is not None else {}
    for file, changed in diff.items():
        lines.append(f"{claims_path if file == 'claims.yaml' else preds} differs from {ref.name}'s; the verdict uses "
                     f"{ref.name}'s:")
        lines += [f"  {what:<9} {listed(items)}" for what, items in changed.items()]
    moved_params = params_changes(ref.params, params)
    if moved_params:
        lines.append(f"params.yaml differs from {ref.name}'s: {listed(moved_params, 4)}")
    own = sorted(f for f in cur_dists if f in ref.dists and _runs(cur_dists, f) != _runs(ref.dists, f))
    if own:
        lines.append(f"seed distributions differ from {ref.name}'s (bands and conclusions use {ref.name}'s): "
                     + ", ".join(f"{metrics_dir}/dist/{f}.json" for f in own))
    tol_file = root / FLOAT_ORDER
    if tol_file.exists() and read_json(tol_file).get("ratio") != ref.float_order:
        lines.append(f"{FLOAT_ORDER} differs from {ref.name}'s (its float-order tolerances); the verdict uses "
                     f"{ref.name}'s")
    committed = revision.changed_since([claims_path, preds, "params.yaml", "dvc.yaml", metrics_dir, FLOAT_ORDER])
    if committed:
        lines.append(f"HEAD's commits change the reference since {ref.name}: {listed(committed)}")
    return lines


def starts_to_hold(claim, cur: dict, envs: dict, ref: Reference) -> bool:
    """Does a conclusion the reference does not reproduce hold on this run, where it does not on the
    reference's own run? (Both without seeds: on the reference's seeds it fails by construction.)"""
    return evaluate_claim(claim, cur, {}, envs).passed and not evaluate_claim(claim, ref.metrics, {}, ref.envs).passed


def provenance(envs: dict[str, dict]) -> tuple[list[str], list[str]]:
    """Which code made each stage's results (its environment record): the revision, whether it had
    uncommitted changes, and the numerics versions its runs were keyed under. A result whose runs
    were keyed under other numerics than the code at HEAD declares (run.execute.NUMERICS) is not the code at
    HEAD's: a problem. Returns (lines, problems)."""
    made: dict[str, list[str]] = {}
    problems = []
    for file, env in sorted(envs.items()):
        rev = env.get("git_revision")
        who = "an unknown revision" if not rev else rev[:10] + (" with uncommitted changes" if env.get("git_dirty") else "")
        made.setdefault(who, []).append(file)
        used = env.get("numerics") or {}
        moved = {t: (v, NUMERICS.get(t)) for t, v in used.items() if NUMERICS.get(t) != v}
        if moved:
            problems.append(f"metrics/{file}.json comes from runs keyed under other numerics than the code at HEAD's ("
                            + ", ".join(f"{t}: {a} -> {b}" for t, (a, b) in moved.items())
                            + "): its results are not this code's; `dvc repro` retrains them")
    lines = [f"made by {who}: {', '.join(files)}" for who, files in made.items()]
    return lines, problems


def not_reproduced(claim_id: str, verdicts: dict) -> bool:
    """Does the reference report this conclusion of the chapter not reproduced? Then a run must not
    reproduce it either (the gate keeps the reference's findings, both ways)."""
    e = verdicts.get(claim_id)
    return isinstance(e, dict) and e.get("pass") == 0 and e.get("skipped") == 0


def _md_number(x) -> str:
    return "—" if x is None else fmt_number(x)


def as_json(o: Outcome) -> dict:
    """The verdict for scripts (`attnrepro check --json`): verdict, reference, first lines, problems,
    each metrics file's mode, claim counts, conclusions not reproduced, provenance, and every gated
    metric that failed."""
    return {"verdict": "PASS" if o.ok else "FAIL", "reference": o.label, "notes": o.notes, "problems": o.problems,
            "modes": o.modes, "why_statistical": o.why, "claims": counts(o.results),
            "not_reproduced": o.not_reproduced, "provenance": o.provenance,
            "failed_metrics": [{"key": r.key, "run": r.cur, "reference": r.ref, "how": r.how, "verdict": r.verdict}
                               for r in o.rows if r.failure]}


def render_md(o: Outcome, show_all: bool = False) -> str:
    """The verdict as a Markdown document (`attnrepro check --md`, e.g. a pull request's comment): the
    first lines as a heading and a quote, then the tables of `render`."""
    text = render(o, show_all=show_all).split("\n")
    head, rest = text[0], text[1:]
    cut = next((i for i, line in enumerate(rest) if line.startswith("|")), len(rest))
    summary = [line for line in rest[:cut] if line.strip()]
    return "\n".join([f"### {head}", "", "```", *summary, "```", "", *rest[cut:]]).rstrip() + "\n"


def render(o: Outcome, rev: Optional[str] = None, show_all: bool = False) -> str:
    c = counts(o.results)
    gated = [r for r in o.rows if r.verdict not in ("info", "new", "skipped")]
    exact = sorted(f for f, m in o.modes.items() if m == "exact")
    stat = sorted(f for f, m in o.modes.items() if m == "statistical")
    lines = [f"check: {'PASS' if o.ok else 'FAIL'} — this run "
             + ("reproduces" if o.ok else "does not reproduce") + f" the reference ({rev or o.label})"
             + ("" if o.ok else f": {len(o.problems)} problem(s), listed below")]
    lines += [f"  {n}" for n in o.notes] + [""]
    lines.append(f"  conclusions {c['conclusion']['passed']} of {c['conclusion']['n'] - c['conclusion']['skipped']} hold"
                 f" (each on this run, and on every reference seed and the seed mean where a stage has seeds)"
                 + (f", {c['conclusion']['skipped']} skipped (need a GPU)" if c['conclusion']['skipped'] else ""))
    if o.not_reproduced:
        lines.append(f"              {len(o.not_reproduced)} not reproduced, as on the reference: "
                     + ", ".join(o.not_reproduced))
    lines.append(f"  checksums   {c['checksum']['passed']} of {c['checksum']['n'] - c['checksum']['skipped']} hold")
    lines.append(f"  metrics     {sum(not r.failure for r in gated)} of {len(gated)} within their reference "
                 f"({sum(r.how.startswith('band') for r in gated)} against a seed band, "
                 f"{sum(r.how.startswith('float order') for r in gated)} to their float-order tolerance, "
                 f"{sum(r.how == 'sweep mean (Welch)' for r in gated)} sweep means read by a conclusion, "
                 f"{sum(r.how.startswith('exact') for r in gated)} exact; "
                 f"{sum(bool(r.seeds) for r in gated)} with this run's own seeds tested too); "
                 f"{sum(r.how == 'timing, not gated' for r in o.rows)} timings and "
                 f"{sum(r.how == 'not gated' for r in o.rows)} informational metrics not gated")
    lines.append(f"  published   {c['value']['passed']} of {c['value']['n'] - c['value']['skipped']} published values "
                 f"inside our band or tolerance; of the others {c['value']['unexplained']} unexplained (informational)")
    if exact:
        lines.append(f"  exact verdict (same machine and params as the reference): {', '.join(exact)}")
    reasons: dict[str, list[str]] = {}
    for f in stat:
        reasons.setdefault(o.why.get(f, ""), []).append(f)
    for why, files in reasons.items():
        lines.append(f"  statistical verdict ({why}): {', '.join(files)}")
    if stat:
        lines.append(f"    (prediction interval of one run, alpha = {ALPHA} family-wise: Holm's step-down over the headline "
                     "metrics and again over the others)")
    if o.provenance:
        lines += [f"  provenance: {o.provenance[0]}"] + [f"              {x}" for x in o.provenance[1:]]
    if o.problems:
        lines += ["", "problems:"] + [f"- {p}" for p in o.problems]
    by_key = {r.key: r for r in o.rows}
    head = [by_key[k] for k in o.headline if k in by_key]
    if head:
        lines += ["", f"headline metrics (reference band: the prediction interval of one run over the reference seeds, "
                  f"alpha = {ALPHA} over the headline family)", "",
                  "| metric | this run | reference run | reference band | verdict |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r.key} | {_md_number(r.cur)} | {_md_number(r.ref)} | {r.band_text()} | {r.verdict} ({r.how}) |" for r in head]
    shown = [r for r in o.rows if show_all or (r.failure and r.key not in o.headline)]
    if shown:
        lines += ["", "all metrics" if show_all else "other metrics that failed", "",
                  "| metric | this run | reference run | reference band | how | verdict |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r.key} | {_md_number(r.cur)} | {_md_number(r.ref)} | {r.band_text()} | {r.how} | {r.verdict} |"
                  for r in shown]
    claims = [r for r in o.results if show_all or (r.gated_failure and r.claim.id not in o.not_reproduced)]
    if claims:
        lines += ["", "claims" if show_all else "claims that failed", "",
                  "| claim | class | result | detail |", "| --- | --- | --- | --- |"]
        for r in claims:
            detail = r.detail or (f"{_md_number(r.value)} vs {_md_number(r.claim.published)}" if r.claim.is_cell else "")
            if r.seeds_n:
                detail = (detail + "; " if detail else "") + f"{r.seeds_held}/{r.seeds_n} seeds, mean {'holds' if r.mean_holds else 'fails'}"
            lines.append(f"| {r.claim.id} | {r.claim.cls} | {r.status} | {detail} |")
    if not show_all:
        lines += ["", "(`attnrepro check --all` lists every metric and claim, timings included)"]
    return "\n".join(lines) + "\n"
