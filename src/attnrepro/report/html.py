"""The report as one HTML page (report/REPORT.html): REPORT.md through markdown-it (CommonMark and
tables), with every figure embedded as a data URI and the CJK glyphs the page uses embedded as a
font (vendor/fonts/report-cjk.otf, cut to the page's characters), so the page stands alone and its
Chinese quotes render on a machine without CJK fonts; the status marks as words (MARKS), and a figure
shown full size while clicked (focused)."""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTFont
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

FONT = Path(__file__).resolve().parents[3] / "vendor" / "fonts" / "report-cjk.otf"
FONT_FAMILY = "ReportCJK"

HTML_STYLE = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif,ReportCJK;max-width:1100px;margin:2em auto;
padding:0 1em;line-height:1.45;color:#1b1b1b}h1,h2,h3{line-height:1.2}h2{border-bottom:1px solid #ccc;
padding-bottom:.2em;margin-top:2em}table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;
overflow-x:auto}th,td{border:1px solid #ccc;padding:.2em .45em;vertical-align:top}th{background:#f3f3f3}
code{background:#f4f4f4;padding:0 .2em;font-size:.92em}pre{background:#f4f4f4;padding:.6em;overflow-x:auto}
img{max-width:100%;height:auto;cursor:zoom-in}p>em:only-child{font-size:.9em;color:#555}
img:focus{position:fixed;inset:0;margin:auto;max-width:98vw;max-height:98vh;width:auto;height:auto;z-index:9;
background:#fff;box-shadow:0 0 0 100vmax rgba(0,0,0,.7);outline:none;cursor:zoom-out}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}.skipped{color:#666}"""
# the Markdown's status marks, as words in the HTML: no font the page embeds has them, and Chromium without
# an emoji font draws empty boxes; "❌ missing" keeps its own word
MARKS = {"✅": "pass", "❌": "fail", "⏭": "skipped"}
MARK = re.compile(r"([✅❌⏭])(?: ([a-z][a-z ]*[a-z]))?")


def anchor(title: str) -> str:
    """A heading's id as GitHub makes it (lower case, punctuation dropped, each space a hyphen), so that the
    report's links into APPENDIX.md resolve where the Markdown is read."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def wide_chars(text: str) -> str:
    """The characters a Latin font lacks (CJK, full-width punctuation), sorted: what the font must carry."""
    return "".join(sorted({c for c in text if ord(c) >= 0x2E80}))


def font_face(chars: str) -> str:
    """@font-face for the vendored CJK font cut to `chars` (deterministic bytes); "" when none is needed."""
    if not chars:
        return ""
    font = TTFont(FONT, recalcTimestamp=False)  # no date in the bytes
    opts = subset.Options()
    opts.name_IDs, opts.layout_features = ["*"], []
    sub = subset.Subsetter(opts)
    sub.populate(unicodes=[ord(c) for c in chars])
    sub.subset(font)
    buf = io.BytesIO()
    font.save(buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f"@font-face{{font-family:{FONT_FAMILY};src:url(data:font/otf;base64,{data}) format('opentype')}}"


def markdown_to_html(md: str, resolve, title: str = "attnrepro: reproduction report") -> str:
    """The report's markdown as one self-contained HTML page; resolve(src) -> PNG bytes or None (found
    ones are embedded as data URIs). Deterministic: the same markdown and images, the same bytes."""
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")

    def image(self, tokens, idx, options, env):
        data = resolve(tokens[idx].attrGet("src"))
        if data:
            tokens[idx].attrSet("src", "data:image/png;base64," + base64.b64encode(data).decode("ascii"))
        tokens[idx].attrSet("tabindex", "0")  # a click focuses it: full size over the page (img:focus), no script
        return self.image(tokens, idx, options, env)

    def text(self, tokens, idx, options, env):
        return MARK.sub(lambda m: f'<span class="{MARKS[m[1]]}">{m[2] or MARKS[m[1]]}</span>',
                        escapeHtml(tokens[idx].content))

    def heading(self, tokens, idx, options, env):
        tokens[idx].attrSet("id", anchor(tokens[idx + 1].content))
        return self.renderToken(tokens, idx, options, env)

    parser.add_render_rule("image", image)
    parser.add_render_rule("text", text)
    parser.add_render_rule("heading_open", heading)
    body = parser.render(md)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{font_face(wide_chars(md))}{HTML_STYLE}</style>\n"
            "</head>\n<body>\n" + body + "</body>\n</html>\n")


def resolver(figures: dict[str, bytes], plots_dir: Path, plots_href: str):
    """src (as REPORT.md writes it) -> PNG bytes: the report's own figures and the stages' PNGs."""

    def resolve(src: str) -> bytes | None:
        if src.startswith("figures/"):
            return figures.get(src[len("figures/"):])
        if src.startswith(plots_href.rstrip("/") + "/"):
            f = plots_dir / src[len(plots_href.rstrip("/")) + 1:]
            return f.read_bytes() if f.is_file() else None
        return None

    return resolve
