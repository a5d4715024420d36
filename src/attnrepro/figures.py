"""Figures (matplotlib, Agg backend): one saver, one CJK font finder, every stage's figures.

Chinese tick labels need a CJK font. `cjk_font()` looks for one among the fonts matplotlib
knows (on Linux these come from fontconfig); without one (a bare CI image) the heatmaps
label positions by token id or index instead.
"""

from __future__ import annotations

import io
import itertools
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional, Sequence

import matplotlib
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.font_manager import FontProperties, fontManager  # noqa: E402

from attnrepro.staging import atomic_path  # noqa: E402

matplotlib.use("Agg")


DPI = 120
PNG_METADATA = {"Software": None}  # no matplotlib version in the file: the same figure, the same bytes


def save(fig, path=None) -> Optional[bytes]:
    """Render `fig` as a PNG (DPI dots per inch, no metadata) and free it. With a path, the
    file is written atomically (with the stage's other outputs); without, the bytes are returned."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata=PNG_METADATA)
    plt.close(fig)
    if path is None:
        return buf.getvalue()
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(buf.getvalue())
    return None


CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP", "Noto Serif CJK SC",
                "Noto Serif CJK TC", "Source Han Sans SC", "Source Han Sans CN", "WenQuanYi Zen Hei",
                "WenQuanYi Micro Hei", "Droid Sans Fallback", "SimHei", "Microsoft YaHei", "PingFang SC",
                "Heiti SC", "AR PL UMing CN")


def find_cjk_family(installed: Iterable[str]) -> Optional[str]:
    """The preferred CJK family among `installed` family names, else any family named *CJK*."""
    names = set(installed)
    for fam in CJK_FAMILIES:
        if fam in names:
            return fam
    return next((n for n in sorted(names) if "CJK" in n), None)


@lru_cache(maxsize=1)
def cjk_font() -> Optional[FontProperties]:
    """A font that can draw Chinese characters, or None when the machine has none."""
    family = find_cjk_family(f.name for f in fontManager.ttflist)
    return FontProperties(family=family) if family else None


# One colour per series, for every PNG here and every DVC plot template (scripts/plot_colours.py writes
# them into .dvc/plots/): scaled attention blue and unscaled red, d_head 32 in the lighter tone of each.
# A series name takes the entry it equals or starts with ("unscaled_entropy_final_mean" is unscaled);
# other series take matplotlib's and Vega's shared cycle (tab10) in order, skipping colours taken.
SERIES_COLOURS = {
    "scaled": "#1f77b4", "unscaled": "#d62728",
    "d256_scaled": "#1f77b4", "d256_unscaled": "#d62728", "d32_scaled": "#17becf", "d32_unscaled": "#ff7f0e",
    "correct": "#000000",  # the failures table's reference model
}
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf")


def named_colour(name: str) -> Optional[str]:
    """The SERIES_COLOURS entry of series `name`: the one it equals, else the longest it starts with
    (followed by "_" or " "); None when it has none."""
    keys = [k for k in SERIES_COLOURS if name == k or name.startswith((k + "_", k + " "))]
    return SERIES_COLOURS[max(keys, key=len)] if keys else None


def series_colours(names: Iterable[str]) -> dict[str, str]:
    """The colour of each series of one figure: its named colour, or the next tab10 colour no named
    series of the figure takes (so a figure of unnamed series draws C0, C1, ... as matplotlib would)."""
    names = list(dict.fromkeys(names))
    named = {n: named_colour(n) for n in names}
    free = itertools.cycle([c for c in TAB10 if c not in set(named.values())])
    return {n: named[n] or next(free) for n in names}


def sized(font: Optional[FontProperties], size: float) -> FontProperties:
    """A copy of `font` (or the default font) at `size` points."""
    fp = font.copy() if font is not None else FontProperties()
    fp.set_size(size)
    return fp


# ---------------------------------------------------------------- seeds

def seed_bands_figure(rows: list[dict], variants: Sequence[str], path, n_seeds: int) -> None:
    """Training loss and layer-0 entropy per variant: the mean over seeds and their min-max band."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in rows]
    colour = series_colours(variants)
    for ax, key, title, ylabel in ((axes[0], "loss", "training loss", "training loss (nats)"),
                                   (axes[1], "entropy_l0", "layer-0 entropy", "layer-0 attention entropy (normalized)")):
        for v in variants:
            mean = [r.get(f"{v}_{key}_mean") for r in rows]
            pts = [(s, m, r[f"{v}_{key}_min"], r[f"{v}_{key}_max"]) for s, m, r in zip(steps, mean, rows)
                   if m is not None]
            if not pts:
                continue
            xs, ms, lo, hi = zip(*pts)
            ax.plot(xs, ms, color=colour[v], lw=1, label=v)
            ax.fill_between(xs, lo, hi, color=colour[v], alpha=0.25, lw=0)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: mean and range over {n_seeds} seeds", fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    save(fig, path)


