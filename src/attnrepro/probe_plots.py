"""Figures of the probe stages (init_sweep, heads, failures): matplotlib, Agg backend.

CJK labels need a font with Chinese glyphs; `cjk_font()` looks for one and the
heatmaps fall back to token ids when the machine has none (e.g. a bare CI box).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from .io import atomic_path  # noqa: E402

CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Serif CJK SC", "Noto Serif CJK TC",
                "Source Han Sans SC", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "SimHei",
                "Microsoft YaHei", "PingFang SC", "AR PL UMing CN")


@lru_cache(maxsize=1)
def cjk_font() -> Optional[str]:
    """Family name of an installed font with CJK glyphs, or None."""
    installed = {f.name for f in font_manager.fontManager.ttflist}
    for fam in CJK_FAMILIES:
        if fam in installed:
            return fam
    return None


def tick_labels(tokens: Sequence[int], itos: Optional[Sequence[str]]) -> tuple[list[str], Optional[str]]:
    """Characters when a CJK font exists (newline shown as \\n), otherwise token ids."""
    font = cjk_font()
    if itos is None or font is None:
        return [str(int(t)) for t in tokens], None
    labels = []
    for t in tokens:
        c = itos[int(t)]
        labels.append("\\n" if c == "\n" else ("□" if len(c) != 1 else c))
    return labels, font


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def init_sweep_figure(rows: list[dict], path: Path) -> None:
    """Log-log: measured unscaled logit std vs sqrt(d) and v*sqrt(d)."""
    d = [r["d_head"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.loglog(d, [r["logit_std"] for r in rows], "o-", color="tab:blue", label="measured (init)")
    ax.loglog(d, [r["theory_sqrt_d"] for r in rows], "s--", color="tab:red", label=r"footnote $\sqrt{d}$")
    ax.loglog(d, [r["pred_varprop"] for r in rows], "^:", color="tab:green",
              label=r"variance propagation $v\sqrt{d}$, $v=d\sigma^2$")
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(d, [str(x) for x in d])
    ax.set_xlabel(r"$d_{head} = d_{model}$")
    ax.set_ylabel(r"std of unscaled $q\cdot k$")
    ax.set_title("q·k scale at initialization")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def heads_figure(weights, tokens, itos, layer: int, path: Path) -> None:
    """One layer: rows = sequences, columns = heads; query rows, key columns, scale 0-1."""
    n_seq, n_head = weights.shape[0], weights.shape[1]
    t = weights.shape[-1]
    fig, axes = plt.subplots(n_seq, n_head, figsize=(3.2 * n_head + 1, 3.2 * n_seq), squeeze=False)
    im = None
    for s in range(n_seq):
        labels, font = tick_labels(tokens[s], itos)
        fp = font_manager.FontProperties(family=font, size=6) if font else font_manager.FontProperties(size=5)
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
    _save(fig, path)


def failures_figure(histories: dict[str, list[dict]], path: Path) -> None:
    """Training loss and grad norm per variant."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, hist in histories.items():
        steps = [r["step"] for r in hist]
        a.plot(steps, [r["loss"] for r in hist], label=name, lw=1)
        b.plot(steps, [r["grad_norm"] for r in hist], label=name, lw=1)
    a.set_xlabel("step"); a.set_ylabel("train loss"); a.legend(fontsize=8); a.grid(alpha=0.3)
    b.set_xlabel("step"); b.set_ylabel("grad norm (before clipping)"); b.set_yscale("log"); b.grid(alpha=0.3)
    b.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    _save(fig, path)
