"""`attnrepro check`: does this run reproduce the committed reference run? The rules, written once:
docs/VERDICT.md. Here: the machine each metrics file was made on and its mode (exact or statistical), every
metric's row, the primary endpoints' values (judged in judge.endpoints; --decide: judge.decide), the claims
as the reference judges them (judge.claims), the problems provenance/ finds, and the rendering."""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from attnrepro.config import UserError
from attnrepro.envinfo import environment
from attnrepro.files import read_params
from attnrepro.formatting import fmt_number, md_table
from attnrepro.judge import endpoints
from attnrepro.judge.claims import (CONCLUSIONS, ClaimResult, Expectations, Tol, band, claims_json, counts,
                                    evaluate_all, evaluate_claim, kind, load, load_json_dir, load_metrics_dir, ran_on,
                                    seed_values, tally_lines)
from attnrepro.judge.decide import conclusion_shares, decide
from attnrepro.judge.endpoints import Judgement
from attnrepro.judge.revision import (Reference, Revision, Unreadable, claims_changes, params_changes, reference,
                                      unreadable)
from attnrepro.measure.head_matching import heads_renamed, seeds_renamed
from attnrepro.provenance.computation import same_computation
from attnrepro.provenance.lock import METRICS, dist_producers, listed, lock_findings, made_with_other_params, same
from attnrepro.provenance.derived import current, derived_findings
from attnrepro.provenance.records import (made_by, run_folder_findings, run_record_findings, store_findings,
                                          sweep_findings)
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import ALPHA, LOOKS, Band

# what decides whether a rerun must be byte-identical: the machine's float order and the software
MACHINE_KEYS = ("cpu", "cpu_capability", "torch", "python", "torch_threads", "device", "cuda_available", "cuda_version",
                "cudnn_version", "gpu_name", "runs_on")
# what says which machine and build made an env record: the live machine's must agree
IDENTITY_KEYS = ("cpu", "cpu_capability", "torch", "python")
# how a stage ran on that machine: only its env record knows
RUN_KEYS = ("torch_threads", "device", "runs_on")


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


def machines(files, envs: dict, ref_envs: dict, made_on: Optional[str], live: Callable[[str], dict]) -> Machines:
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
        raise UserError(f"{METRICS}/env/{first[0]}.json says the run was made on another machine ({first[1]}"
                        + (f"; and {len(elsewhere) - 1} more records" if len(elsewhere) > 1 else "")
                        + '): judge it here only by saying where it was made: --made-on "<machine>"')
    if made_on is not None:
        out.notes.append(f"made on: {made_on} (--made-on): " + (f"its env records name another machine ({first[1]})"
                                                               if first else "its env records describe this machine"))
    for f in sorted(files):
        env = envs.get(f)
        if env is None and f in ref_envs:
            out.problems.append(f"{METRICS}/env/{f}.json is missing: the machine {f} ran on is unknown (judged as the "
                                "reference's)")
        if env is None or env == ref_envs.get(f) or made_on is not None:
            out.of[f] = machine(env if env is not None else ref_envs.get(f))
        else:
            out.of[f] = {**machine(live(str(env.get("device", "cpu")))), **{k: env.get(k) for k in RUN_KEYS}}
    return out


def decide_modes(files, m: Machines, ref: Reference, other_params: dict[str, list[str]], mode: str):
    """Per metrics file: exact or statistical, and why statistical."""
    why = {}
    for file in sorted(files):
        reasons = ["asked for (--mode statistical)"] if mode == "statistical" else []
        if mode == "auto":
            mine, theirs = m.of[file], machine(ref.envs.get(file))
            diff = ", ".join(f"{k}: {theirs[k]} -> {mine[k]}" for k in MACHINE_KEYS if mine[k] != theirs[k])
            changed = ", ".join(other_params.get(file, []))
            reasons += ([f"another machine ({diff})"] if diff else []) + ([f"other params ({changed})"] if changed else [])
        if reasons:
            why[file] = "; ".join(reasons)
    return {f: "statistical" if f in why else "exact" for f in sorted(files)}, why


# ---------------------------------------------------------------- verdicts per metric

