"""The controlled comparison: loss gaps of scaled vs unscaled pairs, per d_head (the train
stage: run_train), and over seeds (the seeds stage: run_seeds)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from attnrepro import figures
from attnrepro.config import UserError, require
from attnrepro.envinfo import stage_environment
from attnrepro.experiments.protocol import TrainConfig, corpus_inputs, d_head_of, series
from attnrepro.formatting import fmt_number, md_table
from attnrepro.model.attention_impl import AttentionConfig
from attnrepro.run.engine import require_ok, run_sweep
from attnrepro.run.engine_settings import EngineConfig
from attnrepro.stats import (ALPHA, Modes, bootstrap_ratio, describe, distribution, fieller_ratio, find_modes,
                             gap_groups, log_scale, modes_power, percentile_of)


@dataclass
class SeedsConfig:
    seeds: list[int]  # paired seeds; include train.seed to share the train stage's runs
    mode_statistic: str  # a per-variant metric whose seeds are tested for two modes (stats.find_modes)

    def validate(self, prefix: str = "seeds") -> None:
        require(len(self.seeds) >= 3 and len(set(self.seeds)) == len(self.seeds), f"{prefix}.seeds", self.seeds,
                "at least 3 different seeds (a spread needs them)")


def pairs_by_dhead(cfg: TrainConfig) -> dict[int, dict[bool, str]]:
    """{d_head: {scaled: variant name}} over the variants that differ only in `scaled`."""
    out: dict[int, dict[bool, str]] = {}
    for name, v in cfg.variants.items():
        out.setdefault(d_head_of(cfg, name), {})[bool(v.get("scaled", True))] = name
    return out


def gap_d_heads(pairs: dict[int, dict[bool, str]]) -> tuple[int, int]:
    """The smallest and the largest d_head with a scaled and an unscaled variant."""
    d_heads = sorted(d for d, p in pairs.items() if set(p) == {True, False})
    return d_heads[0], d_heads[-1]


def comparison(metrics: dict, pairs: dict[int, dict[bool, str]]) -> dict:
    """Loss gaps (unscaled - scaled) per d_head, and the largest d_head's gap over the smallest's."""
    out, gap = {}, {}
    for d_head, pair in sorted(pairs.items()):
        if set(pair) != {True, False}:
            continue
        for key in ("loss_final", "val_loss_final"):
            g = metrics[pair[False]][key] - metrics[pair[True]][key]
            out[f"gap_d{d_head}_{key}"] = g
            gap.setdefault(key, []).append(g)
    for key, gs in gap.items():
        if len(gs) >= 2 and gs[0] != 0:
            out[f"gap_ratio_{key}"] = gs[-1] / gs[0]  # largest d_head over smallest
    return out


@dataclass
class TrainResult:
    """What the train stage writes: every variant's run, per-step rows and sample, and the comparison."""
    metrics: dict  # metrics/train.json: each variant's summary, and "comparison" (the gaps)
    folders: dict[str, Path]  # variant -> its run's result folder in the run store (data/train/<variant>)
    series: dict[str, list[dict]]  # variant -> per-step rows (plots/train/<variant>.csv)
    samples: str  # plots/train/samples.md
    env: dict  # metrics/env/train.json

    def lines(self) -> list[str]:
        out = []
        for name in self.series:
            s = self.metrics[name]
            out.append(f"{name}: loss {s['loss_start']:.3f} -> {s['loss_final']:.3f}, val {s['val_loss_final']:.3f}, "
                       f"entropy {s['entropy_final']:.4f}")
        return out + [f"{k}: {v:.4f}" for k, v in self.metrics["comparison"].items()]


def run_train(cfg: TrainConfig, attn: AttentionConfig, device: str, engine: EngineConfig) -> TrainResult:
    """Every variant of train.variants at train.seed, with the attention `attn`, as one sweep."""
    specs = [attn.apply(cfg.spec(name, cfg.seed, device)) for name in cfg.variants]
    records = run_sweep("train", specs, corpus_inputs(), engine)
    require_ok(records, "train")
    runs = dict(zip(cfg.variants, records))
    metrics = {name: rec.summary() for name, rec in runs.items()}
    metrics["comparison"] = comparison(metrics, pairs_by_dhead(cfg))
    samples = [f"## {name}\n\n```\n{(rec.path / 'sample.txt').read_text(encoding='utf-8').rstrip()}\n```\n"
               for name, rec in runs.items()]
    return TrainResult(
        metrics=metrics, folders={name: rec.path for name, rec in runs.items()},
        series={name: series(rec.read("history.json"), rec.read("evals.json")) for name, rec in runs.items()},
        samples="# Samples from the prompt, one per variant\n\n" + "\n".join(samples),
        env=stage_environment(device, records))


