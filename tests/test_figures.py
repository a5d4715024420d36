"""The mended figures: series that train identically stay visible, log axes carry several labels,
every panel is explained by a legend and labelled on y."""

from __future__ import annotations

import math

import pytest

from attnrepro import figures


@pytest.fixture
def drawn(monkeypatch):
    """The figures the functions draw, kept open instead of saved."""
    figs = []
    monkeypatch.setattr(figures, "save", lambda fig, path=None: figs.append(fig))
    yield figs
    for f in figs:
        figures.plt.close(f)


def history(scale: float, wobble: float) -> list[dict]:
    return [{"step": s, "loss": 7 - 0.01 * s * scale, "grad_norm": 0.6 + wobble * math.sin(s / 5)} for s in range(60)]


def test_failures_figure_shows_the_correct_model_and_readable_grad_norms(drawn):
    same = history(1.0, 0.3)
    figures.failures_figure({"correct": same, "mask_zero": history(1.2, 0.5), "no_stable_softmax": list(same),
                             "dk_not_sqrt": history(0.9, 0.2)}, "unused.png")
    fig, = drawn
    loss, grad = fig.axes
    lines = {ln.get_label(): ln for ln in loss.get_lines()}
    correct = next(ln for label, ln in lines.items() if label.startswith("correct"))
    twin = lines["no_stable_softmax"]
    # the identical variant is drawn under a thicker, translucent correct line, and the legend says so
    assert correct.get_zorder() > twin.get_zorder() and correct.get_linewidth() > 2 * twin.get_linewidth()
    assert correct.get_alpha() < 1 and "on top" in correct.get_label()
    styles = [(ln.get_color(), str(ln.get_linestyle()), ln.get_marker()) for ln in lines.values()]
    assert len(set(styles)) == len(styles)  # no two series drawn alike
    assert fig.legends and {t.get_text() for t in fig.legends[0].get_texts()} == set(lines)
    # the grad-norm axis (log) labels several ticks inside its range
    fig.canvas.draw()
    lo, hi = grad.get_ylim()
    labels = [t.get_text() for t in grad.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert grad.get_yscale() == "log" and len(labels) >= 3, labels


def test_qknorm_figure_has_a_legend_for_both_panels(drawn):
    forms = ["d256_scaled", "d256_unscaled", "l2_gain_instead"]
    rows = [{"step": s, **{f"{f}_loss": 7 - 0.01 * s * (i + 1) for i, f in enumerate(forms)},
             **{f"{f}_entropy_l0": 0.9 / (1 + s * i) for i, f in enumerate(forms)}} for s in range(20)]
    figures.qknorm_figure(rows, forms, "unused.png", 3)
    fig, = drawn
    legend_texts = {t.get_text() for lg in fig.legends for t in lg.get_texts()}
    legend_texts |= {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert set(forms) <= legend_texts
    assert fig.legends or all(ax.get_legend() for ax in fig.axes)
    assert all(ax.get_ylabel() for ax in fig.axes)


def test_seed_bands_figure_labels_both_y_axes(drawn):
    variants = ["d32_scaled", "d256_unscaled"]
    rows = []
    for s in range(10):
        r = {"step": s}
        for v in variants:
            for key in ("loss", "entropy_l0"):
                r.update({f"{v}_{key}_mean": 1.0 + s, f"{v}_{key}_min": 0.5 + s, f"{v}_{key}_max": 1.5 + s})
        rows.append(r)
    figures.seed_bands_figure(rows, variants, "unused.png", 5)
    fig, = drawn
    assert all(ax.get_ylabel() for ax in fig.axes), [ax.get_ylabel() for ax in fig.axes]


def test_series_colours_name_the_variants_and_cycle_the_rest():
    colour = figures.series_colours(["d256_scaled", "unscaled_entropy_final_mean", "scaled_entropy_final_mean", "x", "y"])
    assert colour["d256_scaled"] == colour["scaled_entropy_final_mean"] == figures.SERIES_COLOURS["scaled"]
    assert colour["unscaled_entropy_final_mean"] == figures.SERIES_COLOURS["unscaled"]  # the longest entry wins
    assert (colour["x"], colour["y"]) == ("#ff7f0e", "#2ca02c")  # tab10 without the blue and red taken
    assert figures.named_colour("d32_scaledness") is None  # an entry is a whole word of the name
    # unnamed series alone draw in matplotlib's own cycle, the one Vega's category10 shares
    cycle = [figures.matplotlib.colors.to_hex(c) for c in figures.plt.rcParams["axes.prop_cycle"].by_key()["color"]]
    assert list(figures.series_colours(["a", "b", "c"]).values()) == cycle[:3] and list(figures.TAB10) == cycle


def test_a_variant_has_one_colour_in_every_figure(drawn):
    from attnrepro.experiments import comparison
    variants = ["d32_unscaled", "d32_scaled", "d256_unscaled", "d256_scaled"]
    rows = [{"step": s, **{f"{v}_{k}_{a}": 1.0 + s for v in variants for k in ("loss", "entropy_l0")
                           for a in ("mean", "min", "max")}} for s in range(3)]
    figures.seed_bands_figure(rows, variants, "unused.png", 3)
    figures.seed_runs_figure([{"variant": v, "seed": 1, "step": s, "loss": 2.0} for v in variants for s in range(3)],
                             variants, "unused.png")
    forms = ["d256_scaled", "d256_unscaled", "layernorm_instead"]
    figures.qknorm_figure([{"step": s, **{f"{f}_{k}": 1.0 for f in forms for k in ("loss", "entropy_l0")}}
                           for s in range(3)], forms, "unused.png", 3)
    series = {v: {"step": [0, 1, 2], "loss": [3.0, 2.0, 1.0], "entropy_l0": [0.5] * 3, "jacobian_fro_l0": [0.1] * 3}
              for v in variants}
    pairs = [(32, {False: "d32_unscaled", True: "d32_scaled"}), (256, {False: "d256_unscaled", True: "d256_scaled"})]
    comparison.loss_figure(series, pairs, 1)
    comparison.diagnostics_figure(series, pairs)
    seen: dict[str, set] = {}
    for fig in drawn:
        for ax in fig.axes:
            for line in ax.get_lines():
                label = line.get_label()
                name = next((v for v in variants if label == v or f"({v})" in label), None)
                if name is None and label.startswith("d_head "):  # diagnostics: "d_head 32 unscaled"
                    d, kind = label.split()[1:3]
                    name = f"d{d}_{'unscaled' if kind == 'unscaled' else 'scaled'}"
                if name:
                    seen.setdefault(name, set()).add(figures.matplotlib.colors.to_hex(line.get_color()))
    assert seen == {v: {figures.SERIES_COLOURS[v]} for v in variants}


def test_a_variant_without_its_own_colour_takes_its_arms(drawn):
    from attnrepro.experiments import comparison
    series = {v: {"step": [0, 1], "loss": [3.0, 2.0]} for v in ("d64_unscaled", "d64_scaled")}
    comparison.loss_figure(series, [(64, {False: "d64_unscaled", True: "d64_scaled"})], 1)
    fig, = drawn
    colours = {ln.get_label(): figures.matplotlib.colors.to_hex(ln.get_color()) for ln in fig.axes[0].get_lines()}
    assert colours["unscaled (d64_unscaled)"] == figures.SERIES_COLOURS["unscaled"]
    assert colours["scaled (÷√d) (d64_scaled)"] == figures.SERIES_COLOURS["scaled"]