@dataclass
class Row:
    key: str
    ref: Optional[float]
    cur: Optional[float]
    how: str  # exact | band, not gated | the drift tolerance's text | not gated
    verdict: str  # ok | DRIFT | MISSING | new | skipped | info
    band: Optional[Band] = None

    @property
    def failure(self) -> bool:
        return self.verdict in ("DRIFT", "MISSING")

    def band_text(self) -> str:
        if self.band is None:
            return "—"
        lo, hi = self.band.prediction_interval(ALPHA)
        z = self.band.z_score(self.cur) if isinstance(self.cur, (int, float)) and self.band.sd > 0 else None
        return f"{lo:.4g} – {hi:.4g} (n={self.band.n})" + ("" if z is None else f", z {z:+.2g}")


def compare(cur: dict, ref: Reference, exp: Expectations, modes: dict[str, str], envs: dict,
            cur_dists: dict, producers: dict[str, str]) -> list[Row]:
    """Every metric's row. Judged exactly: identical (timings aside). Judged statistically: a metric
    with seeds is informational (its band and z: the primary endpoints decide, `endpoints`), one
    without keeps its drift tolerance from claims.yaml."""
    rows = []
    keys = sorted(set(ref.metrics) | set(cur))
    for key in keys:
        file = key.split(".", 1)[0]
        if exp.is_timing(key):
            rows.append(Row(key, ref.metrics.get(key), cur.get(key), "timing, not gated", "info"))
            continue
        if key not in cur:
            skip = exp.is_gpu_only(key) and ran_on(file, envs) != "cuda"
            rows.append(Row(key, ref.metrics[key], None, "—", "skipped" if skip else "MISSING"))
            continue
        if key not in ref.metrics:
            rows.append(Row(key, None, cur[key], "—", "new"))
            continue
        r, c = ref.metrics[key], cur[key]
        b, rule = band(ref.dists, key), exp.drift_rule(key)
        if modes.get(file) == "exact":
            rows.append(Row(key, r, c, "exact", "ok" if same(r, c) else "DRIFT", b))
        elif rule is not None and rule.tol.kind == "info":
            rows.append(Row(key, r, c, "not gated", "info"))
        elif b is not None and b.sd > 0:
            rows.append(Row(key, r, c, "band, not gated", "info", b))
        else:  # no seeds, or the same on every seed (a count): its drift rule, or exact
            tol = rule.tol if rule is not None else Tol("exact")
            rows.append(Row(key, r, c, tol.text(), "ok" if tol.ok(c, r) else "DRIFT"))
    for file in sorted({k.split(".", 1)[0] for k in keys}):
        # a seed distribution is exact where the stage that writes it is (seeds writes dist/train and dist/heads)
        if modes.get(producers.get(file, file)) == "exact" and file in ref.dists \
                and cur_dists.get(file) != ref.dists[file]:
            rows.append(Row(f"dist/{file}", None, None, "exact", "DRIFT" if file in cur_dists else "MISSING"))
    return rows


def endpoint_values(exp: Expectations, ref: Reference, cur: dict, cur_dists: dict, remade: Sequence[str],
                    modes: dict[str, str]):
    """(reference, run): each primary endpoint's seed values. The run's are its own seeds where a stage
    judged statistically remade them (`remade`), with its own value where that is none of them and its
    file was rerun too (judged exactly, the file is the reference's own run); else its one value."""
    reference = endpoints.reference_values(exp.primary, ref.dists)
    run = {}
    for e in exp.primary:
        own = endpoints.value(cur, e.metric)
        mine = [own] if own is not None else []
        file = e.metric.split(".", 1)[0]
        if file in remade:  # its seeds, and the run itself where it is none of them
            seeds = seed_values(cur_dists, e.metric)
            mine = seeds + [x for x in mine if x not in seeds and modes.get(file) != "exact"]
        run[e.metric] = mine
    return reference, run


def remade_seeds(cur_dists: dict, ref_dists: dict, modes: dict[str, str], producers: dict[str, str]) -> list[str]:
    """The seed distributions this run has of its own, made by a stage judged statistically (seeds writes
    dist/train): their seeds are tested against the reference's, even where the metrics file they belong
    to is judged exactly (its own stage not rerun)."""
    return sorted(f for f in cur_dists if modes.get(producers.get(f, f)) == "statistical"
                  and _runs(cur_dists, f) != _runs(ref_dists, f))


def _runs(dists: dict, file: str) -> Optional[dict]:
    return (dists.get(file) or {}).get("runs")