CURVES = ("loss", "entropy_l0", "jacobian_fro_l0", "logit_std_l0")


def curves(histories: dict[tuple[str, int], list[dict]], variants) -> list[dict]:
    """Per step: mean, min and max over seeds of each variant's curve (wide: one column per series)."""
    df = pd.DataFrame([{"variant": v, "seed": s, **r} for (v, s), rows in histories.items() for r in rows])
    cols = [c for c in CURVES if c in df]
    g = df.groupby(["variant", "step"])[cols].agg(["mean", "min", "max"])
    wide = pd.DataFrame(index=sorted(df["step"].unique()))
    for v in variants:
        for c in cols:
            for stat in ("mean", "min", "max"):
                wide[f"{v}_{c}_{stat}"] = g.loc[v][(c, stat)]
    wide.index.name = "step"
    return [{"step": int(step), **{k: (None if pd.isna(x) else float(x)) for k, x in row.items()}}
            for step, row in wide.iterrows()]


def headline(gaps: pd.DataFrame, small: int, large: int, split: frozenset = frozenset()) -> dict:
    """The gaps at the smallest and largest d_head and their ratio over seeds (one row per seed in
    `gaps`), and the ratio of the mean gaps with a bootstrap interval. The per-seed ratio gets its median
    and range only: its denominator, the small gap, comes near 0 on some seeds, so its mean and a t
    interval around it mean nothing. A gap of a d_head in `split` (a variant of its pair falls into modes)
    gets a percentile bootstrap interval of its mean instead of the t interval, which assumes one normal
    distribution (then "ci95_bootstrap" is 1)."""
    out = {"n_seeds": len(gaps)}
    for key in ("loss_final", "val_loss_final"):
        num, den = gaps[f"gap_d{large}_{key}"], gaps[f"gap_d{small}_{key}"]
        for d_head in (small, large):
            col = f"gap_d{d_head}_{key}"
            d = describe(gaps[col])
            out[col] = {k: d[k] for k in ("mean", "sd", "min", "max", "ci95_lo", "ci95_hi")}
            if d_head in split:
                ci = bootstrap((gaps[col].to_numpy(),), np.mean, confidence_level=1 - ALPHA, n_resamples=10000,
                               method="percentile", random_state=0).confidence_interval
                out[col].update(ci95_lo=float(ci.low), ci95_hi=float(ci.high), ci95_bootstrap=1)
        ratio = gaps[f"gap_ratio_{key}"]
        out[f"gap_ratio_{key}"] = {"median": float(ratio.median()), "min": float(ratio.min()), "max": float(ratio.max())}
        lo, hi = bootstrap_ratio(num, den)
        out[f"gap_ratio_of_means_{key}"] = {"value": float(num.mean() / den.mean()), "ci95_lo": lo, "ci95_hi": hi}
    return out


