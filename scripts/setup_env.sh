#!/usr/bin/env bash
# Create (or reuse) .venv and install attnrepro with everything it needs (torch, dvc, dask
# and distributed for the sweeps, ...; pyproject.toml) and its test extras, at the versions of
# requirements.lock: the tested environment, every package pinned (docs/INSTALL.md, "Pins and exact verdicts").
# The lock is used as pip constraints, so a reused .venv is moved to the locked versions too.
#
# torch's pin is the lock's (torch==2.13.0). From the default package index, on an ordinary Linux
# x86_64 machine that is a CUDA build (it runs on CPU too, but downloads the CUDA libraries; machines
# with a local CPU wheel, like this project's reference machine, get that instead). For a CPU-only
# build set ATTNREPRO_TORCH_INDEX to PyTorch's CPU wheel index (see the install selector on
# pytorch.org). To keep a torch you installed into .venv yourself, set ATTNREPRO_KEEP_TORCH=1.
#
#   ATTNREPRO_LOCK=0   install from pyproject.toml's lower bounds instead of the lock (a newer
#                      environment: results need not be byte-identical to the reference)
#   ATTNREPRO_GPU=auto add the gpu extra (nvidia-ml-py: the GPU's name, driver and memory in the
#                      environment records) where `nvidia-smi -L` lists a GPU; 1 always, 0 never
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: attnrepro needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1) (set PYTHON=...)" >&2
    exit 2
fi
LOCK=requirements.lock
TORCH_PIN=$(grep -E '^torch==' "$LOCK")   # torch==2.13.0
USE_LOCK=${ATTNREPRO_LOCK:-1}
case "$USE_LOCK" in
    0|1) ;;
    *) echo "error: ATTNREPRO_LOCK must be 1 (the lock, the default) or 0 (lower bounds), not '$USE_LOCK'" >&2; exit 2 ;;
esac
EXTRAS="test"
case "${ATTNREPRO_GPU:-auto}" in
    1) EXTRAS="test,gpu" ;;
    0) ;;
    auto)
        GPUS=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
        if [ "${GPUS:-0}" -gt 0 ]; then
            EXTRAS="test,gpu"
        fi ;;
    *) echo "error: ATTNREPRO_GPU must be auto, 1 or 0, not '${ATTNREPRO_GPU}'" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
if [ "$USE_LOCK" = "1" ] && [ "$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "3.11" ]; then
    echo "note: $LOCK was made with Python 3.11; .venv has $(.venv/bin/python --version 2>&1)" \
         "(a pin without a wheel for it fails: ATTNREPRO_LOCK=0 installs from the lower bounds)" >&2
fi
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)

# the constraints: the lock, less torch when you keep your own
CONSTRAINTS=$LOCK
if [ "${ATTNREPRO_KEEP_TORCH:-0}" = "1" ]; then
    CONSTRAINTS=$(mktemp "${TMPDIR:-/tmp}/attnrepro-lock.XXXXXX")
    trap 'rm -f "$CONSTRAINTS"' EXIT
    grep -v -E '^torch==' "$LOCK" > "$CONSTRAINTS"
else
    if [ -n "${ATTNREPRO_TORCH_INDEX:-}" ]; then
        # that index need not hold the lock's versions of torch's own dependencies: the next step pins them
        echo "==> installing $TORCH_PIN from $ATTNREPRO_TORCH_INDEX"
        "${PIP[@]}" "$TORCH_PIN" --index-url "$ATTNREPRO_TORCH_INDEX"
    else
        echo "==> installing $TORCH_PIN from the default index (on an ordinary Linux x86_64 machine a CUDA build)"
        if [ "$USE_LOCK" = "1" ]; then
            "${PIP[@]}" -c "$CONSTRAINTS" "$TORCH_PIN"
        else
            "${PIP[@]}" "$TORCH_PIN"
        fi
    fi
fi
if [ "$USE_LOCK" = "1" ]; then
    echo "==> installing attnrepro[$EXTRAS] and its dependencies at the versions of $LOCK"
    "${PIP[@]}" -c "$CONSTRAINTS" -e ".[$EXTRAS]"
else
    echo "==> installing attnrepro[$EXTRAS] and its dependencies from pyproject.toml's bounds (ATTNREPRO_LOCK=0)"
    "${PIP[@]}" -e ".[$EXTRAS]"
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "warning: npm not found; the corpus stage needs it (or set corpus.source to url/local)" >&2
fi