def heads_as_judged(cur: dict, cur_dists: dict, reference: dict, mode: str,
                    seeds_remade: bool = False) -> tuple[dict, dict]:
    """The run's metrics with its heads named after the reference's heads they play, where heads.json is
    judged statistically: another float order trains other heads, and their indices carry no meaning.
    Judged exactly, the same run must give the same heads in the same order, so a permutation stays a
    difference. The run's own seeds, where a stage remade them (`seeds_remade`: remade_seeds), are renamed
    all the same for their test; seeds it did not remake are the reference's, left as written."""
    dists = {**cur_dists, "heads": seeds_renamed(cur_dists["heads"], reference)} \
        if "heads" in cur_dists and seeds_remade else cur_dists
    return (cur if mode == "exact" else heads_renamed(cur, reference)), dists


# ---------------------------------------------------------------- the check

@dataclass
class Outcome:
    rows: list[Row]
    results: list[ClaimResult]
    modes: dict[str, str]  # metrics file -> exact | statistical
    why: dict[str, str]  # metrics file -> why statistical
    endpoints: list[Judgement] = field(default_factory=list)
    label: str = "HEAD"  # the reference revision, as the verdict names it
    notes: list[str] = field(default_factory=list)  # the first lines: where the run was made, what the tree changes
    problems: list[str] = field(default_factory=list)
    not_reproduced: list[str] = field(default_factory=list)  # conclusions the reference does not reproduce either
    from_seeds: list[str] = field(default_factory=list)  # conclusions whose verdict is the reference's seeds' (one run)
    run_differs: list[str] = field(default_factory=list)  # ... where the run's own outcome differs, in words
    provenance: list[str] = field(default_factory=list)  # which code made each stage's results
    looks: list = field(default_factory=list)  # --decide's looks (judge.decide.Look), in order
    shares: list = field(default_factory=list)  # conclusions on --decide's seeds (judge.decide.Share), not gated
    computation: str = ""  # the first question's answer (provenance.computation)
    rerun: Optional[list[str]] = None  # the metrics files whose env record is not the reference's (None: not known)
    root: str = ""  # the checkout judged: --md names its files relative to it

    @property
    def ok(self) -> bool:
        return not self.problems


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