@dataclass
class SeedsResult:
    """What the seeds stage writes."""
    headline: dict  # metrics/seeds.json: the gaps and the gap ratio over seeds
    dist: dict  # metrics/dist/train.json: every metric's distribution, and each seed's metrics
    gaps: list[dict]  # plots/seeds/gaps.csv: each seed's gaps
    per_seed: list[dict]  # plots/seeds/per_seed.csv: each seed's headline metrics
    histories: list[dict]  # plots/seeds/runs.csv: every run's loss curve (variant, seed, step, loss)
    curves: list[dict]  # plots/seeds/curves.csv: mean and range over seeds of each variant's curves
    modes: dict  # variant -> stats.Modes
    small: int  # the smallest and the largest d_head with a scaled and an unscaled variant
    large: int
    env: dict  # metrics/env/seeds.json
    checkpoints: dict  # (variant, seed) -> the run's model.pt in the run store

    def mode_lines(self) -> list[str]:
        out = []
        for v, m in self.modes.items():
            shares = "; ".join(f"{f['n']} seeds {100 * f['frac']:.0f}% [95% {100 * f['ci95_lo']:.0f}, "
                               f"{100 * f['ci95_hi']:.0f}]" for f in m.frequencies())
            out.append(f"{v}: {len(m.groups)} mode{'s' * (len(m.groups) > 1)} on {m.statistic} "
                       f"(gap ratio {m.ratio:.2f}, p {m.p:.3g} at alpha {m.alpha:.3g}): {shares}")
        return out

    def line(self) -> str:
        h, small, large = self.headline, self.small, self.large
        r, g = h["gap_ratio_of_means_loss_final"], h["gap_ratio_loss_final"]
        return (f"{h['n_seeds']} seeds: gap d{small} {h[f'gap_d{small}_loss_final']['mean']:.3f} "
                f"(sd {h[f'gap_d{small}_loss_final']['sd']:.3f}), gap d{large} "
                f"{h[f'gap_d{large}_loss_final']['mean']:.3f} (sd {h[f'gap_d{large}_loss_final']['sd']:.3f}); "
                f"ratio of mean gaps {r['value']:.2f} [95% {r['ci95_lo']:.2f}, {r['ci95_hi']:.2f}]; "
                f"per-seed ratio: median {g['median']:.2f} (range {g['min']:.2f} to {g['max']:.2f})")


def run_seeds(cfg: TrainConfig, seeds: list[int], statistic: str, device: str, engine: EngineConfig) -> SeedsResult:
    """train.variants at every seed of `seeds` (paired), as one sweep; the comparison over seeds, and
    each variant's seeds tested for two modes on `statistic`."""
    keys = [(v, s) for s in seeds for v in cfg.variants]
    records = run_sweep("seeds", [cfg.spec(v, s, device) for v, s in keys], corpus_inputs(), engine)
    require_ok(records, "seeds")
    by = dict(zip(keys, records))

    pairs = pairs_by_dhead(cfg)
    runs = {}
    for s in seeds:
        m = {v: by[(v, s)].summary() for v in cfg.variants}
        runs[s] = {**m, "comparison": comparison(m, pairs)}
    modes = variant_modes(runs, list(cfg.variants), statistic)
    # a per-seed ratio with a noisy denominator has no meaningful t band: the gaps themselves have one,
    # and the ratio of the mean gaps gets a bootstrap interval (headline)
    dist = distribution(runs, exclude=("gap_ratio",), modes_of=lambda k: modes_of(k, modes, pairs),
                        modes={v: {"statistic": m.statistic, "gap_ratio": m.ratio, "p": m.p, "alpha": m.alpha,
                                   "modes": m.frequencies()} for v, m in modes.items()})
    gaps = pd.DataFrame([{"seed": s, **runs[s]["comparison"]} for s in seeds])
    small, large = gap_d_heads(pairs)
    histories = {(v, s): by[(v, s)].read("history.json") for v in cfg.variants for s in seeds}
    split = frozenset(d for d in (small, large) if any(len(modes[v].groups) > 1 for v in pairs[d].values()))
    head = headline(gaps, small, large, split)
    head["modes"] = modes_headline(runs, modes)
    return SeedsResult(headline=head, dist=dist, gaps=gaps.to_dict("records"), per_seed=per_seed(runs, statistic),
                       histories=per_seed_curves(histories), curves=curves(histories, list(cfg.variants)),
                       modes=modes, small=small, large=large,
                       env=stage_environment(device, records),
                       checkpoints={k: r.path / "model.pt" for k, r in by.items()})


def variant_modes(runs: dict[int, dict], variants: list[str], statistic: str) -> dict[str, Modes]:
    """Each variant's seeds tested for two modes on `statistic`, at ALPHA family-wise over the
    variants (Bonferroni)."""
    missing = [v for v in variants if any(statistic not in runs[s][v] for s in runs)]
    if missing:
        known = sorted(k for k in next(iter(runs.values()))[missing[0]] if k.startswith(("entropy_step", "loss")))
        raise UserError(f"seeds.mode_statistic: {statistic!r} is not a metric of {missing[0]} (it has e.g. "
                        f"{', '.join(known[:6])})")
    return {v: find_modes({s: runs[s][v][statistic] for s in runs}, ALPHA / len(variants), log_scale(statistic),
                          statistic) for v in variants}


