"""Rebuild vendor/vega/: the HTML template of `dvc plots show` with Vega inlined, so the plots
render offline (DVC's default page loads Vega from a CDN and is blank without internet).

    python scripts/vendor_vega.py        # needs npm (network) once; the result is committed

Fetches the versions DVC's own page uses (dvc_render.vega.VegaRenderer.SCRIPTS) with `npm pack`,
checks each tarball against its pinned sha512 integrity, and writes
  vendor/vega/dvc_plots.html   the template (.dvc/config: plots.html_template): the three
                               minified builds inline, then DVC's {plot_divs}
  vendor/vega/LICENSE.<pkg>    each package's licence (BSD-3-Clause; it asks for the notice)
Inline rather than <script src=...>: the page works wherever `dvc plots show -o` writes it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = [  # (package@version, sha512 integrity, file inside the tarball)
    ("vega@5.20.2", "sha512-qmH7aD9GGPpssVdxL1xgcdxTbQzyRUeRR16Os385ymvQhiwCYQNA6+eXUPAZDTVLfk0RXu6Jzj6kUE5jQ80EVw==",
     "package/build/vega.min.js"),
    ("vega-lite@5.2.0", "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2JADOT2dhGNErw==",
     "package/build/vega-lite.min.js"),
    ("vega-embed@6.18.2", "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2ydixq8Lk3dOlg==",
     "package/build/vega-embed.min.js"),
]
OUT = Path(__file__).resolve().parents[1] / "vendor" / "vega"

PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>attnrepro plots</title>
    <!-- attnrepro: Vega, Vega-Lite and Vega-Embed inlined ({versions}; BSD-3-Clause, see
         vendor/vega/LICENSE.*), so this page needs no network. Rebuilt by scripts/vendor_vega.py. -->
{scripts}
    <style>
        body {{ font-family: sans-serif; display: flex; flex-wrap: wrap; align-items: flex-start; gap: 8px; }}
        table {{ border-spacing: 15px; }}
        body > div {{ flex: 0 0 auto; }}
        body > div img {{ max-width: 560px; height: auto; }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def fetch(spec: str, integrity: str, member: str, work: Path) -> tuple[str, str]:
    """(minified JS, LICENSE text) of `spec`, after checking the tarball's integrity."""
    proc = subprocess.run(["npm", "pack", spec, "--json", "--pack-destination", str(work)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: npm pack {spec} failed: {proc.stderr.strip().splitlines()[-1:]}")
    tgz = work / json.loads(proc.stdout)[0]["filename"]
    got = "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
    if got != integrity:
        sys.exit(f"error: {spec}: integrity {got}, pinned {integrity}")
    with tarfile.open(tgz, "r:gz") as tar:
        js = tar.extractfile(member).read().decode("utf-8")
        lic = tar.extractfile("package/LICENSE").read().decode("utf-8")
    js = "\n".join(ln for ln in js.splitlines() if not ln.startswith("//# sourceMappingURL="))
    if "</script" in js.lower():
        js = js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
    return js, lic


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    scripts = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec, integrity, member in PACKAGES:
            js, lic = fetch(spec, integrity, member, Path(tmp))
            name = spec.rsplit("@", 1)[0]
            (OUT / f"LICENSE.{name}").write_text(lic, encoding="utf-8")
            scripts.append(f"    <script>/* {spec} */\n{js}\n    </script>")
    page = PAGE.format(versions=", ".join(p[0] for p in PACKAGES), scripts="\n".join(scripts))
    (OUT / "dvc_plots.html").write_text(page, encoding="utf-8")
    print(f"wrote {OUT / 'dvc_plots.html'} ({len(page.encode()) // 1024} KiB)")


if __name__ == "__main__":
    main()