def run_check(rev: str = "HEAD", root: str | Path = ".", claims_path: str | Path = "claims.yaml", mode: str = "auto",
              made_on: Optional[str] = None, base: Optional[str] = None, decide_with: Optional[EngineConfig] = None,
              max_seeds: Optional[int] = None, headline_of: Optional[Callable] = None) -> Outcome:
    """The verdict on the run in `root` against the reference at `rev` (docs/VERDICT.md); `decide_with`
    (the run engine's settings): --decide, the primary endpoints judged by reruns at the reference's seeds, up to
    `max_seeds` (default: as many as its looks ask for); `headline_of`: see made_again."""
    root, claims_path = checkout_root(Path(root)), Path(claims_path).as_posix()
    revision = Revision(rev, root, base)
    envs = load_json_dir(root / METRICS / "env")
    try:
        ref = reference(revision, claims_path, envs)
    except Unreadable as e:  # nothing can be judged against it: the one problem
        return Outcome([], [], {}, {}, label=revision.label, problems=[f"the reference {e}"])
    exp = ref.expectations
    cur = load_metrics_dir(root / METRICS)
    cur_dists = load_json_dir(root / METRICS / "dist")
    params = read_params(root / "params.yaml")
    files = {k.split(".", 1)[0] for k in set(cur) | set(ref.metrics)}
    seen: dict[str, dict] = {}

    def live(device: str) -> dict:
        if device not in seen:
            seen[device] = live_environment(device)
        return seen[device]

    m = machines(files, envs, ref.envs, made_on, live)
    ref_lock = revision.yaml("dvc.lock")
    lock_probs, lock_notes = lock_findings(root, ref_lock)
    other_params = made_with_other_params(root, params, ref_lock, ref.params)
    modes, why = decide_modes(files, m, ref, other_params, mode)
    computation = same_computation(revision.text_or_none, root, ref_lock, set(other_params))
    producers = dist_producers(root)
    remade = remade_seeds(cur_dists, ref.dists, modes, producers)

    cur, judged_dists = heads_as_judged(cur, cur_dists, ref.metrics, modes.get("heads", "exact"), "heads" in remade)
    rows = compare(cur, ref, exp, modes, envs, cur_dists, producers)
    results = evaluate_all(exp, cur, ref.dists, envs)  # conclusions: on this run and the reference's seeds
    if remade:  # published values (never gated) on the seeds the report reads: the run's own, where it remade them
        own = {r.claim.id: r for r in evaluate_all(exp, cur, {**ref.dists, **{f: judged_dists[f] for f in remade}},
                                                   envs)}
        results = [own[r.claim.id] if r.claim.cls == "value" else r for r in results]
    judged = endpoints.judge(exp.primary, *endpoint_values(exp, ref, cur, judged_dists, remade, modes))
    looks = decide(exp.primary, ref.dists, params, decide_with, max_seeds or max(LOOKS)) if decide_with else []
    if looks:  # the endpoints --decide reran replace their one-run answers
        judged = [next((j for j in looks[-1].judgements if j.endpoint == e.endpoint), e) for e in judged]
    out = Outcome(rows, results, modes, why, judged, ref.label, looks=looks, root=str(root.resolve()),
                  rerun=sorted(f for f in files if envs.get(f) != ref.envs.get(f)),
                  computation=computation.line(revision.name))
    if looks:
        out.shares = conclusion_shares(results, looks[-1].seed_runs, cur, ref.dists, envs)
    out.notes = m.notes + changes(revision, ref, root, claims_path, params, cur_dists)
    out.notes += [f"--decide: {look.line()}" for look in looks]
    out.notes += [f"{f}: judged exactly, and its seeds, remade by the {producers.get(f, f)} stage, against the reference's"
                  for f in remade if modes.get(f) == "exact"]
    out.provenance, numerics = made_by(envs)
    sweep_probs, sweep_notes = sweep_findings(root, params, envs, live, lambda line: print(line, file=sys.stderr))
    out.notes += lock_notes + sweep_notes
    again = made_again(root, claims_path, headline_of)
    out.problems = (unreadable(ref) + computation.problems(revision.name) + lock_probs
                    + derived_findings(root, params, again) + run_folder_findings(root, params, ref_lock)
                    + run_record_findings(root, params)
                    + store_findings(root, params, cur, cur_dists, envs, producers) + sweep_probs + m.problems + numerics
                    + metric_problems(rows, ref.name) + endpoint_problems(judged, rows))
    for res in results:
        c = res.claim
        seeded = c.cls == "conclusion" and res.seeds_n and any(modes.get(k.split(".", 1)[0]) == "statistical"
                                                               for k in res.read)
        if seeded:  # one run cannot move a share: the seeds decided (judge.claims); the run's own outcome is shown
            out.from_seeds.append(c.id)
            if res.on_run != res.passed:
                out.run_differs.append(f"{c.id} ({'holds' if res.on_run else 'does not hold'} on this run; the "
                                       f"reference's seeds: {res.share_text()})")
        if c.cls == "conclusion" and res.status != "missing" and not_reproduced(c.id, ref.verdicts):
            if not seeded and starts_to_hold(c, cur, envs, ref):  # a finding of the reference changed: something moved
                out.problems.append(f"conclusion {c.id} holds on this run, but not on the reference's run "
                                    f"({ref.name}), which reports it not reproduced: {c.text}")
            elif res.status == "fail":
                out.not_reproduced.append(c.id)
        elif res.gated_failure:
            detail = res.detail or (f"{fmt_number(res.value)} vs published {fmt_number(c.published)} ({c.tol.text()})"
                                    if c.is_cell else "is false")
            out.problems.append(f"{c.cls} {c.id} fails: {c.text} — {detail}" + _what_it_read(res, cur))
        elif res.on_run is False and res.seeds_n and not seeded and evaluate_claim(c, ref.metrics, {}, ref.envs).passed:
            # judged exactly, the run must keep the reference run's outcome, whatever the seeds decide
            out.problems.append(f"conclusion {c.id} fails: {c.text} — is false" + _what_it_read(res, cur)
                                + f" on this run, where it holds on the reference's run ({ref.name})")
    return out


def made_again(root: Path, claims_path: str, headline_of: Optional[Callable] = None) -> dict:
    """For provenance.derived, what makes again the files of the stages that judge the metrics, each where dvc.lock
    says its stage ran with the working tree's inputs: claims.json and claims_summary.json as the report stage makes
    them (judge.claims), and headline.json by `headline_of` (the headline stage's function, a layer above)."""
    out = {}
    if current(root, "report"):
        results = functools.cache(lambda: evaluate_all(load(root / claims_path), load_metrics_dir(root / METRICS),
                                                       load_json_dir(root / METRICS / "dist"),
                                                       load_json_dir(root / METRICS / "env")))
        out.update(claims=lambda *_: claims_json(results()), claims_summary=lambda *_: counts(results()))
    if headline_of is not None and current(root, "headline"):
        out["headline"] = lambda *_: headline_of(root / claims_path, root / METRICS)
    return out