def modes_of(key: str, modes: dict[str, Modes], pairs: dict[int, dict[bool, str]]) -> list[list]:
    """The seeds of each mode a metric's runs fall into: its variant's modes; for a gap, those its
    two variants' modes make together."""
    variant, _, rest = key.partition(".")
    if variant in modes:
        return modes[variant].groups
    for d_head, pair in pairs.items():
        if key.startswith(f"comparison.gap_d{d_head}_") and set(pair) == {True, False}:
            scaled, unscaled = modes[pair[True]].groups, modes[pair[False]].groups
            return gap_groups(scaled, unscaled, sum(len(g) for g in scaled))
    return []


MODE_METRICS = ("loss_final", "val_loss_final", "entropy_final")


def modes_headline(runs: dict[int, dict], modes: dict[str, Modes]) -> dict:
    """Per variant: how many modes, the test's p, and per mode its share of the seeds (exact 95%
    interval) and the means of a few metrics (metrics/seeds.json)."""
    out = {}
    for v, m in modes.items():
        e = {"n_modes": len(m.groups), "gap_ratio": m.ratio, "p": m.p, "alpha": m.alpha}
        for i, f in enumerate(m.frequencies()):
            e[f"mode{i}"] = {"n": f["n"], "frac": f["frac"], "frac_ci95_lo": f["ci95_lo"], "frac_ci95_hi": f["ci95_hi"],
                             **{f"{k}_mean": sum(runs[s][v][k] for s in f["seeds"]) / f["n"]
                                for k in (*MODE_METRICS, m.statistic) if k in runs[f["seeds"][0]][v]}}
        out[v] = e
    return out


HEADLINE_METRICS = ("loss_final", "val_loss_final", "entropy_step222", "entropy_final", "jacobian_fro_final",
                    "trained_logit_std_l0")


def per_seed(runs: dict[int, dict], statistic: str) -> list[dict]:
    """One row per seed: each variant's headline metrics, its mode statistic and the gaps
    (plots/seeds/per_seed.csv)."""
    rows = []
    for s, r in runs.items():
        row = {"seed": s}
        for v, m in r.items():
            if v != "comparison":
                row.update({f"{v}.{k}": m[k] for k in dict.fromkeys((*HEADLINE_METRICS, statistic)) if k in m})
        row.update({k: x for k, x in r["comparison"].items() if not k.startswith("gap_ratio")})
        rows.append(row)
    return rows


def per_seed_curves(histories: dict[tuple[str, int], list[dict]]) -> list[dict]:
    """Each run's training loss per step, long form: variant, seed, step, loss (plots/seeds/runs.csv)."""
    return [{"variant": v, "seed": s, "step": r["step"], "loss": r["loss"]}
            for (v, s), rows in histories.items() for i, r in enumerate(rows)
            if i % CURVE_STRIDE == 0 or i == len(rows) - 1]


CURVE_STRIDE = 5  # every 5th step: thin lines need no more, and the CSV stays small

# ---------------------------------------------------------------- its part of the report

LABEL = {True: "scaled (÷√d)", False: "unscaled"}


def _colour(variant: str, scaled: bool) -> str:
    """The variant's own colour, else scaled attention's or unscaled's (figures.SERIES_COLOURS)."""
    return figures.named_colour(variant) or figures.SERIES_COLOURS["scaled" if scaled else "unscaled"]


def moving_average(xs: list[float], window: int) -> list[float]:
    out, acc, q = [], 0.0, []
    for x in xs:
        q.append(x)
        acc += x
        if len(q) > window:
            acc -= q.pop(0)
        out.append(acc / len(q))
    return out


def _report_figures():
    """attnrepro.figures (its saver: one dpi, no metadata), at the report's font size (set when a
    figure is drawn)."""
    figures.plt.rcParams.update({"font.size": 9})
    return figures


