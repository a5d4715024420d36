#!/usr/bin/env bash
# GPU reference run of the `latency` and `kv_cache` stages (their CUDA paths) plus the
# GPU-marked tests, in about 5 minutes on one H200. What it leaves under $OUT is two files at
# its top, so that all of it comes back from a machine that carries at most 8 files, at most
# 2 folders deep:
#
#   $OUT/SUMMARY.txt        the figures (SDPA at the largest n as % of peak, naive vs fused
#                           memory, the SDPA backend, the KV-cache speed-up), each step's exit
#                           status, and the archive's listing; also printed
#   $OUT/gpu_check.tar.gz   everything else, laid out as it is committed as the GPU reference:
#                             metrics/gpu/<slug>/{latency,kv_cache,env_latency,env_kv_cache}.json
#                             plots/gpu/<slug>/{latency,kv_cache}/*
#                             logs/{preflight,latency,kv_cache,pytest_gpu}.log
#                           (tar -xzf gpu_check.tar.gz in the checkout puts them in place)
#
# Usage (from anywhere):  OUT=/path/to/empty/dir bash scripts/gpu_check.sh
#   PYTHON=...            interpreter to use (default: .venv/bin/python if it sees CUDA, else python3)
#   SKIP_TESTS=1          skip `pytest -m gpu`
#   STAGE_TIMEOUT=s       per-stage wall-clock limit (default 150; the tests get half of it)
#   GPU_CHECK_PARAMS=f    the params file (default params.yaml)
#   GPU_CHECK_DEVICE=cpu  dry run of the script itself on a machine without CUDA (slug cpu-dry-run;
#                         tests/test_gpu_check.py runs it so)
#
# Assumptions (the GPU box has no internet, so nothing is installed here):
#   - a CUDA build of torch >= 2.4 is already installed, with numpy, pyyaml, matplotlib,
#     tqdm and psutil; nvidia-ml-py (pynvml) is optional (without it the GPU name comes
#     from torch and driver/memory are not recorded); pytest only for the tests;
#   - this is a copy of the repository (params.yaml, src/, stages/); attnrepro need not be
#     pip-installed: PYTHONPATH=src is set below; dvc is not needed;
#   - the stages use the `latency` and `kv_cache` sections of the params with --device cuda
#     (latency: n 512..8192 in fp16 and bf16, a time-based warm-up, then timed repetitions of
#     back-to-back calls; the naive n x n path up to n = 65536, which is expected to hit
#     out-of-memory and is recorded as such).
# Each stage runs even if the other fails; the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

if [ -z "${OUT:-}" ]; then
    echo "error: set OUT to the folder for the results (OUT=/tmp/gpu bash scripts/gpu_check.sh)" >&2
    exit 2
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
TIMEOUT=${STAGE_TIMEOUT:-150}
PARAMS=${GPU_CHECK_PARAMS:-params.yaml}
export DEVICE=${GPU_CHECK_DEVICE:-cuda}  # GPU_CHECK_DEVICE=cpu: dry run of this script without a GPU

# everything is made in a scratch folder outside $OUT, then packed (pack runs on every exit)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
LOGS="$WORK/logs"
mkdir -p "$LOGS"
SLUG=unknown
status=0
steps=""

pack() {
    {
        echo "device slug: $SLUG"
        echo "status: $status (0 = every step succeeded)"
        printf "%b" "$steps"
        if [ -d "$WORK/stage" ]; then
            "$PYTHON" "$REPO/scripts/gpu_summary.py" "$WORK/stage" 2>&1
        fi
        echo "archive gpu_check.tar.gz:"
        (cd "$WORK" && find metrics plots logs -type f 2>/dev/null | sort | sed 's/^/  /')
    } >"$OUT/SUMMARY.txt"
    (cd "$WORK" && tar -czf "$OUT/gpu_check.tar.gz" $(ls -d metrics plots logs 2>/dev/null))
    rm -rf "$WORK"
    echo "==> SUMMARY.txt"
    cat "$OUT/SUMMARY.txt"
}
PYTHON=${PYTHON:-}
trap pack EXIT

