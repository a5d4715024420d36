"""Figures of the timing stages (kv_cache, latency): matplotlib with the Agg backend."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .io import atomic_path  # noqa: E402


def _save(fig, path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def kv_latency_figure(rows: list[dict], path: str | Path, title: str) -> None:
    """Per-token latency vs context length, with and without the KV cache."""
    ctx = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ctx, [r["uncached_ms"] for r in rows], "o-", label="no cache (re-run the prefix)")
    ax.plot(ctx, [r["cached_ms"] for r in rows], "s-", label="KV cache (one new token)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("time per generated token (ms, median)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    _save(fig, path)


def latency_figure(rows: list[dict], path: str | Path, title: str) -> None:
    """Median latency (p20-p80 band) vs n per implementation/dtype, log-log, with an n^2 guide."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: dict[str, list[dict]] = {}
    for r in rows:
        if not r.get("oom"):
            series.setdefault(f"{r['impl']} {r['dtype']}", []).append(r)
    for label, pts in series.items():
        n = [p["n"] for p in pts]
        ax.plot(n, [p["median_ms"] for p in pts], "o-", label=label)
        ax.fill_between(n, [p["p20_ms"] for p in pts], [p["p80_ms"] for p in pts], alpha=0.2)
    if series:
        first = next(iter(series.values()))
        n0, t0 = first[0]["n"], first[0]["median_ms"]
        ns = [p["n"] for p in first]
        ax.plot(ns, [t0 * (n / n0) ** 2 for n in ns], "k:", label="~ n^2 from the first point")
    for r in rows:
        if r.get("oom"):
            ax.axvline(r["n"], color="red", ls="--", alpha=0.5)
            ax.text(r["n"], ax.get_ylim()[1], f" OOM {r['impl']} {r['dtype']}", color="red", fontsize=7,
                    rotation=90, va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("forward time (ms, median; band p20-p80)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