def loss_figure(series: dict[str, dict], pairs, smooth: int) -> bytes | None:
    """Fig 1.2: training loss, one panel per d_head, scaled vs unscaled."""
    pairs = [(d, p) for d, p in pairs if any(v in series for v in p.values())]
    if not pairs:
        return None
    fg = _report_figures()
    plt = fg.plt
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 3.6), sharey=True, squeeze=False)
    for ax, (d_head, pair) in zip(axes[0], pairs):
        for scaled in (False, True):
            name = pair.get(scaled)
            if name not in series:
                continue
            s, color = series[name], _colour(name, scaled)
            ax.plot(s["step"], s["loss"], color=color, alpha=0.2, lw=0.6)
            ax.plot(s["step"], moving_average(s["loss"], smooth), color=color, lw=1.5,
                    label=f"{LABEL[scaled]} ({name})")
        ax.set_title(f"d_head = {d_head}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel(f"training loss (moving average of {smooth} steps)")
    fig.suptitle("Training loss with and without 1/√d_k (chapter Fig 1.2)")
    return fg.save(fig)


def diagnostics_figure(series: dict[str, dict], pairs) -> bytes | None:
    """Fig 1.4: layer-0 attention entropy and ||J||_F over training, all variants."""
    names = [(d, scaled, p[scaled]) for d, p in pairs for scaled in (False, True) if p.get(scaled) in series]
    if not names:
        return None
    fg = _report_figures()
    plt = fg.plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for col, (key, title) in enumerate([("entropy_l0", "normalized attention entropy (layer 0)"),
                                        ("jacobian_fro_l0", "softmax Jacobian ||J||_F (layer 0)")]):
        ax = axes[col]
        for d_head, scaled, name in names:
            s = series[name]
            pts = [(x, y) for x, y in zip(s["step"], s.get(key, [])) if not math.isnan(y) and y > 0]
            if not pts:
                continue
            color = _colour(name, scaled)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color,
                    ls="-" if d_head == pairs[-1][0] else "--", lw=1.3, label=f"d_head {d_head} {LABEL[scaled]}")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("Attention saturation over training (chapter Fig 1.4)")
    return fg.save(fig)


def ratio_interval(dist: dict) -> tuple[float, float]:
    """Fieller's 95% interval of the ratio of the mean loss gaps (d_head 256 over 32) from the seed
    distribution's per-seed comparison (metrics/dist/train.json)."""
    gaps = [run["comparison"] for run in dist["runs"].values()]
    return fieller_ratio([g["gap_d256_loss_final"] for g in gaps], [g["gap_d32_loss_final"] for g in gaps])


def headline_markdown(seeds: dict, dist: dict, exp) -> str:
    """This repository's measured gaps with their seed intervals, next to the chapter's (where its figure
    sits among our seeds: its percentile), and the ratio of the mean gaps with Fieller's interval."""
    if not seeds:
        return ""
    pub = {c.id.rsplit(".", 1)[-1]: c.published for c in exp.claims
           if c.id.startswith(("train.gaps.", "train.gap_ratio."))}
    runs = dist.get("runs", {})
    lines = [f"over {seeds.get('n_seeds')} paired seeds (mean [95% interval of the mean]; the chapter's figure and its "
             "percentile among our seeds):\n"]
    for key, label in (("gap_d32_loss_final", "loss gap at d_head 32"), ("gap_d256_loss_final", "loss gap at d_head 256")):
        s = seeds.get(key)
        if not s:
            continue
        ours = [r["comparison"][key] for r in runs.values() if key in r.get("comparison", {})]
        where = ""
        if key in pub and ours:
            where = f" (chapter {fmt_number(pub[key])}: percentile {percentile_of(ours, pub[key]):.0f})"
        zero = "; **the interval includes 0**" if s["ci95_lo"] <= 0 <= s["ci95_hi"] else ""
        lines.append(f"- {label}: **{fmt_number(round(s['mean'], 3))}** [{fmt_number(round(s['ci95_lo'], 3))}, "
                     f"{fmt_number(round(s['ci95_hi'], 3))}] nats{zero}{where}")
    r = seeds.get("gap_ratio_of_means_loss_final")
    if r:
        p = pub.get("gap_ratio_of_means_loss_final")
        iv = f"Fieller's 95% interval {fieller_text(dist)}"
        per_seed = [x["comparison"]["gap_ratio_loss_final"] for x in runs.values()
                    if math.isfinite(x.get("comparison", {}).get("gap_ratio_loss_final", math.nan))]
        spread = (f"; one seed's own ratio runs from {min(per_seed):.1f}× to {max(per_seed):.0f}×" if per_seed else "")
        lines.append(f"- ratio of the mean gaps: **{r['value']:.2f}×** (chapter {'—' if p is None else fmt_number(p)}"
                     f"×), {iv}{spread}. Ill-conditioned (its denominator is a small, noisy gap): the two gaps are "
                     "the result, the ratio a summary of them")
    return "\n".join(lines) + "\n"