def endpoint_problems(judged: Sequence[Judgement], rows: Sequence[Row]) -> list[str]:
    """DIFFERENT and not-a-number endpoints; one whose row failed already (missing, or drifted on the reference's
    machine) is listed there once."""
    failed = {r.key for r in rows if r.failure}
    family = sum(j.answer not in (endpoints.MISSING, endpoints.INVALID) for j in judged)  # what Holm ran over
    out = []
    for j in judged:
        if failed & set(endpoints.parts(j.endpoint.metric)):
            continue
        if j.answer == endpoints.DIFFERENT:
            out.append(f"primary endpoint {j.endpoint.metric}: DIFFERENT from the reference, shift {j.shift_text()} "
                       f"beyond its margin {j.endpoint.text} (p {j.p_different:.2g}, Holm over {family})")
        elif j.answer == endpoints.INVALID:
            out.append(f"primary endpoint {j.endpoint.metric}: this run's value is not a number its scale can judge")
    return out


def _what_it_read(res: ClaimResult, metrics: dict) -> str:
    """The metrics a failing predicate read on this run, and their values."""
    shown = [f"{k} = {fmt_number(metrics.get(k))}" for k in res.read[:6]]
    return f" (it read {', '.join(shown)}{' and more' if len(res.read) > 6 else ''})" if shown else ""


def metric_problems(rows: list[Row], label: str) -> list[str]:
    out = []
    for r in rows:
        if r.key.startswith("dist/") and r.failure:
            out.append(f"metrics/{r.key}.json (the seed distribution) "
                       + ("is missing" if r.verdict == "MISSING" else f"differs from {label}'s"))
        elif r.verdict == "MISSING":
            out.append(f"metric {r.key} is in {label} but missing from this run")
        elif r.verdict == "DRIFT":
            out.append(f"metric {r.key} = {fmt_number(r.cur)} drifted from {fmt_number(r.ref)} ({r.how})")
    return out


def changes(revision: Revision, ref: Reference, root: Path, claims_path: str, params: dict,
            cur_dists: dict) -> list[str]:
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
                     + ", ".join(f"{METRICS}/dist/{f}.json" for f in own))
    committed = revision.changed_since([claims_path, preds, "params.yaml", "dvc.yaml", METRICS])
    if committed:
        lines.append(f"HEAD's commits change the reference since {ref.name}: {listed(committed)}")
    return lines


def starts_to_hold(claim, cur: dict, envs: dict, ref: Reference) -> bool:
    """Does a conclusion the reference does not reproduce hold on this run, where it does not on the
    reference's own run? (Both without seeds: on the reference's seeds it fails by construction.)"""
    return evaluate_claim(claim, cur, {}, envs).passed and not evaluate_claim(claim, ref.metrics, {}, ref.envs).passed


def not_reproduced(claim_id: str, verdicts: dict) -> bool:
    """Does the reference report this conclusion of the chapter not reproduced? Then a run must not
    reproduce it either (the gate keeps the reference's findings, both ways)."""
    e = verdicts.get(claim_id)
    return isinstance(e, dict) and e.get("pass") == 0 and e.get("skipped") == 0


