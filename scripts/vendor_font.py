"""Make vendor/fonts/report-cjk.otf: Noto Sans CJK SC cut to the CJK characters of the source
documents (../shared/seeds/, where every quote of the report comes from) and of this repository's
claims and code, so that REPORT.html can embed the glyphs it needs on any machine.

Needs Debian's fonts-noto-cjk once (apt-get install fonts-noto-cjk); the report stage reads only
the vendored file. Usage: python scripts/vendor_font.py [--seeds DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection

from attnrepro.report.html import wide_chars  # what the report embeds: CJK and full-width punctuation

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
SC = 2  # the collection's Simplified Chinese face
OUT = ROOT / "vendor" / "fonts" / "report-cjk.otf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=Path, default=ROOT.parent / "shared" / "seeds")
    args = ap.parse_args()
    files = [*args.seeds.glob("*.txt"), ROOT / "claims.yaml", *sorted((ROOT / "src").rglob("*.py"))]
    chars = set().union(*(wide_chars(f.read_text(encoding="utf-8")) for f in files))
    font = TTCollection(SOURCE).fonts[SC]
    opts = subset.Options()
    opts.name_IDs, opts.notdef_outline, opts.layout_features = ["*"], True, []  # keep the licence's name records
    sub = subset.Subsetter(opts)
    sub.populate(unicodes=sorted(map(ord, chars)))
    sub.subset(font)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    font.save(OUT)
    print(f"{OUT.relative_to(ROOT)}: {len(chars)} characters, {OUT.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
