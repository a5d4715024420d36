"""The runs behind the train and failures stages' metrics, as the verdict reads them.

`decide` (`attnrepro check --decide`): rerun the primary endpoints' runs at more of the reference's
seeds, in looks of stats.LOOKS seeds (the reference's first 1, 3, 5, 10), until no endpoint is
INCONCLUSIVE, one is DIFFERENT, or the reference's seeds run out. Each look spends alpha / len(LOOKS)
(Bonferroni over looks: docs/VERDICT.md); the run store serves every run already made, so no run
trains twice. `conclusion_shares`: the chapter's conclusions on the last look's seeds, against the reference's
share (shown, not gated). `store_findings`: those stages' metrics against the summaries the run store keeps of
the runs that made them (a metric edited together with dvc.lock is caught where the store holds its run).
`sweep_findings`: a sweep's metrics are aggregates over its runs, so each sweep whose runs the store
holds is made again from them, training nothing, and its outputs compared with the committed ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from scipy.stats import fisher_exact

from attnrepro.config import UserError, from_dict
from attnrepro.envinfo import resolve_device, setup_determinism
from attnrepro.experiments.comparison import comparison, pairs_by_dhead
from attnrepro.experiments.failures import FailuresConfig
from attnrepro.experiments.protocol import CORPUS_FILES, TrainConfig, corpus_inputs
from attnrepro.files import dvc_entry, dvc_stages, read_json
from attnrepro.formatting import fmt_number
from attnrepro.judge import endpoints
from attnrepro.judge.claims import ClaimResult, evaluate_claim, same
from attnrepro.judge.endpoints import Endpoint, Judgement
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.run.execute import run_key
from attnrepro.run.stage import is_sweep
from attnrepro.store.run_store import RunStore
from attnrepro.stats import ALPHA, LOOKS, flatten

FILES = ("train", "failures")  # the stages whose runs --decide can rerun


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


def _records_cost(records) -> tuple[int, int, float]:
    cpu = sum(float(r.read("timing.json").get("seconds", 0.0)) for r in records if r.path is not None)
    return len(records), sum(not r.cached for r in records), cpu


def _config(params: Mapping, file: str):
    return from_dict(TrainConfig if file == "train" else FailuresConfig, params[file], prefix=file)


def rerun_values(params: Mapping, file: str, seeds: Sequence[int], engine: EngineConfig) -> tuple[dict, tuple]:
    """({seed: the metrics of that seed's runs, as metrics/<file>.json nests them}, (runs, trained, cpu
    seconds)) for the train variants or the failures table's models at `seeds`, through the run store."""
    cfg = _config(params, file)
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
    return out, _records_cost(records)


def decide(family: Sequence[Endpoint], ref_dists: Mapping[str, dict], params: Mapping, engine: EngineConfig,
           max_seeds: int = max(LOOKS)) -> list[Look]:
    """The looks of --decide for the primary endpoints of FILES, at the reference's seeds in its order, up
    to `max_seeds` (alpha is spent over all of stats.LOOKS whatever the cap: stopping early costs nothing)."""
    family = [e for e in family if e.metric.split(".", 1)[0] in FILES]
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
                    values[e.metric] = [m[e.metric] for m in flat if e.metric in m]
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


MACHINE = ("cpu", "cpu_capability", "device", "torch")  # a run's numbers are comparable where these agree


def store_findings(root: Path, params: Mapping, metrics: Mapping[str, float], dists: Mapping[str, dict],
                   envs: Mapping[str, dict], producers: Mapping[str, str]) -> list[str]:
    """Each seed's runs of metrics/dist/<file>.json (made by the stage producers[file]), and the run
    seed's metrics/<file>.json, for FILES, against the summary the run store (params engine.store) keeps
    under the run's key, recomputed from params, the device the stage ran on and the corpus: every number
    both hold must be equal. Compared only where the run was made on the machine the stage's record names
    (MACHINE): a store filled elsewhere holds other float orders under the same keys. Runs the store does
    not hold are not read; nothing is moved."""
    engine = params.get("engine") or {}
    store = RunStore(root / str(engine.get("store", "runs")), say=lambda line: None)
    corpus = root / "data" / "corpus"
    if not store.root.is_dir() or not all((corpus / n).is_file() for n in CORPUS_FILES):
        return []
    inputs = corpus_inputs(corpus)
    problems = []
    for file in FILES:
        seeds = [int(x) for x in (dists.get(file) or {}).get("seeds", [])]
        device = (envs.get(file) or {}).get("device")
        if not seeds or file not in params or not device:
            continue
        cfg = _config(params, file)
        for seed in seeds:
            for variant in cfg.variants:
                key = run_key(cfg.spec(variant, seed, device), inputs)
                summary = store.path(key) / "summary.json"
                if not summary.is_file():
                    continue
                ran_on_file = summary.with_name("env.json")  # an entry without one: its machine unknown, not read
                recorded, ran_on = read_json(summary), read_json(ran_on_file) if ran_on_file.is_file() else {}
                mine = [(f"metrics/dist/{file}.json seed {seed} {variant}", producers.get(file, file),
                         (dists[file]["runs"].get(str(seed)) or {}).get(variant) or {})]
                if seed == cfg.seed and not (root / "data" / file / variant / "summary.json").is_file():
                    # (a run folder the stage keeps is read by check.run_record_findings already)
                    mine.append((f"metrics/{file}.json {variant}", file, {k[len(f"{file}.{variant}."):]: v for k, v
                                                                         in metrics.items()
                                                                         if k.startswith(f"{file}.{variant}.")}))
                for where, stage, values in mine:
                    if any(ran_on.get(k) != (envs.get(stage) or {}).get(k) for k in MACHINE):
                        continue
                    bad = sorted(k for k, v in recorded.items() if k in values and not same(values[k], v))
                    problems += [f"{where}: {k} = {fmt_number(values[k])}, but the run that made it (store "
                                 f"{key[:12]}) recorded {fmt_number(recorded[k])}" for k in bad]
    return problems