def seed_gaps_figure(rows: list[dict], small: int, large: int, path) -> None:
    """Per seed: the loss gap (unscaled - scaled) at both d_head, and their ratio."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    seeds = [str(r["seed"]) for r in rows]
    x = range(len(rows))
    keys = [f"gap_d{small}_loss_final", f"gap_d{large}_loss_final", "gap_ratio_loss_final"]
    colour = series_colours(keys)
    for key, marker, d in zip(keys, "os", (small, large)):
        a.plot(x, [r[key] for r in rows], marker, color=colour[key], label=f"d_head {d}")
    a.axhline(0, color="k", lw=0.5)
    a.set_ylabel("final loss gap (unscaled - scaled)")
    b.plot(x, [r[keys[2]] for r in rows], "D", color=colour[keys[2]])
    b.set_ylabel(f"gap ratio d{large} / d{small}")
    for ax in (a, b):
        ax.set_xticks(list(x), seeds, rotation=30, fontsize=8)
        ax.set_xlabel("seed")
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    save(fig, path)


def seed_points_figure(rows: list[dict], variants: Sequence[str], groups: dict, path, statistic: str) -> None:
    """Every seed's value of the headline metrics, per variant (a mode shows at a glance); seeds of a
    variant's second mode (groups: variant -> its modes' seeds, stats.find_modes on `statistic`) drawn
    as open squares."""
    keys = [("loss_final", "final training loss", False), ("val_loss_final", "final validation loss", False),
            (statistic, statistic.replace("_", " "), True), ("entropy_final", "final layer-0 entropy", True)]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.8))
    colour = series_colours(variants)
    for ax, (key, title, log) in zip(axes, keys):
        log = log and all(r[f"{v}.{key}"] > 0 for r in rows for v in variants if f"{v}.{key}" in r)
        for i, v in enumerate(variants):
            for g, marker in zip(groups.get(v, [[r["seed"] for r in rows]]), ("o", "s")):
                ys = [r[f"{v}.{key}"] for r in rows if r["seed"] in g and f"{v}.{key}" in r]
                xs = [i + 0.08 * (j - (len(ys) - 1) / 2) for j in range(len(ys))]  # spread, so ties show
                ax.plot(xs, ys, marker, color=colour[v], ms=5, mfc="none" if marker == "s" else colour[v], alpha=0.8)
        ax.set_xticks(range(len(variants)), variants, rotation=30, fontsize=8)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    fig.suptitle(f"each seed ({len(rows)}); open squares: a variant's second mode", fontsize=10)
    save(fig, path)


def seed_runs_figure(rows: list[dict], variants: Sequence[str], path) -> None:
    """Every run's training loss curve, thin lines coloured by variant (plots/seeds/runs.csv)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    runs: dict[tuple, list] = {}
    for r in rows:
        runs.setdefault((r["variant"], r["seed"]), []).append((r["step"], r["loss"]))
    colour = series_colours(variants)
    for (v, _), pts in runs.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, color=colour[v], lw=0.6, alpha=0.6)
    for v in variants:
        ax.plot([], [], color=colour[v], label=v)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"training loss of every run ({len(runs)} runs: each variant at each seed)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, path)


