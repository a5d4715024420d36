"""The command line: `attnrepro` (main) and its subcommands, each a module (audit, keep and
restore, kv, store, staging, tiny). The top of the house: imports any layer, imported by none."""

import os
import shutil
import sys

from attnrepro.config import UserError


def tool(name: str) -> str:
    """The path of a command the environment installs (dvc): on PATH, or beside this Python (the venv's bin/,
    when it is not activated); else one line saying how to get it."""
    found = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    if found is None:
        raise UserError(f"`{name}` is neither on PATH nor beside {sys.executable} (activate the environment: "
                        "source .venv/bin/activate)")
    return found