if [ -z "$PYTHON" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        PYTHON=.venv/bin/python
    fi
fi

# ---- preflight: CUDA, the imports the stages need, the device slug
if ! "$PYTHON" - >"$LOGS/preflight.log" 2>&1 <<'PY'
import importlib.util, os, sys
missing = [m for m in ("torch", "numpy", "yaml", "matplotlib", "tqdm", "psutil") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (install them offline first)")
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if os.environ["DEVICE"].startswith("cuda") and not torch.cuda.is_available():
    sys.exit("torch.cuda.is_available() is False: a CUDA build of torch and a visible GPU are needed")
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "pynvml", importlib.util.find_spec("pynvml") is not None)
import attnrepro.measure.timing, attnrepro.model.kv  # noqa: F401  (src/ importable)
PY
then
    cat "$LOGS/preflight.log" >&2
    echo "error: preflight failed (its log is in gpu_check.tar.gz)" >&2
    status=3
    steps="preflight: failed\n"
    exit 3
fi
cat "$LOGS/preflight.log"

SLUG=$("$PYTHON" - <<'PY'
import os

from attnrepro.envinfo import environment
from attnrepro.judge.revision import device_slug  # the folder attnrepro check reads the GPU reference from

device = os.environ["DEVICE"]
print(device_slug(environment(device).get("gpu_name", "")) if device.startswith("cuda") else "cpu-dry-run")
PY
)
echo "==> device slug: $SLUG"

run_stage() {  # name
    local name=$1 t0 rc
    t0=$(date +%s)
    echo "==> $name ($DEVICE, timeout ${TIMEOUT}s)"
    timeout "$TIMEOUT" "$PYTHON" "stages/$name.py" --params "$PARAMS" --device "$DEVICE" --out-root "$WORK/stage" \
        >"$LOGS/$name.log" 2>&1
    rc=$?
    echo "    $name: exit $rc after $(( $(date +%s) - t0 )) s"
    steps="$steps$name: exit $rc after $(( $(date +%s) - t0 )) s\n"
    tail -n 3 "$LOGS/$name.log"
    [ "$rc" -eq 0 ] || status=1
}
run_stage latency
run_stage kv_cache

# ---- lay the results out by device, as they are committed
M="$WORK/metrics/gpu/$SLUG"
P="$WORK/plots/gpu/$SLUG"
mkdir -p "$M" "$P"
for name in latency kv_cache; do
    [ -f "$WORK/stage/metrics/$name.json" ] && cp "$WORK/stage/metrics/$name.json" "$M/$name.json"
    [ -f "$WORK/stage/metrics/env/$name.json" ] && cp "$WORK/stage/metrics/env/$name.json" "$M/env_$name.json"
    [ -d "$WORK/stage/plots/$name" ] && mkdir -p "$P/$name" && cp "$WORK/stage/plots/$name/"* "$P/$name/"
done

if [ "${SKIP_TESTS:-0}" != "1" ]; then
    if "$PYTHON" -c "import pytest" 2>/dev/null; then
        echo "==> pytest -m gpu"
        timeout $(( TIMEOUT / 2 )) "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider \
            tests/test_benchmark.py tests/test_kv_cache.py tests/test_envinfo.py tests/test_device.py \
            >"$LOGS/pytest_gpu.log" 2>&1
        rc=$?
        # 5: no test selected (every gpu test skipped on a dry run is a pass, not this)
        [ "$rc" -eq 0 ] || status=1
        steps="${steps}pytest -m gpu: exit $rc, $(tail -n 1 "$LOGS/pytest_gpu.log")\n"
        tail -n 3 "$LOGS/pytest_gpu.log"
    else
        echo "==> pytest not installed: GPU tests skipped" | tee "$LOGS/pytest_gpu.log"
        steps="${steps}pytest -m gpu: not installed\n"
    fi
fi
exit "$status"
