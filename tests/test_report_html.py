"""REPORT.html: the same report as REPORT.md with every figure embedded, checked in headless Chromium."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnrepro.report.html import markdown_to_html

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_report import make_workspace, run_stage  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'<img src="([^"]*)" alt="([^"]*)">')


def chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def test_converter_renders_the_report_markup():
    md = ("# Title\n\nA `code | span` and **bold** <tag> & [a link](x.md).\n\n- one\n- two\n\n"
          "| a | b \\| c |\n| --- | --- |\n| `x \\| y` | 2 |\n\n![a figure](figures/f.png)\n\n```\nraw <b>\n```\n")
    page = markdown_to_html(md, lambda src: PNG + b"0" if src == "figures/f.png" else None)
    assert "<h1 id=\"title\">Title</h1>" in page
    assert "<code>code | span</code>" in page and "<strong>bold</strong>" in page and "&lt;tag&gt; &amp;" in page
    assert '<a href="x.md">a link</a>' in page and "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in page
    assert "<th>b | c</th>" in page and "<td><code>x | y</code></td>" in page
    assert "<pre><code>raw &lt;b&gt;</code></pre>" in page
    (src, alt), = IMG.findall(page)
    assert alt == "a figure" and base64.b64decode(src.split(",", 1)[1]) == PNG + b"0"
    assert markdown_to_html(md, lambda s: None) == markdown_to_html(md, lambda s: None)  # deterministic


def embedded_pngs(page: str) -> list[bytes]:
    out = []
    for src, alt in IMG.findall(page):
        assert src.startswith("data:image/png;base64,"), (alt, src[:80])
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(PNG), alt
        out.append(data)
    return out


def test_report_html_embeds_every_figure_of_the_markdown(tmp_path):
    root = make_workspace(tmp_path / "w")
    p = run_stage(root)
    assert p.returncode == 0, p.stderr
    md = (root / "report" / "REPORT.md").read_text(encoding="utf-8")
    page = (root / "report" / "REPORT.html").read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    pngs = embedded_pngs(page)
    assert len(pngs) == len(links) == 3  # the two drawn by the report and the fixture's stage PNG
    for link, data in zip(links, pngs):
        assert (root / "report" / link).read_bytes() == data  # the very file the markdown links
    headings = re.findall(r"^## (.*)$", md, flags=re.M)
    assert re.findall(r"<h2 id=\"[^\"]*\">(.*?)</h2>", page) == [h.replace("&", "&amp;") for h in headings]


CHECK = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).map(function (i) { return i.alt; });
  var pre = document.createElement("pre");
  pre.id = "imgcheck";
  pre.textContent = "IMAGES " + imgs.length + " LOADED " + (imgs.length - bad.length) + " BAD " + JSON.stringify(bad);
  document.body.appendChild(pre);
});
</script>"""


def loaded_in_chromium(page: Path, tmp: Path) -> tuple[int, int, str]:
    """Open `page` in headless Chromium; after the load event, count the <img> that decoded."""
    probe = tmp / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", CHECK + "\n</body>"), encoding="utf-8")
    p = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                        f"--user-data-dir={tmp / 'profile'}", "--dump-dom", probe.as_uri()],
                       capture_output=True, text=True, timeout=180)
    m = re.search(r"IMAGES (\d+) LOADED (\d+) BAD (.*?)</pre>", p.stdout)
    assert m, (p.returncode, p.stderr[-2000:])
    return int(m.group(1)), int(m.group(2)), m.group(3)


@pytest.mark.skipif(chromium() is None, reason="no headless Chromium (apt install chromium)")
def test_report_html_figures_load_in_chromium(tmp_path):
    root = make_workspace(tmp_path / "w")
    assert run_stage(root).returncode == 0
    n, ok, bad = loaded_in_chromium(root / "report" / "REPORT.html", tmp_path)
    assert n == 3 and ok == n, bad


@pytest.mark.skipif(chromium() is None, reason="no headless Chromium (apt install chromium)")
def test_the_committed_report_html_loads_every_figure(tmp_path):
    page = REPO / "report" / "REPORT.html"
    assert page.exists(), "report/REPORT.html is a committed output: dvc repro report"
    md = (REPO / "report" / "REPORT.md").read_text(encoding="utf-8")
    n, ok, bad = loaded_in_chromium(page, tmp_path)
    assert n == len(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)) and ok == n, bad
    assert len(embedded_pngs(page.read_text(encoding="utf-8"))) == n