# ---------------------------------------------------------------- critical d_head

def _curve_panels(a, b, c, rows: list[dict], x: str, onset: dict, title: str) -> None:
    """One curve against grid variable x (mean and range over seeds): the gap (a), each arm's final loss (b),
    the final attention entropies (c: layer 0 solid, layer 1 dashed where measured)."""
    d = [r[x] for r in rows]
    a.plot(d, [r["gap_loss_final_mean"] for r in rows], "o-", color="C3", label="gap, mean over seeds")
    a.fill_between(d, [r["gap_loss_final_min"] for r in rows], [r["gap_loss_final_max"] for r in rows],
                   color="C3", alpha=0.2, lw=0, label="range over seeds")
    if onset.get("reached"):
        a.axvspan(onset[f"after_{x}"], onset[f"by_{x}"], color="k", alpha=0.08, lw=0,
                  label=f"paired onset (Holm): {x} in ({onset[f'after_{x}']:.0f}, {onset[f'by_{x}']:.0f}]")
    a.set_ylabel("final loss gap (unscaled - scaled)")
    a.set_title(title, fontsize=9)
    for arm in ("unscaled", "scaled"):
        color = SERIES_COLOURS[arm]
        b.plot(d, [r[f"{arm}_loss_final_mean"] for r in rows], "o-", color=color, label=arm)
        b.fill_between(d, [r[f"{arm}_loss_final_min"] for r in rows], [r[f"{arm}_loss_final_max"] for r in rows],
                       color=color, alpha=0.2, lw=0)
        for key, style, layer in ((f"{arm}_entropy_final", "o-", "layer 0"), (f"{arm}_entropy_final_l1", "s--",
                                                                              "layer 1")):
            if f"{key}_mean" in rows[0]:
                c.plot(d, [r[f"{key}_mean"] for r in rows], style, color=color, label=f"{arm}, {layer}")
                c.fill_between(d, [r[f"{key}_min"] for r in rows], [r[f"{key}_max"] for r in rows], color=color,
                               alpha=0.12, lw=0)
    b.set_ylabel("final training loss, each arm")
    c.set_yscale("log")
    c.set_ylabel("final attention entropy")
    for ax in (a, b, c):
        ax.set_xscale("log", base=2)
        ax.set_xticks(d, [str(v) for v in d])
        ax.set_xlabel(x)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)


def critical_figure(qk_rows: list[dict], qk_onset: dict, qk_title: str, rows: list[dict], onset: dict, path,
                    n_seeds: int, widths: list[int]) -> None:
    """Top: the one-variable curve (gap, each arm's loss and the entropies against d_qk, one model); bottom: the
    mixed-width curve (against d_head, d_model and n_head moving with it), labelled as such."""
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    _curve_panels(*axes[0], qk_rows, "d_qk", qk_onset, qk_title)
    _curve_panels(*axes[1], rows, "d_head", onset,
                  f"MIXED WIDTH, not one variable ({n_seeds} seeds): d_model ({', '.join(map(str, widths))}) "
                  "and n_head move with d_head")
    fig.tight_layout()
    save(fig, path)


