"""`attnrepro check --decide`: rerun the primary endpoints' runs at more of the reference's seeds, in looks of
stats.LOOKS seeds, until every endpoint is decided, one is DIFFERENT, or the reference's seeds run out (the
rule and its error spending: docs/VERDICT.md); the run store serves every run already made, so no run trains
twice. `conclusion_shares`: the chapter's conclusions on the last look's seeds against the reference's share
(shown, not gated)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from scipy.stats import fisher_exact

from attnrepro.config import UserError
from attnrepro.envinfo import resolve_device, setup_determinism
from attnrepro.experiments.comparison import comparison, pairs_by_dhead
from attnrepro.experiments.protocol import corpus_inputs
from attnrepro.judge import endpoints
from attnrepro.judge.claims import ClaimResult, evaluate_claim
from attnrepro.judge.endpoints import Endpoint, Judgement
from attnrepro.provenance.records import RUN_FILES, run_config
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import ALPHA, LOOKS, flatten


@dataclass
class Look:
    seeds: list[int]
    judgements: list[Judgement]
    runs: int  # the look's runs in all (from the store or trained now)
    trained: int  # trained by this look
    cpu_seconds: float  # the look's runs' own times (one thread each), trained now or earlier
    seed_runs: dict = field(default_factory=dict)  # the last look's: {file: {seed: that seed's metrics}}, as dist's "runs"

    def line(self) -> str:
        c = endpoints.summary(self.judgements)
        return (f"look at {len(self.seeds)} seed{'s' * (len(self.seeds) > 1)} {self.seeds}: {c['SAME']} SAME, "
                f"{c['DIFFERENT']} DIFFERENT, {c['INCONCLUSIVE']} INCONCLUSIVE; {self.runs} runs "
                f"({self.trained} trained now), {self.cpu_seconds / 60:.1f} CPU-min")


def sequential(family: Sequence[Endpoint], reference: Mapping[str, Sequence[float]],
               values_at: Callable[[int], tuple[dict, list, int, int, float]], max_seeds: int,
               alpha: float = ALPHA, looks: Sequence[int] = LOOKS) -> list[Look]:
    """The looks, in order, until decided: values_at(n) gives (each endpoint's values at the first n seeds,
    those seeds, runs, trained, cpu seconds). Looks beyond `max_seeds` are cut to it (and stop there)."""
    out = []
    for n in sorted({min(n, max_seeds) for n in looks}):
        values, seeds, runs, trained, cpu = values_at(n)
        judged = endpoints.judge(family, reference, values, alpha, looks=len(looks))
        out.append(Look(seeds, judged, runs, trained, cpu))
        c = endpoints.summary(judged)
        if c["DIFFERENT"] or not c["INCONCLUSIVE"]:
            break
    return out


def rerun_values(params: Mapping, file: str, seeds: Sequence[int], engine: EngineConfig) -> tuple[dict, tuple]:
    """({seed: the metrics of that seed's runs, as metrics/<file>.json nests them}, (runs, trained, cpu
    seconds)) for the train variants or the failures table's models at `seeds`, through the run store."""
    cfg = run_config(params, file)
    device = resolve_device(cfg.device, f"{file}.device")
    setup_determinism(cfg.threads, device)
    keys = [(v, s) for s in seeds for v in cfg.variants]
    records = run_sweep(f"check --decide ({file})", [cfg.spec(v, s, device) for v, s in keys], corpus_inputs(),
                        engine)
    require_ok(records, f"check --decide ({file})")
    by = dict(zip(keys, records))
    out = {}
    for s in seeds:
        m = {v: by[(v, s)].summary() for v in cfg.variants}
        if file == "train":
            m["comparison"] = comparison(m, pairs_by_dhead(cfg))
        out[s] = m
    cpu = sum(float(r.read("timing.json").get("seconds", 0.0)) for r in records if r.path is not None)
    return out, (len(records), sum(not r.cached for r in records), cpu)