def as_json(o: Outcome) -> dict:
    """The verdict for scripts (`attnrepro check --json`): verdict, reference, first lines, problems,
    each metrics file's mode, claim counts, conclusions not reproduced, provenance, and every gated
    metric that failed."""
    return {"verdict": "PASS" if o.ok else "FAIL", "reference": o.label, "computation": o.computation, "notes": o.notes, "problems": o.problems,
            "modes": o.modes, "why_statistical": o.why, "claims": counts(o.results),
            "not_reproduced": o.not_reproduced, "from_reference_seeds": o.from_seeds, "run_differs": o.run_differs,
            "provenance": o.provenance,
            "endpoint_counts": endpoints.summary(o.endpoints),
            "endpoints": [{"metric": j.endpoint.metric, "margin": _margin(j.endpoint),
                           "margin_is": "factor" if j.endpoint.log else "absolute", "answer": j.answer, "seeds": j.n,
                           "reference_seeds": j.n_ref, "run_mean": j.run_mean, "reference_mean": j.ref_mean,
                           "shift": j.shift, "shift_sd": j.shift_sd, "reference_sd": j.ref_sd, "pooled_sd": j.sd,
                           "p_same": j.p_same, "p_different": j.p_different,
                           "seeds_needed": j.seeds_needed} for j in o.endpoints],
            "looks": [{"seeds": look.seeds, **endpoints.summary(look.judgements), "runs": look.runs,
                       "trained": look.trained, "cpu_seconds": look.cpu_seconds} for look in o.looks],
            "conclusion_shares": [{"id": s.result.claim.id, "held": s.held, "seeds": s.n,
                                   "reference_held": s.result.seeds_held, "reference_seeds": s.result.seeds_n,
                                   "p": s.p, "shown_different_at": s.detectable} for s in o.shares],
            "failed_metrics": [{"key": r.key, "run": r.cur, "reference": r.ref, "how": r.how, "verdict": r.verdict}
                               for r in o.rows if r.failure]}


def _margin(e) -> float:
    """An endpoint's margin as claims.yaml writes it, a number: 0.1 for "±0.1" (its unit), 2 for "×2" (a factor)."""
    return round(math.exp(e.margin) if e.log else e.margin, 12)


LEGEND = (("SAME", "shown inside its margin of the reference: nothing to do"),
          ("DIFFERENT", "shown beyond its margin: a problem, the check fails; see what moved (git diff --stat, "
                        "report/REPORT.md), or keep the run on purpose (attnrepro keep)"),
          ("INCONCLUSIVE", "neither, not a failure (one rerun seed rarely decides); to decide it: attnrepro check "
                           "--decide (reruns the reference's seeds, minutes to hours)"))


def render_md(o: Outcome, show_all: bool = False) -> str:
    """The verdict as a Markdown document (`attnrepro check --md`, e.g. a pull request's comment): the
    first line as a heading, the summary in a code block, then each section of `render` under a heading
    of its own; files named relative to the checkout."""
    first, summary, sections = _parts(o, show_all)
    lines = [f"### check: {first}", "", "```", *(line for line in summary if line.strip()), "```"]
    for title, body in sections:
        lines += ["", f"#### {title}", ""] if title else [""]
        lines += [f"- **{b[0]}**: {b[1]}" if isinstance(b, tuple) else b for b in body]
    text = "\n".join(lines).rstrip() + "\n"
    return text.replace(o.root.rstrip("/") + "/", "") if o.root else text


def render(o: Outcome, show_all: bool = False) -> str:
    first, summary, sections = _parts(o, show_all)
    lines = [f"check: {first}", *summary]
    for title, body in sections:
        lines += ["", "problems:"] if title == "problems" else ["", title, ""] if title else [""]
        lines += [f"  {b[0]:<13}{b[1]}" if isinstance(b, tuple) else b for b in body]
    return "\n".join(lines) + "\n"


