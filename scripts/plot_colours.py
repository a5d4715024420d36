"""Write each series' colour (attnrepro.figures.SERIES_COLOURS, the PNGs' palette) into the DVC plot
templates (.dvc/plots/), so a series has one colour in every figure and on the `dvc plots` page.

    python scripts/plot_colours.py           # rewrite the templates' colour scales
    python scripts/plot_colours.py --check   # exit 1 if a template is out of date (tests/test_plots.py)

A template's colour field is the line name it computes (the file name when a plot reads several
files, the column when it reads several columns). For every plot of dvc.yaml, its lines get
`series_colours` of their names, as a figure drawing them in that order would; a template maps every
line of the plots that use it to its colour, and each plot's scale takes the colours of its lines. The
`series` template (a table's `series` column, unknown until the stage ran) keeps Vega's cycle in
the table's order: the same tab10 cycle the PNG draws them in.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from attnrepro.figures import series_colours

ROOT = Path(__file__).resolve().parents[1]


def line_names(y: dict) -> list[str]:
    """The line names a template computes for a plot's `y` ({file: column or [columns]}), in order."""
    pairs = [(Path(f).stem, c) for f, cols in y.items() for c in ([cols] if isinstance(cols, str) else cols)]
    files, fields = {f for f, _ in pairs}, {c for _, c in pairs}
    if len(files) > 1:
        return [f"{f} {c}" if len(fields) > 1 else f for f, c in pairs]
    return [c for _, c in pairs]


def scales(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """{template: {line: colour}} over dvc.yaml's plots (the `series` template left out)."""
    out: dict[str, dict[str, str]] = {}
    for entry in yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["plots"]:
        if isinstance(entry, str):
            continue  # an image
        (name, spec), = entry.items()
        template = spec.get("template", "linear")
        if template == "series":
            continue
        scale = out.setdefault(template, {})
        for line, colour in series_colours(line_names(spec["y"])).items():
            if scale.setdefault(line, colour) != colour:
                raise SystemExit(f"plot {name}: line {line!r} would be {colour} here and {scale[line]} in "
                                 f"another plot of template {template}: rename a line or give it a colour in "
                                 "figures.SERIES_COLOURS")
    return out


def coloured(template: dict, scale: dict[str, str]) -> dict:
    """`template` with a `colour` column computed from each row's line name (`scale`) and every colour
    encoding on `line` drawing it: Vega then builds each plot's scale from the lines it has, so its
    legend lists those lines only."""
    steps = [t for t in template["transform"] if t.get("as") != "colour"]
    at = next(i for i, t in enumerate(steps) if t.get("as") == "line") + 1
    steps.insert(at, {"calculate": f"({json.dumps(scale)})[datum.line]", "as": "colour"})
    template["transform"] = steps

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "groupby" and "line" in value and "colour" not in value:
                    value.append("colour")  # a loess keeps only its group columns: the colour is one of them
                elif key == "color" and isinstance(value, dict) and value.get("field") == "line":
                    value["scale"] = {"range": {"field": "colour"}}
                    value.pop("sort", None)  # Vega-Lite orders a field range by the domain's own sort
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
    walk(template)
    return template


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only say whether the templates are up to date")
    args = ap.parse_args()
    stale = []
    for template, scale in scales().items():
        path = ROOT / ".dvc" / "plots" / f"{template}.json"
        text = path.read_text(encoding="utf-8")
        new = json.dumps(coloured(json.loads(text), scale), indent=2, ensure_ascii=False) + "\n"
        if new != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/plot_colours.py)", file=sys.stderr)
        return 1
    print(f"{'out of date' if args.check else 'written'}: {', '.join(stale)}" if stale else "templates up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