def sweep_findings(root: Path, params: Mapping, envs: Mapping[str, dict], live: Callable[[str], dict],
                   say: Callable[[str], None] = lambda line: None) -> tuple[list[str], list[str]]:
    """(problems, notes): each sweep stage (run.stage.SWEEPS, choices@<arm> included) whose machine record
    names this machine (MACHINE) and whose runs it made here is run again in a scratch folder from the run
    store with --store-only (a run the store lacks stops it: a note, not a problem), and every number of
    its metrics/*.json and every byte of its CSVs compared with the working tree's. Nothing in the
    working tree is written and nothing trains (the scratch folder is removed; the store is read as any
    stage reads it, so an entry found damaged is quarantined)."""
    root = root.resolve()  # the scratch folder links to it
    store = (root / str((params.get("engine") or {}).get("store", "runs"))).resolve()
    problems: list[str] = []
    notes: list[str] = []
    if not store.is_dir():
        return problems, notes
    elsewhere = []
    for name, st in dvc_stages(root).items():
        outs = [dvc_entry(o)[0] for o in st.get("outs") or []]
        env_file = next((o for o in outs if o.startswith("metrics/env/")), None)
        env = envs.get(Path(env_file).stem) if env_file else None
        if not is_sweep(name) or not env:
            continue
        if env.get("runs_on") != "this machine" or \
                any(env.get(k) != live(str(env.get("device", "cpu"))).get(k) for k in MACHINE):
            elsewhere.append(name)
            continue
        say(f"check: making {name} again from the run store (no training) ...")
        with tempfile.TemporaryDirectory(prefix="attnrepro-remake-") as tmp:
            scratch = Path(tmp)
            made, why = _remake(root, scratch, st, store)
            if not made:
                notes.append(f"{name}: not made again from the run store ({why})")
                continue
            files = [f.relative_to(root).as_posix() for o in outs if not o.startswith("metrics/env/")
                     for f in ([root / o] if (root / o).is_file() else sorted((root / o).rglob("*")))]
            for out in files:
                mine, again = root / out, scratch / out
                if not mine.is_file() or not again.is_file():
                    continue
                if out.endswith(".json"):
                    a, b = flatten(read_json(mine)), flatten(read_json(again))
                    bad = sorted(k for k in set(a) | set(b) if not same(a.get(k), b.get(k)))
                    problems += [f"{out}: {k} = {fmt_number(a.get(k))}, but made again from the run store's records "
                                 f"it is {fmt_number(b.get(k))}" for k in bad[:3]]
                    if len(bad) > 3:
                        problems.append(f"{out}: and {len(bad) - 3} more numbers differ from the ones made again "
                                        "from the run store")
                elif out.endswith(".csv") and mine.read_bytes() != again.read_bytes():
                    problems.append(f"{out} differs from the one made again from the run store's records")
    if elsewhere:
        notes.append(f"{', '.join(elsewhere)}: made on another machine than this one, so not made again from this "
                     "run store (its float order differs)")
    return problems, notes


def _remake(root: Path, scratch: Path, stage: Mapping, store: Path) -> tuple[bool, str]:
    """Run `stage`'s command in `scratch` (its code and read-only inputs linked, the files it reads
    under metrics/ and plots/ copied) with the run store at `store`, --store-only."""
    for part in ("src", "stages", "scripts"):
        (scratch / part).symlink_to(root / part)
    for f in ("params.yaml", "dvc.yaml"):
        shutil.copy(root / f, scratch / f)
    for dep in (dvc_entry(d)[0] for d in stage.get("deps") or []):
        src, dst = root / dep, scratch / dep
        if dep.split("/")[0] in ("src", "stages", "scripts") or not src.exists() or dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dep.startswith(("metrics/", "plots/")):
            (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
        else:
            dst.symlink_to(src)
    words = str(stage["cmd"]).split()
    script = next(i for i, w in enumerate(words) if w.startswith("stages/"))
    cmd = [sys.executable, *words[script:], "--store", str(store), "--store-only", "--workers", "1"]
    proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "src")})
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return False, lines[-1].removeprefix("error: ") if lines else f"exit {proc.returncode}"
    return True, ""
