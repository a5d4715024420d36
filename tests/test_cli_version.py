"""`attnrepro --version`: the installed package's version and torch's, without importing torch."""

import subprocess
import sys
from importlib.metadata import version

from attnrepro.commands import main as cli


def test_version_names_the_package_and_torch(capsys):
    try:
        cli.main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"attnrepro {version('attnrepro')} (torch {version('torch')})"


def test_version_does_not_import_torch():
    code = "import sys; from attnrepro.commands import main as cli; cli.build_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