def gap_vs_logit_std_figure(designs: dict[str, tuple[str, list[dict]]], references: list[dict], path) -> None:
    """The loss gap of every seed's pair against the unscaled model's measured logit std at init (the
    chapter's own explanation of when attention breaks: a logit scale that saturates the softmax), for
    each design (designs: label -> (grid column, per-seed rows)): its seeds faint, its per-point means joined.
    The chapter's models (references: per seed, with `model`, `d_head`, `d_model`, `n_head`) as separate
    reference points: each model's seeds and their mean, starred."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    colour = series_colours(designs)
    for i, (label, (x, rows)) in enumerate(designs.items()):
        grid = sorted({r[x] for r in rows})
        means = []
        for d in grid:
            pts = [(r["unscaled_logit_std_step0"], r["gap_loss_final"]) for r in rows if r[x] == d]
            ax.plot(*zip(*pts), "os"[i % 2], color=colour[label], alpha=0.35, ms=4)
            means.append((sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts), d))
        ax.plot([m[0] for m in means], [m[1] for m in means], "os"[i % 2] + "-", color=colour[label], label=label)
        for sx, sy, d in means:
            ax.annotate(str(d), (sx, sy), textcoords="offset points", xytext=(4, 4 if i == 0 else -10),
                        fontsize=7, color=colour[label])
    for j, model in enumerate(sorted({r["model"] for r in references})):
        rs = [r for r in references if r["model"] == model]
        xs, ys = [r["unscaled_logit_std_step0"] for r in rs], [r["gap_loss_final"] for r in rs]
        ax.plot(xs, ys, "*", color="k", alpha=0.35, ms=7)
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        ax.plot([mx], [my], "*", color="k", ms=16, mfc="gold" if j else "white", mec="k",
                label=f"the chapter's {model} model (d_model {rs[0]['d_model']}, {rs[0]['n_head']} head"
                      f"{'s' * (rs[0]['n_head'] > 1)}, d_head {rs[0]['d_head']}; {len(rs)} seeds)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("unscaled model: attention logit std at init (layer 0)")
    ax.set_ylabel("final loss gap (unscaled - scaled)")
    ax.set_title("the gap against the logit scale at init, both designs (faint: seeds; numbers: the grid)",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    save(fig, path)


# ---------------------------------------------------------------- QK-norm

def qknorm_figure(rows: list[dict], forms: Sequence[str], path, n_seeds: int) -> None:
    """Training loss and layer-0 entropy of each QK-norm form and reference (mean over seeds)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    colour = series_colours(forms)
    for f in forms:
        for ax, key in ((a, "loss"), (b, "entropy_l0")):
            pts = [(r["step"], r[f"{f}_{key}"]) for r in rows if r.get(f"{f}_{key}") is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour[f], lw=1, label=f)
    a.set_ylabel("training loss")
    b.set_ylabel("layer-0 attention entropy")
    b.set_yscale("log")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    a.set_title(f"d_head 256 with QK-norm: training loss, mean over {n_seeds} seeds", fontsize=10)
    b.set_title(f"layer-0 attention entropy, mean over {n_seeds} seeds", fontsize=10)
    handles, labels = a.get_legend_handles_labels()  # one legend for both panels (same series, same colours)
    fig.legend(handles, labels, loc="upper center", ncol=min(3, len(labels)), fontsize=8, bbox_to_anchor=(0.5, 0.0))
    save(fig, path)


# ---------------------------------------------------------------- companions (reversal, charlm)

