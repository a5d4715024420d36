"""The four silent bugs of §1.11.7: their runs (params section `failures`) and symptoms."""

from __future__ import annotations

from dataclasses import dataclass

from attnrepro.config import from_dict, require, require_positive
from attnrepro.experiments.protocol import CORPUS, corpus_inputs, optim_config, vocab_size
from attnrepro.measure.health import INTENDED, Probe, check_matrix
from attnrepro.measure.probes import diag_weight_all_rows
from attnrepro.model.attention import BUGS
from attnrepro.model.transformer import ModelConfig, load_checkpoint
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.run.loop import OptimConfig, fixed_batches, load_tokens
from attnrepro.run.spec import RunSpec
from attnrepro.run.task_lm import LMData, LMMeasure
from attnrepro.stats import distribution

SYMPTOMS = ("loss_final", "grad_norm_final", "entropy", "diag_weight")  # what a failures run records


@dataclass
class FailuresConfig(OptimConfig):
    seed: int  # model init and batch order, as in train
    threads: int
    device: str
    val_batches: int  # the symptoms are measured on these fixed validation batches
    val_seed: int
    loss_window: int
    model: dict  # ModelConfig fields (vocab_size comes from the corpus, bug from variants)
    variants: list[str]
    spread_seeds: list[int]  # each variant again with these seeds: the seed spread of each symptom

    def validate(self, prefix: str = "failures") -> None:
        super().validate(prefix)
        require_positive(self, ("threads", "val_batches", "loss_window"), prefix)
        require(len(self.variants) > 0 and len(set(self.variants)) == len(self.variants), f"{prefix}.variants",
                self.variants, "a non-empty list without repeats")
        for v in self.variants:
            require(v in BUGS, f"{prefix}.variants", v, "entries from " + ", ".join(BUGS))
        seeds = [self.seed, *self.spread_seeds]
        require(len(self.spread_seeds) > 0 and len(set(seeds)) == len(seeds), f"{prefix}.spread_seeds",
                self.spread_seeds, "at least one seed, without repeats, other than failures.seed "
                "(the symptoms' seed distribution needs two)")
        for key in ("bug", "vocab_size"):
            require(key not in self.model, f"{prefix}.model.{key}", self.model.get(key),
                    "not set here (bug comes from variants, vocab_size from the corpus)")
        from_dict(ModelConfig, {**self.model, "bug": "correct", "vocab_size": None}, prefix=f"{prefix}.model")

    def spec(self, bug: str, seed: int, device: str, model: dict | None = None, label: str = "",
             **optim) -> RunSpec:
        """The run of `bug` at `seed`; `model` and `optim` override ModelConfig / OptimConfig fields
        (the sensitivity sweep's one-factor changes)."""
        fields = {**self.model, **(model or {}), "bug": bug, "vocab_size": None}
        return RunSpec(
            task="corpus_lm", model=from_dict(ModelConfig, fields, prefix="failures.model"),
            optim=optim_config(self, "failures", **optim), seed=seed, batch_seed=seed,
            data=LMData(val_batches=self.val_batches, val_seed=self.val_seed),
            diag_every=0, diag_steps=(), eval_every=0, eval_final=False,
            measure=LMMeasure(loss_window=self.loss_window, summary_steps=[], diagnostics=False, qk_scale=False,
                              symptoms=True, sample=None),
            threads=self.threads, device=device, label=label or f"{bug} seed {seed}")


@dataclass
class FailuresResult:
    """What the failures stage writes: the symptom table of `failures.seed` (with the check-by-variant
    matrix), its seed distribution, the per-step histories and the runs' environment records."""

    metrics: dict  # variant -> symptoms, check_<name> (1 = fires), check_<name>_value, checks_fired, ...
    dist: dict  # stats.distribution over every seed
    histories: dict  # variant -> per-step rows of the `failures.seed` run
    seed_rows: list  # one row per variant and seed: the SYMPTOMS
    check_rows: list  # one row per variant and check
    fired: dict  # variant -> the names of the checks that fire
    records: list  # the sweep.RunRecords of every run

    def lines(self) -> list[str]:
        """The stage's printed summary: one line per variant, then its spread over the seeds."""
        out = []
        for bug, m in self.metrics.items():
            out.append(f"{bug:20s} loss {m['loss_start']:.3f} -> {m['loss_final']:.3f}  "
                       f"grad {m['grad_norm_final']:.3f}  entropy {m['entropy']:.4f}  diag {m['diag_weight']:.3f}  "
                       f"max row sum {m['max_row_sum']:.4f}  checks fired: {', '.join(self.fired[bug]) or 'none'}")
        for bug in self.metrics:
            st = {k: self.dist["stats"][f"{bug}.{k}"] for k in ("loss_final", "entropy", "diag_weight")}
            out.append(f"{bug:20s} over {len(self.dist['seeds'])} seeds: " + "  ".join(
                f"{k} {s['mean']:.4f} (sd {s['sd']:.4f}, {s['min']:.4f}-{s['max']:.4f})" for k, s in st.items()))
        return out


