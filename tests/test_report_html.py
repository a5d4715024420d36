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
IMG = re.compile(r'<img src="([^"]*)" alt="([^"]*)"')


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
    assert "<pre><code>raw &lt;b&gt;\n</code></pre>" in page
    (src, alt), = IMG.findall(page)
    assert alt == "a figure" and base64.b64decode(src.split(",", 1)[1]) == PNG + b"0"
    assert markdown_to_html(md, lambda s: None) == markdown_to_html(md, lambda s: None)  # deterministic


def test_status_marks_are_words_and_figures_open_full_size_on_click():
    """✅ ❌ ⏭ were empty boxes in Chromium without an emoji font, and figures could not be enlarged (issue 66)."""
    md = "| claim | result |\n| --- | --- |\n| a | ✅ |\n| b | ❌ not reproduced |\n| c | ❌ |\n| d | ⏭ skipped |\n\n" \
         "![f](figures/f.png)\n"
    page = markdown_to_html(md, lambda src: PNG)
    body = page.split("<body>", 1)[1]
    assert not set("✅❌⏭") & set(body)
    assert ['<td><span class="pass">pass</span></td>', '<td><span class="fail">not reproduced</span></td>',
            '<td><span class="fail">fail</span></td>', '<td><span class="skipped">skipped</span></td>'] == \
        re.findall(r"<td><span.*?</td>", body)
    assert re.search(r'<img src="data:image/png;base64,[^"]*" alt="f" tabindex="0"', body)
    assert "img:focus{position:fixed" in page and "max-width:98vw" in page


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


def embedded_font_cmap(page: str) -> set[int]:
    """The code points of the CJK font REPORT.html embeds (report/html.py: font_face)."""
    import io

    from fontTools.ttLib import TTFont
    m = re.search(r"@font-face\{font-family:ReportCJK;src:url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)", page)
    assert m, "no embedded CJK font"
    return set(TTFont(io.BytesIO(base64.b64decode(m.group(1), validate=True))).getBestCmap())


def test_the_committed_report_html_embeds_every_cjk_glyph_it_shows():
    """Every CJK character of the page's text is in the font the page carries, so it renders on a machine
    without CJK fonts (the figures draw theirs into the PNGs)."""
    import html as html_lib

    from attnrepro.report.html import wide_chars
    page = (REPO / "report" / "REPORT.html").read_text(encoding="utf-8")
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", page.split("<body>", 1)[1]))
    chars = wide_chars(text)
    assert len(chars) > 50  # the chapter's quotes
    missing = [c for c in chars if ord(c) not in embedded_font_cmap(page)]
    assert not missing, missing


FIRST_SCREEN = """<script>
window.addEventListener("load", function () {
  var sample = document.body.innerText.replace(/[\\u0000-\\u2e7f]/g, "").slice(0, 200);
  document.fonts.load("16px ReportCJK", sample).then(function (faces) {
    var seen = [];
    document.querySelectorAll("h1, h2, p, li, pre").forEach(function (e) {
      if (e.getBoundingClientRect().top < window.innerHeight) seen.push(e.innerText);
    });
    var pre = document.createElement("pre");
    pre.id = "fontcheck";
    pre.textContent = "FACES " + faces.map(function (f) { return f.family + ":" + f.status; }).join(",")
      + " CHECK " + document.fonts.check("16px ReportCJK", sample) + " FIRST " + JSON.stringify(seen.join(" | "));
    document.body.appendChild(pre);
  }, function (e) { document.body.appendChild(document.createTextNode("FONTERROR " + e)); });
});
</script>"""


@pytest.mark.skipif(chromium() is None, reason="no headless Chromium (apt install chromium)")
def test_the_committed_reports_first_screen_in_chromium(tmp_path):
    """In headless Chromium at 1280x1000: the embedded CJK font loads and covers the page's Chinese, the first
    screen holds both answers (does the chapter reproduce, does the run match the reference), and its
    screenshot is an image with content."""
    import numpy as np
    from matplotlib.image import imread

    page = REPO / "report" / "REPORT.html"
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", FIRST_SCREEN + "\n</body>"), encoding="utf-8")
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1000",
            "--virtual-time-budget=10000", f"--user-data-dir={tmp_path / 'profile'}"]
    p = subprocess.run([*args, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180)
    m = re.search(r"FACES (.*?) CHECK (\w+) FIRST (.*?)</pre>", p.stdout)
    assert m, (p.returncode, p.stderr[-2000:], "FONTERROR" in p.stdout)
    assert m.group(1) == "ReportCJK:loaded" and m.group(2) == "true", m.group(0)[:300]
    first = m.group(3)
    assert "The chapter " in first and "this run against the reference:" in first, first[:500]
    shot = tmp_path / "first.png"
    p = subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert shot.is_file(), p.stderr[-2000:]
    img = imread(shot)
    assert img.shape[:2] == (1000, 1280) and float(np.std(img[..., :3])) > 0.05