def _parts(o: Outcome, show_all: bool) -> tuple[str, list[str], list[tuple[str, list]]]:
    """(the verdict, the summary under it, the sections (title, lines; a (word, meaning) pair is a legend line))."""
    c = counts(o.results)
    gated = [r for r in o.rows if r.verdict not in ("info", "new", "skipped")]
    exact = sorted(f for f, m in o.modes.items() if m == "exact")
    stat = sorted(f for f, m in o.modes.items() if m == "statistical")
    if not o.ok:
        first = f"FAIL — this run does not reproduce the reference ({o.label}): {len(o.problems)} problem(s), listed below"
    elif o.rerun == []:
        first = (f"PASS — nothing was rerun: metrics/ holds the reference's ({o.label}) own results, consistent with "
                 "their records (bash scripts/reproduce.sh reruns them; then check again)")
    elif exact and not stat:
        first = f"PASS — this run reproduces the reference ({o.label}) exactly"
    else:  # judged statistically somewhere: nothing shown different, which is less than shown the same
        first = f"PASS — nothing in this run is shown to differ from the reference ({o.label})"
    lines = [f"  {n}" for n in ([o.computation] if o.computation else []) + o.notes] + [""]
    tally = tally_lines(c)
    for k in ("conclusion", "finding", "checksum"):  # published values after the metrics
        if k == "checksum" and o.from_seeds:
            lines.append(f"              {len(o.from_seeds)} of these with seeds, judged statistically, keep the "
                         "reference seeds' verdict (one run cannot move a share"
                         + ("; --decide's seeds: below)" if o.shares else ")")
                         + ("; this run's own outcome differs on " + ", ".join(o.run_differs) if o.run_differs else ""))
        if k in tally:
            lines.append(f"  {tally[k]}")
        missed = [r.claim.id for r in o.results if kind(r.claim) == k and r.claim.id in o.not_reproduced]
        if missed:
            lines.append(f"              {len(missed)} not reproduced, as on the reference: " + ", ".join(missed))
    if o.endpoints:
        lines.append(f"  {endpoints.summary_line(o.endpoints)}")
    n_exact = sum(r.how.startswith("exact") for r in gated)
    how = ([f"{n_exact} exact"] if n_exact else []) + (
        [f"{len(gated) - n_exact} to their drift tolerance"] if len(gated) > n_exact else [])
    shown = {"band, not gated": "with seeds (band and z shown)", "timing, not gated": "timings",
             "not gated": "informational"}
    free = [f"{n} {word}" for kind_of, word in shown.items() if (n := sum(r.how == kind_of for r in o.rows))]
    lines.append(f"  metrics     {sum(not r.failure for r in gated)} of {len(gated)} gated metrics hold "
                 f"({', '.join(how) or 'none'})" + (f"; not gated: {', '.join(free)}" if free else ""))
    if "value" in tally:
        lines.append(f"  {tally['value']}")
    if exact:
        lines.append(f"  exact verdict (made as the reference's: same machine records and params): {', '.join(exact)}")
    reasons: dict[str, list[str]] = {}
    for f in stat:
        reasons.setdefault(o.why.get(f, ""), []).append(f)
    for why, files in reasons.items():
        lines.append(f"  statistical verdict ({why}): {', '.join(files)}")
    if o.provenance:
        lines += [f"  provenance: {o.provenance[0]}"] + [f"              {x}" for x in o.provenance[1:]]
    sections: list[tuple[str, list]] = []
    if o.problems:
        sections.append(("problems", [f"- {p}" for p in o.problems]))
    if o.endpoints:
        sections.append(("primary endpoints (this run's mean against the reference seeds' mean: geometric means, and "
                         "the shift as a factor, for those judged on the log scale)",
                         md_table(["endpoint", "margin", "seeds (run, ref)", "this run", "reference", "shift", "answer"],
                                  [[j.endpoint.metric, j.endpoint.text, f"{j.n}, {j.n_ref}", fmt_number(j.run_mean),
                                    fmt_number(j.ref_mean), j.shift_text(),
                                    j.answer + (f": {j.need_text()}" if j.need_text() else "")] for j in o.endpoints])
                         + [""] + list(LEGEND)))
    if o.shares:
        sections.append(("the chapter's conclusions on --decide's seeds against the reference's (shown, not gated: "
                         "Fisher's exact test of the two shares)",
                         md_table(["conclusion", "on these seeds", "on the reference's", "p", "shown different at"],
                                  [[s.result.claim.id, f"{s.held} of {s.n}", s.result.share_text(), f"{s.p:.2g}",
                                    s.detectable_text()] for s in o.shares])))
    shown = [r for r in o.rows if show_all or r.failure]
    if shown:
        sections.append(("all metrics" if show_all else "other metrics that failed",
                         md_table(["metric", "this run", "reference run", "reference band", "how", "verdict"],
                                  [[r.key, fmt_number(r.cur), fmt_number(r.ref), r.band_text(), r.how, r.verdict]
                                   for r in shown])))
    claims = [r for r in o.results if show_all or (r.gated_failure and r.claim.id not in o.not_reproduced)]
    if claims:
        rows = []
        for r in claims:
            detail = r.detail or (f"{fmt_number(r.value)} vs {fmt_number(r.claim.published)}" if r.claim.is_cell else "")
            if r.seeds_n:
                detail = detail if r.share_text() in detail else (detail + "; " if detail else "") + r.share_text()
            rows.append([r.claim.id, r.claim.cls, r.status, detail])
        sections.append(("claims" if show_all else "claims that failed",
                         md_table(["claim", "class", "result", "detail"], rows)))
    if not show_all:
        sections.append(("", ["(`attnrepro check --all` lists every metric and claim, timings included)"]))
    return first, lines, sections
