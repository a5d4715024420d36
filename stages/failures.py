"""DVC stage `failures`: inject the four silent bugs of §1.11.7 and record their symptoms.

The small config is trained for `failures.steps` steps per variant (correct and each
attention.BUGS entry) with the same seed, the same initialization and the same batches;
the only difference is ModelConfig(bug=...). Symptoms are measured on fixed validation
batches after training. `entropy` is the normalized entropy of the row-renormalized weights (p / row sum) over
the keys the row can actually weight (all keys for mask_zero, whose mask leaks; the
causal count otherwise), so it is in [0, 1] for every variant (attnrepro.measure.probes);
`entropy_raw` keeps the naive value. The health checks of attnrepro.measure.health run on the attention
function with each variant's switches; which of them fire is the check-by-variant matrix.

The symptom table comes from `failures.seed`. Every variant is trained again with each
of `failures.spread_seeds` (each seed drives both the initialization and the batch
order; the validation batches stay fixed): metrics/dist/failures.json holds every
symptom's distribution over all the seeds (attnrepro.stats), which `attnrepro check`
and the claims use, as they do the train stage's.

A second measuring protocol for the diagonal weight, `diag_weight_all_rows_half_block`:
windows of half the model's block (32 tokens at block 64) of the same validation stream,
every row counted (row 0 included), as the source's published diagonal weights suggest it
measured.

Writes metrics/failures.json (<variant>.loss_final, .entropy, .max_row_sum, ...,
<variant>.check_<name> = 1 when the check fires), metrics/dist/failures.json,
plots/failures/<variant>.csv (per step), plots/failures/seeds.csv (one row per
variant and seed), plots/failures/checks.csv and plots/failures/training.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnrepro.experiments.failures import FailuresConfig, SYMPTOMS
from attnrepro.experiments.protocol import CORPUS, corpus_inputs, vocab_size
from attnrepro.config import from_dict, load_section, read_params, run_stage
from attnrepro.envinfo import setup_determinism, stage_environment
from attnrepro.measure.health import INTENDED, Probe, check_matrix
from attnrepro.io import write_csv, write_json
from attnrepro.model import ModelConfig, load_checkpoint
from attnrepro.figures import failures_figure
from attnrepro.measure.probes import diag_weight_all_rows
from attnrepro.runtime import resolve_device
from attnrepro.stats import distribution
from attnrepro.sweep import add_engine_args, engine_config, require_ok, run_sweep
from attnrepro.training import fixed_batches, load_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    add_engine_args(ap)
    args = ap.parse_args()
    cfg = load_section(FailuresConfig, "failures", args.params)
    engine = engine_config(read_params(args.params), args.scheduler, args.workers)
    device = resolve_device(cfg.device, "failures.device")
    setup_determinism(cfg.threads, device)  # the health checks below run here

    seeds = [cfg.seed, *cfg.spread_seeds]
    specs = [cfg.spec(bug, seed, device) for seed in seeds for bug in cfg.variants]
    records = run_sweep("failures", specs, corpus_inputs(), engine)
    require_ok(records, "failures")
    by = {(r.spec.model.bug, r.spec.seed): r for r in records}

    mcfg = from_dict(ModelConfig, {**cfg.model, "vocab_size": vocab_size()}, prefix="failures.model")
    matrix = check_matrix(cfg.variants, Probe(d_head=mcfg.d_head))
    half = mcfg.block_size // 2
    short = fixed_batches(load_tokens(CORPUS / "val.npy"), half, cfg.batch_size, cfg.val_batches, cfg.val_seed)
    symptoms = {}  # (bug, seed) -> the run's symptoms, with the second diagonal-weight protocol
    for (bug, seed), rec in by.items():
        symptoms[(bug, seed)] = {k: v for k, v in rec.summary().items() if k != "params"}
        symptoms[(bug, seed)]["diag_weight_all_rows_half_block"] = diag_weight_all_rows(
            load_checkpoint(rec.path / "model.pt", f"failures run {bug} seed {seed}"), short)
    metrics, histories, check_rows = {}, {}, []
    for bug in cfg.variants:
        rec = by[(bug, cfg.seed)]
        m = dict(symptoms[(bug, cfg.seed)])
        histories[bug] = rec.read("history.json")
        for name, res in matrix[bug].items():
            m[name] = int(not res.passed)  # 1 = the check fires
            m[f"{name}_value"] = res.measured
            check_rows.append({"variant": bug, "check": name, "fires": int(not res.passed),
                               "measured": res.measured, "threshold": res.threshold, "message": res.message})
        fired = [n for n, r in matrix[bug].items() if not r.passed]
        m["checks_fired"] = len(fired)
        m["caught_by_intended"] = int(INTENDED.get(bug) in fired) if bug != "correct" else int(not fired)
        metrics[bug] = m
        write_csv(Path("plots/failures") / f"{bug}.csv", histories[bug])
        print(f"{bug:20s} loss {m['loss_start']:.3f} -> {m['loss_final']:.3f}  grad {m['grad_norm_final']:.3f}  "
              f"entropy {m['entropy']:.4f}  diag {m['diag_weight']:.3f}  max row sum {m['max_row_sum']:.4f}  "
              f"checks fired: {', '.join(fired) or 'none'}")

    seed_rows = [{"variant": bug, "seed": seed, **{k: symptoms[(bug, seed)][k] for k in SYMPTOMS}}
                 for seed in seeds for bug in cfg.variants]
    dist = distribution({seed: {bug: symptoms[(bug, seed)] for bug in cfg.variants} for seed in seeds})
    for bug in cfg.variants:
        st = {k: dist["stats"][f"{bug}.{k}"] for k in ("loss_final", "entropy", "diag_weight")}
        print(f"{bug:20s} over {len(seeds)} seeds: " + "  ".join(
            f"{k} {s['mean']:.4f} (sd {s['sd']:.4f}, {s['min']:.4f}-{s['max']:.4f})" for k, s in st.items()))

    write_json("metrics/failures.json", metrics)
    write_json("metrics/dist/failures.json", dist)
    write_csv("plots/failures/seeds.csv", seed_rows)
    write_json("metrics/env/failures.json", stage_environment(device, [r.read("env.json") for r in records]))
    write_csv("plots/failures/checks.csv", check_rows)
    failures_figure(histories, Path("plots/failures/training.png"))


if __name__ == "__main__":
    run_stage(main)