def loss_curves(path, series: dict[str, list[dict]], title: str, keys=("train_loss", "val_loss"),
                logy: bool = True) -> None:
    """One line per (variant, key); rows carry `step` and the keys."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colour = series_colours(series)
    for name, rows in series.items():
        for key, style in zip(keys, ("-", "--")):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colour[name], marker=".",
                    label=f"{name} {key}")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, path)


def attention_grid(path, maps, labels: Sequence[str], title: str, layer_names: Sequence[str],
                   font: Optional[FontProperties] = None, boxes: Sequence[tuple[int, int]] = ()) -> None:
    """Heatmaps of maps[layer][head] (T x T, query rows, key columns), colour range 0-1.

    `labels` are the tokens; when `font` is None and a label is not ASCII, positions
    are shown by index. `boxes` are (query, key) cells to outline.
    """
    n_layer, n_head = len(maps), len(maps[0])
    T = len(labels)
    ascii_ok = all(lbl.isascii() for lbl in labels)
    ticks = ([f"{i}:{lbl}" for i, lbl in enumerate(labels)] if (font is not None or ascii_ok)
             else [str(i) for i in range(T)])
    tick_font = sized(font, 6)
    fig, axes = plt.subplots(n_layer, n_head, figsize=(2.9 * n_head + 0.6, 2.9 * n_layer + 0.4),
                             squeeze=False)
    im = None
    for li in range(n_layer):
        for hi in range(n_head):
            ax = axes[li][hi]
            im = ax.imshow(maps[li][hi], vmin=0.0, vmax=1.0, cmap="viridis")
            for q, k in boxes:
                ax.add_patch(plt.Rectangle((k - 0.5, q - 0.5), 1, 1, fill=False, ec="red", lw=1))
            ax.set_title(f"{layer_names[li]} head {hi}", fontsize=9)
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(ticks, rotation=90, fontproperties=tick_font)
            ax.set_yticklabels(ticks, fontproperties=tick_font)
            if hi == 0:
                ax.set_ylabel("query", fontsize=8)
            if li == n_layer - 1:
                ax.set_xlabel("key", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6)
    fig.suptitle(title, fontproperties=font)
    save(fig, path)


# ---------------------------------------------------------------- probes (init_sweep, heads, failures)

def tick_labels(tokens: Sequence[int], itos: Optional[Sequence[str]]) -> tuple[list[str], Optional[FontProperties]]:
    """Characters when a CJK font exists (newline shown as \\n), otherwise token ids."""
    font = cjk_font()
    if itos is None or font is None:
        return [str(int(t)) for t in tokens], None
    labels = []
    for t in tokens:
        c = itos[int(t)]
        labels.append("\\n" if c == "\n" else ("□" if len(c) != 1 else c))
    return labels, font


def init_sweep_figure(rows: list[dict], path) -> None:
    """Log-log: measured unscaled logit std vs sqrt(d) and v*sqrt(d)."""
    d = [r["d_head"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    colour = series_colours(["logit_std", "theory_sqrt_d", "pred_varprop"])
    ax.loglog(d, [r["logit_std"] for r in rows], "o-", color=colour["logit_std"], label="measured (init)")
    ax.loglog(d, [r["theory_sqrt_d"] for r in rows], "s--", color=colour["theory_sqrt_d"], label=r"footnote $\sqrt{d}$")
    ax.loglog(d, [r["pred_varprop"] for r in rows], "^:", color=colour["pred_varprop"],
              label=r"variance propagation $v\sqrt{d}$, $v=d\sigma^2$")
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(d, [str(x) for x in d])
    ax.set_xlabel(r"$d_{head} = d_{model}$")
    ax.set_ylabel(r"std of unscaled $q\cdot k$")
    ax.set_title("q·k scale at initialization")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def heads_figure(weights, tokens, itos, layer: int, path) -> None:
    """One layer: rows = sequences, columns = heads; query rows, key columns, scale 0-1."""
    n_seq, n_head = weights.shape[0], weights.shape[1]
    t = weights.shape[-1]
    fig, axes = plt.subplots(n_seq, n_head, figsize=(3.2 * n_head + 1, 3.2 * n_seq), squeeze=False)
    im = None
    for s in range(n_seq):
        labels, font = tick_labels(tokens[s], itos)
        fp = sized(font, 6 if font is not None else 5)
        for h in range(n_head):
            ax = axes[s][h]
            im = ax.imshow(weights[s, h].numpy(), vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
            ax.set_xticks(range(t), labels, fontproperties=fp, rotation=90 if font is None else 0)
            ax.set_yticks(range(t), labels, fontproperties=fp)
            ax.tick_params(length=0, pad=1)
            if s == 0:
                ax.set_title(f"layer {layer} head {h}", fontsize=9)
            if h == 0:
                ax.set_ylabel(f"seq {s}: query", fontsize=8)
            if s == n_seq - 1:
                ax.set_xlabel("key", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
    save(fig, path)


def failures_figure(histories: dict[str, list[dict]], path) -> None:
    """Training loss and grad norm per variant. Variants that train identically (no_stable_softmax
    is the correct model until a logit overflows) would hide each other: every variant has its own
    colour, dash and marker, and the correct model is drawn last, on top, as a thick translucent
    line that the others show through (said in its legend entry)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    styles = [("--", "o"), (":", "s"), ("-.", "^"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 1)), "D")]
    names = [n for n in histories if n != "correct"] + (["correct"] if "correct" in histories else [])
    colour = series_colours(histories)
    for i, name in enumerate(names):
        hist = histories[name]
        steps = [r["step"] for r in hist]
        every = max(1, len(steps) // 8)
        if name == "correct":
            kw = dict(color=colour[name], lw=4, alpha=0.35, ls="-", zorder=5,
                      label="correct (thick, translucent, on top: lines under it match it)")
        else:
            ls, marker = styles[i % len(styles)]
            kw = dict(color=colour[name], lw=1.2, ls=ls, marker=marker, ms=3.5, markevery=(i % every, every),
                      zorder=3, label=name)
        a.plot(steps, [r["loss"] for r in hist], **kw)
        b.plot(steps, [r["grad_norm"] for r in hist], **kw)
    a.set_ylabel("train loss")
    b.set_ylabel("grad norm (before clipping)")
    b.set_yscale("log")
    log_ticks(b.yaxis)
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
    handles, labels = a.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(3, len(labels)), fontsize=8,
               bbox_to_anchor=(0.5, 0.0))
    save(fig, path)