def decide(family: Sequence[Endpoint], ref_dists: Mapping[str, dict], params: Mapping, engine: EngineConfig,
           max_seeds: int = max(LOOKS)) -> list[Look]:
    """The looks of --decide for the primary endpoints of RUN_FILES, at the reference's seeds in its order, up
    to `max_seeds` (alpha is spent over all of stats.LOOKS whatever the cap: stopping early costs nothing)."""
    family = [e for e in family if e.metric.split(".", 1)[0] in RUN_FILES]
    files = sorted({e.metric.split(".", 1)[0] for e in family})
    if not family:
        raise UserError("check --decide: no primary endpoint of the train or failures stage to rerun")
    order = {f: [int(s) for s in (ref_dists.get(f) or {}).get("seeds", [])] for f in files}
    short = [f for f in files if not order[f]]
    if short:
        raise UserError(f"check --decide: the reference has no seeds of {', '.join(short)} (metrics/dist)")
    reference = endpoints.reference_values(family, ref_dists)
    seed_runs: dict[str, dict] = {}

    def values_at(n: int):
        values: dict[str, list[float]] = {e.metric: [] for e in family}
        seeds: list[int] = []
        runs = trained = 0
        cpu = 0.0
        t0 = time.monotonic()
        for f in files:
            per_seed, (r, t, c) = rerun_values(params, f, order[f][:n], engine)
            runs, trained, cpu = runs + r, trained + t, cpu + c
            seeds += [s for s in per_seed if s not in seeds]
            seed_runs[f] = {str(s): m for s, m in per_seed.items()}
            flat = [flatten(m, f"{f}.") for m in per_seed.values()]
            for e in family:
                if e.metric.startswith(f + "."):
                    values[e.metric] = [v for m in flat if (v := endpoints.value(m, e.metric)) is not None]
        print(f"check --decide: {n} seed(s) in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        return values, seeds, runs, trained, cpu

    looks = sequential(family, reference, values_at, min(max_seeds, max(len(v) for v in order.values())))
    looks[-1].seed_runs = seed_runs  # values_at's last call was the last look's
    return looks


# The share test lives here, not in stats.py: stats.py is a dependency of every training stage, and a
# change to the verdict alone must not make their dvc.lock entries stale.
def share_p(k: int, n: int, k_ref: int, n_ref: int) -> float:
    """Two-sided p of Fisher's exact test that a share of k in n and one of k_ref in n_ref come from one
    proportion (scipy.stats.fisher_exact; conditional, so at most alpha under that hypothesis)."""
    return float(fisher_exact([[k, n - k], [k_ref, n_ref - k_ref]]).pvalue)


def shares_shown_different(n: int, k_ref: int, n_ref: int, alpha: float = ALPHA) -> list[int]:
    """The shares k of n that share_p shows different from k_ref of n_ref at alpha: what the test can detect."""
    return [k for k in range(n + 1) if share_p(k, n, k_ref, n_ref) < alpha]


@dataclass
class Share:
    """A conclusion of the chapter on --decide's seeds against the reference's seeds."""
    result: ClaimResult  # on this run, and on the reference's seeds
    held: int  # on how many of the rerun seeds it holds
    n: int
    p: float  # share_p: the two shares from one proportion
    detectable: list[int]  # the shares of n that the test shows different (shares_shown_different)

    def detectable_text(self) -> str:
        """The shares shown different, as the two tails they form: "≤ 5 of 10", "≤ 1 or ≥ 9 of 10"."""
        k = self.detectable  # sorted
        if not k:
            return f"never, at {self.n} seed{'s' * (self.n > 1)}"
        lo = [x for i, x in enumerate(k) if x == i]  # the tail from 0
        hi = [x for i, x in enumerate(reversed(k)) if x == self.n - i]  # the tail to n
        if len(lo) + len(hi) > len(k):
            return f"any of {self.n}"
        return " or ".join(([f"≤ {lo[-1]}"] if lo else []) + ([f"≥ {hi[-1]}"] if hi else [])) + f" of {self.n}"


def conclusion_shares(results: Sequence[ClaimResult], seed_runs: Mapping[str, dict], metrics: Mapping[str, float],
                      ref_dists: Mapping[str, dict], envs: Mapping[str, dict]) -> list[Share]:
    """The conclusions with seeds whose seeded metrics --decide reran (its last look's `seed_runs`), each on
    those seeds (the other files' metrics from this run), with Fisher's exact test against the reference's
    share. Shown, not gated: the primary endpoints decide, and a share's test was not simulated across
    the looks that chose its number of seeds."""
    out = []
    for res in results:
        seeded = {k.split(".", 1)[0] for k in res.read} & {f for f, d in ref_dists.items() if (d or {}).get("runs")}
        if res.claim.cls != "conclusion" or not res.seeds_n or not seeded or not seeded <= set(seed_runs):
            continue
        again = evaluate_claim(res.claim, metrics, {f: {"runs": runs} for f, runs in seed_runs.items()}, envs)
        if again.seeds_n:
            out.append(Share(res, again.seeds_held, again.seeds_n,
                             share_p(again.seeds_held, again.seeds_n, res.seeds_held, res.seeds_n),
                             shares_shown_different(again.seeds_n, res.seeds_held, res.seeds_n)))
    return out