def run(cfg: FailuresConfig, device: str, engine: EngineConfig) -> FailuresResult:
    """Every variant at `failures.seed` and each spread seed (the run engine: from the store or trained),
    the second diagonal-weight protocol on each run's checkpoint, and the health checks of each
    variant's attention function (run here, on this process's threads)."""
    seeds = [cfg.seed, *cfg.spread_seeds]
    specs = [cfg.spec(bug, seed, device) for seed in seeds for bug in cfg.variants]
    records = run_sweep("failures", specs, corpus_inputs(), engine)
    require_ok(records, "failures")
    by = {(r.spec.model.bug, r.spec.seed): r for r in records}

    mcfg = from_dict(ModelConfig, {**cfg.model, "bug": "correct", "vocab_size": vocab_size()}, prefix="failures.model")
    matrix = check_matrix(cfg.variants, Probe(d_head=mcfg.d_head))
    half = mcfg.block_size // 2
    short = fixed_batches(load_tokens(CORPUS / "val.npy"), half, cfg.batch_size, cfg.val_batches, cfg.val_seed)
    symptoms = {}  # (bug, seed) -> the run's symptoms, with the second diagonal-weight protocol
    for (bug, seed), rec in by.items():
        symptoms[(bug, seed)] = {k: v for k, v in rec.summary().items() if k != "params"}
        symptoms[(bug, seed)]["diag_weight_all_rows_half_block"] = diag_weight_all_rows(
            load_checkpoint(rec.path / "model.pt", f"failures run {bug} seed {seed}"), short)
    metrics, histories, check_rows, fired = {}, {}, [], {}
    for bug in cfg.variants:
        m = dict(symptoms[(bug, cfg.seed)])
        histories[bug] = by[(bug, cfg.seed)].read("history.json")
        for name, res in matrix[bug].items():
            m[name] = int(not res.passed)  # 1 = the check fires
            m[f"{name}_value"] = res.measured
            check_rows.append({"variant": bug, "check": name, "fires": int(not res.passed),
                               "measured": res.measured, "threshold": res.threshold, "message": res.message})
        fired[bug] = [n for n, r in matrix[bug].items() if not r.passed]
        m["checks_fired"] = len(fired[bug])
        m["caught_by_intended"] = int(INTENDED.get(bug) in fired[bug]) if bug != "correct" else int(not fired[bug])
        metrics[bug] = m

    seed_rows = [{"variant": bug, "seed": seed, **{k: symptoms[(bug, seed)][k] for k in SYMPTOMS}}
                 for seed in seeds for bug in cfg.variants]
    dist = distribution({seed: {bug: symptoms[(bug, seed)] for bug in cfg.variants} for seed in seeds})
    return FailuresResult(metrics=metrics, dist=dist, histories=histories, seed_rows=seed_rows,
                          check_rows=check_rows, fired=fired, records=records)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    if not metrics:
        return ""
    variants = sorted(metrics)
    fired = {v: sorted(k[6:] for k, x in metrics[v].items() if k.startswith("check_") and not k.endswith("_value") and x)
             for v in variants}
    caught = [v for v in variants if v != "correct" and metrics[v].get("caught_by_intended")]
    bugs = [v for v in variants if v != "correct"]
    out = [f"{len(caught)} of {len(bugs)} injected bugs are caught by the health check meant for them"]
    out.append("; ".join(f"{v}: {', '.join(fired[v]) or 'no check fires'}" for v in variants))
    c = metrics.get("correct", {})
    same = [v for v in bugs if metrics[v].get("loss_final") == c.get("loss_final")]
    if same:
        out.append(f"{', '.join(same)} {'trains' if len(same) == 1 else 'train'} exactly like the correct model "
                   f"(final loss {c.get('loss_final'):.4g}): only the health checks tell "
                   f"{'it' if len(same) == 1 else 'them'} apart ("
                   + "; ".join(f"{v}: {', '.join(fired[v]) or 'none'}" for v in same) + ")")
    return ". ".join(out) + "."
