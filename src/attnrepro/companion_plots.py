"""Figures of the companion experiments (reversal, charlm): loss curves and attention grids.

Chinese tick labels need a CJK font. `cjk_font()` asks fontconfig for one; without
it (as on a bare CI image) the heatmaps label positions by index instead.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402

from .io import atomic_path  # noqa: E402

_PREFERRED = ("NotoSansCJK-Regular", "NotoSansCJK", "SourceHanSans", "wqy", "DroidSansFallback")


def cjk_font() -> Optional[FontProperties]:
    """A font that can draw Chinese characters, or None when the machine has none."""
    if shutil.which("fc-list") is None:
        return None
    try:
        out = subprocess.run(["fc-list", ":lang=zh", "file"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    files = sorted(line.split(":")[0].strip() for line in out.splitlines() if line.strip())
    files = [f for f in files if Path(f).suffix.lower() in (".ttf", ".otf", ".ttc")]
    if not files:
        return None
    ranked = sorted(files, key=lambda f: next((i for i, p in enumerate(_PREFERRED) if p in f),
                                              len(_PREFERRED)))
    return FontProperties(fname=ranked[0])


def save(fig, path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def loss_curves(path, series: dict[str, list[dict]], title: str, keys=("train_loss", "val_loss"),
                logy: bool = True) -> None:
    """One line per (variant, key); rows carry `step` and the keys."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (name, rows) in enumerate(series.items()):
        for key, style in zip(keys, ("-", "--")):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{i}", marker=".",
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
    tick_font = font.copy() if font is not None else FontProperties()
    tick_font.set_size(6)
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
