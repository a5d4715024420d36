"""The report as one HTML page (report/REPORT.html): a small Markdown-to-HTML converter for what
REPORT.md uses (headings, paragraphs, tables, lists, images, code spans, bold, links), with every
figure embedded as a data URI so the page stands alone. Standard library only."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

HTML_STYLE = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;line-height:1.45;color:#1b1b1b}h1,h2,h3{line-height:1.2}h2{border-bottom:1px solid #ccc;
padding-bottom:.2em;margin-top:2em}.table{overflow-x:auto}table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.2em .45em;vertical-align:top}th{background:#f3f3f3}code{background:#f4f4f4;
padding:0 .2em;font-size:.92em}pre{background:#f4f4f4;padding:.6em;overflow-x:auto}figure{margin:1em 0}
img{max-width:100%;height:auto}figcaption{font-size:.85em;color:#555}"""

_CODE = re.compile(r"(`+)(.+?)\1")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def _inline(text: str, image) -> str:
    """Markdown inline markup -> HTML: code spans, images, links, bold; everything else escaped."""
    out, pos = [], 0
    for mt in _CODE.finditer(text):
        out.append(_inline_plain(text[pos:mt.start()], image))
        out.append(f"<code>{html.escape(mt.group(2).strip(), quote=False)}</code>")
        pos = mt.end()
    out.append(_inline_plain(text[pos:], image))
    return "".join(out)


def _inline_plain(text: str, image) -> str:
    pieces, pos = [], 0
    for mt in _IMAGE.finditer(text):
        pieces.append(_markup(text[pos:mt.start()]))
        pieces.append(image(mt.group(1), mt.group(2)))
        pos = mt.end()
    pieces.append(_markup(text[pos:]))
    return "".join(pieces)


def _markup(text: str) -> str:
    t = html.escape(text.replace("\\|", "|"), quote=False)  # markdown's escaped pipe is a pipe
    t = _BOLD.sub(r"<strong>\1</strong>", t)
    return _LINK.sub(lambda mt: f'<a href="{html.escape(mt.group(2))}">{mt.group(1)}</a>', t)


def _row(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def markdown_to_html(md: str, resolve, title: str = "attnrepro: reproduction report") -> str:
    """The report's markdown as one self-contained HTML page: headings, paragraphs, tables, lists,
    fenced code, images (resolve(src) -> PNG bytes or None; found ones are embedded as data URIs),
    code spans, bold and links. Deterministic: the same markdown and images, the same bytes."""

    def image(alt: str, src: str) -> str:
        data = resolve(src)
        url = ("data:image/png;base64," + base64.b64encode(data).decode("ascii")) if data else src
        return f'<img src="{html.escape(url)}" alt="{html.escape(alt)}">'

    lines = md.split("\n")
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append("<p>" + _inline(" ".join(para), image) + "</p>")
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j]), quote=False) + "</code></pre>")
            i = j + 1
            continue
        if not s:
            flush()
            i += 1
            continue
        h = re.match(r"(#{1,6})\s+(.*)", s)
        if h:
            flush()
            n = len(h.group(1))
            ident = re.sub(r"[^a-z0-9]+", "-", h.group(2).lower()).strip("-")
            out.append(f'<h{n} id="{ident}">' + _inline(h.group(2), image) + f"</h{n}>")
            i += 1
            continue
        if s.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?",
                                                                   lines[i + 1].strip()):
            flush()
            head = _row(s)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_row(lines[i]))
                i += 1
            t = ['<div class="table"><table>', "<thead><tr>" + "".join(f"<th>{_inline(c, image)}</th>" for c in head)
                 + "</tr></thead>", "<tbody>"]
            t += ["<tr>" + "".join(f"<td>{_inline(c, image)}</td>" for c in r) + "</tr>" for r in rows]
            out.append("\n".join(t + ["</tbody></table></div>"]))
            continue
        if re.match(r"[-*] ", s):
            flush()
            items = []
            while i < len(lines) and re.match(r"[-*] ", lines[i].strip()):
                items.append("<li>" + _inline(lines[i].strip()[2:], image) + "</li>")
                i += 1
            out.append("<ul>\n" + "\n".join(items) + "\n</ul>")
            continue
        img = _IMAGE.fullmatch(s)
        if img:
            flush()
            out.append("<figure>" + image(img.group(1), img.group(2)) + "<figcaption>"
                       + html.escape(img.group(1), quote=False) + "</figcaption></figure>")
            i += 1
            continue
        para.append(s)
        i += 1
    flush()
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{HTML_STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(out) + "\n</body>\n</html>\n")


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
