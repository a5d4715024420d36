"""`attnrepro --version`: the installed package's version and torch's, without importing torch."""

import re
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


def test_the_top_level_help_describes_the_tool_and_lists_each_command_once():
    """`attnrepro --help` said "The `attnrepro` command." and listed the commands twice, the hand-written
    list without audit (issue 40)."""
    from attnrepro.commands.main import COMMANDS

    text = cli.build_parser().format_help()
    assert "The `attnrepro` command." not in text and "reproducible pipeline" in text
    for name in ["check", "claims", *COMMANDS]:
        assert len(re.findall(rf"^    {name} ", text, re.M)) == 1, name
        assert f"attnrepro {name} " not in text, name  # no second, hand-written list
