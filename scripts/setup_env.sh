#!/usr/bin/env bash
# Create (or reuse) .venv and install attnrepro with everything it needs (torch, dvc, dask
# and distributed for the sweeps, ...; pyproject.toml) and its test extras.
#
# torch==2.13.0 comes from the default package index: on an ordinary Linux x86_64 machine that
# is a CUDA build (it runs on CPU too, but downloads the CUDA libraries; machines with a local
# CPU wheel, like this project's reference machine, get that instead). For a CPU-only build set
# ATTNREPRO_TORCH_INDEX to PyTorch's CPU wheel index (see the install selector on pytorch.org).
# To keep a torch you installed into .venv yourself, set ATTNREPRO_KEEP_TORCH=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: attnrepro needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1) (set PYTHON=...)" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if [ "${ATTNREPRO_KEEP_TORCH:-0}" != "1" ]; then
    if [ -n "${ATTNREPRO_TORCH_INDEX:-}" ]; then
        echo "==> installing torch==2.13.0 from $ATTNREPRO_TORCH_INDEX"
        "${PIP[@]}" torch==2.13.0 --index-url "$ATTNREPRO_TORCH_INDEX"
    else
        echo "==> installing torch==2.13.0 from the default index (on an ordinary Linux x86_64 machine a CUDA build)"
        "${PIP[@]}" torch==2.13.0
    fi
fi
echo "==> installing attnrepro and its dependencies"
"${PIP[@]}" -e ".[test]"
if ! command -v npm >/dev/null 2>&1; then
    echo "warning: npm not found; the corpus stage needs it (or set corpus.source to url/local)" >&2
fi
