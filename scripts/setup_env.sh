#!/usr/bin/env bash
# Create (or reuse) .venv and install attnrepro with its test extras.
#
# torch: by default the CPU wheel torch==2.13.0 is installed. To use your own build
# (e.g. CUDA), install it into .venv first and set ATTNREPRO_KEEP_TORCH=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if [ "${ATTNREPRO_KEEP_TORCH:-0}" != "1" ]; then
    echo "==> installing torch==2.13.0 (CPU build)"
    "${PIP[@]}" torch==2.13.0
fi
echo "==> installing attnrepro and its dependencies"
"${PIP[@]}" -e ".[test]"
if ! command -v npm >/dev/null 2>&1; then
    echo "warning: npm not found; the corpus stage needs it (or set corpus.source to url/local)" >&2
fi