def fieller_text(dist: dict) -> str:
    lo, hi = ratio_interval(dist)
    return f"[{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else "unbounded"


def modes_markdown(seeds: dict) -> str:
    """Each variant's seeds tested for two modes, with the test's simulated power beside the answer."""
    modes = seeds.get("modes", {})
    if not modes:
        return ""
    lines = ["Modes: each variant's seeds tested for two modes on the layer-0 entropy at step 222 (the largest "
             "gap between sorted values against one normal sample, family-wise alpha 0.05 over the variants; "
             "`stats.find_modes`):\n"]
    rows = []
    for v, m in modes.items():
        ms = [m[k] for k in sorted(m) if k.startswith("mode")]
        share = "; ".join(f"{x['n']}: {100 * x['frac']:.0f}% [{100 * x['frac_ci95_lo']:.0f}, "
                          f"{100 * x['frac_ci95_hi']:.0f}]" for x in ms)
        loss = "; ".join(f"{x['loss_final_mean']:.3f}" for x in ms)
        rows.append([v, m["n_modes"], f"{m['p']:.2g}", share, loss])
    lines += md_table(["variant", "modes", "p", "share of seeds per mode [exact 95%]", "final loss per mode"], rows)
    alpha = next(iter(modes.values())).get("alpha", ALPHA)
    if all(m["n_modes"] == 1 for m in modes.values()):
        power = ", ".join(f"{100 * modes_power(seeds.get('n_seeds'), 0.2, d, alpha):.0f}% at {d} sd" for d in (4, 6, 8))
        lines.append(f"\nNo evidence of a second mode, which is weaker than one mode: with {seeds.get('n_seeds')} seeds "
                     f"at alpha {alpha:.3g}, a minority mode holding 20% of the seeds is found {power} of within-mode "
                     "separation (stats.modes_power, simulated). The statistic was named after the first five "
                     "seeds showed one d256_scaled seed apart on it; the later five were not used to choose it.")
    return "\n".join(lines) + "\n"


def answer(metrics, all_metrics, dists) -> str:
    s = all_metrics.get("seeds", {})
    out = []
    g32, g256, ratio = s.get("gap_d32_loss_final"), s.get("gap_d256_loss_final"), s.get("gap_ratio_of_means_loss_final")
    if g32 and g256:
        zero = "includes" if g32["ci95_lo"] <= 0 <= g32["ci95_hi"] else "excludes"
        out.append(f"Over {s.get('n_seeds')} paired seeds removing 1/√d_k costs d_head 256 {g256['mean']:.3f} nat "
                   f"[{g256['ci95_lo']:.3f}, {g256['ci95_hi']:.3f}] of final training loss and d_head 32 "
                   f"{g32['mean']:.3f} [{g32['ci95_lo']:.3f}, {g32['ci95_hi']:.3f}] (its interval {zero} 0)"
                   + (f"; the large model's gap is {ratio['value']:.2f}× the small one's (Fieller's interval "
                      f"{fieller_text(dists.get('train') or {})})." if ratio else "."))
    v32, v256 = s.get("gap_d32_val_loss_final"), s.get("gap_d256_val_loss_final")
    if v32 and v256:
        out.append(f"On the validation loss the gaps are {v256['mean']:.3f} [{v256['ci95_lo']:.3f}, "
                   f"{v256['ci95_hi']:.3f}] at d_head 256 and {v32['mean']:.3f} [{v32['ci95_lo']:.3f}, "
                   f"{v32['ci95_hi']:.3f}] at d_head 32.")
    u = metrics.get("d256_unscaled", {}) if metrics else {}
    sc = metrics.get("d256_scaled", {}) if metrics else {}
    if "entropy_step222" in u and "entropy_final" in u:
        out.append(f"In this run the unscaled d_head-256 attention has collapsed by step 222 (layer-0 entropy "
                   f"{u['entropy_step222']:.2g}, {u['entropy_final']:.2g} at the end"
                   + (f", against {sc['entropy_final']:.2f} with the scaling" if "entropy_final" in sc else "") + ")"
                   + (f" and its logits grew to a std of {u['logit_std_final']:.4g}" if "logit_std_final" in u else "")
                   + ": the attention saturates and stops learning, as the chapter says.")
    return " ".join(out)