def log_ticks(axis) -> None:
    """Readable ticks on a log axis whatever its span: 1-2-5 steps labelled in plain numbers
    (a span under a decade otherwise gets one label, or none)."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=15))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=tuple(range(1, 10)), numticks=15))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


# ---------------------------------------------------------------- timings (kv_cache, latency)

def _loglog_finish(ax, xlabel: str, ylabel: str, title: str, legend_size=None) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)


def kv_latency_figure(rows: list[dict], path, title: str) -> None:
    """Per-token latency vs context length, with and without the KV cache."""
    ctx = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    colour = series_colours(["uncached_ms", "cached_ms"])
    ax.plot(ctx, [r["uncached_ms"] for r in rows], "o-", color=colour["uncached_ms"], label="no cache (re-run the prefix)")
    ax.plot(ctx, [r["cached_ms"] for r in rows], "s-", color=colour["cached_ms"], label="KV cache (one new token)")
    _loglog_finish(ax, "context length (tokens)", "time per generated token (ms, median)", title)
    save(fig, path)


def latency_figure(rows: list[dict], path, title: str) -> None:
    """Median latency (p20-p80 band) vs n per implementation/dtype, log-log, with an n^2 guide."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: dict[str, list[dict]] = {}
    for r in rows:
        if not r.get("oom"):
            series.setdefault(f"{r['impl']} {r['dtype']}", []).append(r)
    colour = series_colours(series)
    for label, pts in series.items():
        n = [p["n"] for p in pts]
        ax.plot(n, [p["mean_ms"] for p in pts], "o-", color=colour[label], label=label)
        ax.fill_between(n, [p["p20_ms"] for p in pts], [p["p80_ms"] for p in pts], color=colour[label], alpha=0.2)
    if series:
        first = next(iter(series.values()))
        n0, t0 = first[0]["n"], first[0]["mean_ms"]
        ns = [p["n"] for p in first]
        ax.plot(ns, [t0 * (n / n0) ** 2 for n in ns], "k:", label="~ n^2 from the first point")
    for r in rows:
        if r.get("oom"):
            ax.axvline(r["n"], color="red", ls="--", alpha=0.5)
            ax.text(r["n"], ax.get_ylim()[1], f" OOM {r['impl']} {r['dtype']}", color="red", fontsize=7,
                    rotation=90, va="top")
    _loglog_finish(ax, "sequence length n", "forward time (ms, mean of the timed calls; band p20-p80)", title, legend_size=8)
    save(fig, path)
