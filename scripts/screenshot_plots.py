"""Render the `dvc plots show` page in headless Chromium: screenshot it and check that it drew.

    python scripts/screenshot_plots.py                      # dvc plots show --out <tmp>, then docs/plots_page.png
    python scripts/screenshot_plots.py --page dvc_plots/index.html --out /tmp/page.png

Prints the page's size (index.html, and with the images under static/), how many of its Vega
plots drew a canvas, and where the screenshot went. Exits 1 when a plot did not draw or the page
is over --max-mb; 2 when Chromium or dvc is missing. tests/test_dvc_views.py uses `render`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MAX_MB = 3.0


def find_chromium() -> str | None:
    for name in CHROMIUM:
        path = shutil.which(name)
        if path:
            return path
    return None


def plots_show(repo: Path, out: Path) -> Path:
    """`dvc plots show --out out` in `repo`; the page's path."""
    dvc = Path(sys.executable).parent / "dvc"
    cmd = [str(dvc) if dvc.exists() else "dvc", "plots", "show", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, DVC_NO_ANALYTICS="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"dvc plots show failed: {proc.stderr.strip()[-2000:]}")
    return out / "index.html"


@dataclass
class Rendered:
    page: Path
    html_bytes: int  # index.html
    total_bytes: int  # index.html and the images it links (static/)
    vega_plots: int  # vegaEmbed calls in the page
    drawn: int  # of them, those that drew a canvas (or svg)
    errors: list[str]  # Vega/Vega-Lite error text found in the rendered DOM

    @property
    def ok(self) -> bool:
        return self.drawn == self.vega_plots and not self.errors


def _chromium(chromium: str, page: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
               "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=20000", *args,
               page.resolve().as_uri()]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def render(page: Path, chromium: str, screenshot: Path | None = None, width: int = 1800,
           height: int = 3200) -> Rendered:
    """Load `page` in headless Chromium; count the Vega plots that drew; optionally screenshot it."""
    html = page.read_text(encoding="utf-8")
    ids = re.findall(r"vegaEmbed\('#([^']+)'", html)
    dom = _chromium(chromium, page, "--dump-dom").stdout
    starts = sorted((m.start(), m.group(1)) for m in re.finditer(r'<div[^>]*\bid="([^"]+)"', dom) if m.group(1) in ids)
    drawn = 0
    for i, (pos, _) in enumerate(starts):  # a plot's part of the DOM: up to the next plot's div
        end = starts[i + 1][0] if i + 1 < len(starts) else len(dom)
        if re.search(r"<canvas|<svg", dom[pos:end]):
            drawn += 1
    errors = re.findall(r"(?:Error|error):[^<]{0,200}", dom.split("</script>")[-1]) if dom else ["no DOM"]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        tmp = screenshot.with_suffix(".tmp.png")
        proc = _chromium(chromium, page, f"--screenshot={tmp}", f"--window-size={width},{height}")
        if not tmp.is_file():
            raise RuntimeError(f"chromium wrote no screenshot: {proc.stderr.strip()[-1000:]}")
        tmp.replace(screenshot)
    static = page.parent / "static"
    total = page.stat().st_size + sum(f.stat().st_size for f in static.rglob("*") if f.is_file())
    return Rendered(page, page.stat().st_size, total, len(ids), drawn, errors)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--page", type=Path, help="an existing page (default: run dvc plots show into a temp folder)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "plots_page.png", help="the screenshot")
    ap.add_argument("--width", type=int, default=1800)
    ap.add_argument("--height", type=int, default=3200)
    ap.add_argument("--max-mb", type=float, default=MAX_MB, help="fail when index.html is larger (MB)")
    args = ap.parse_args()
    chromium = find_chromium()
    if chromium is None:
        print("error: no Chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            page = args.page or plots_show(REPO, Path(tmp) / "plots")
        except (RuntimeError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        r = render(page, chromium, args.out, args.width, args.height)
    mb = r.html_bytes / 1e6
    print(f"page: index.html {mb:.2f} MB ({r.total_bytes / 1e6:.2f} MB with the images under static/)")
    print(f"vega plots drawn: {r.drawn} of {r.vega_plots}" + (f"; errors: {r.errors[:3]}" if r.errors else ""))
    print(f"screenshot: {args.out}")
    if not r.ok or mb > args.max_mb:
        print(f"error: {'a plot did not draw' if not r.ok else f'page over {args.max_mb} MB'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
