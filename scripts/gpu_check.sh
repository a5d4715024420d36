#!/usr/bin/env bash
# GPU reference run of the `latency` and `kv_cache` stages (their CUDA paths) plus the
# GPU-marked tests. Results land under $OUT, keyed by a slug of the GPU name, ready to be
# committed as the GPU reference:
#
#   $OUT/metrics/gpu/<slug>/latency.json, kv_cache.json, env_latency.json, env_kv_cache.json
#   $OUT/plots/gpu/<slug>/latency/{latency.csv,latency.png}
#   $OUT/plots/gpu/<slug>/kv_cache/{latency.csv,latency.png}
#   $OUT/logs/{preflight,latency,kv_cache,pytest_gpu}.log and $OUT/SUMMARY.txt
#
# Usage (from anywhere):  OUT=/path/to/empty/dir bash scripts/gpu_check.sh
#   PYTHON=...        interpreter to use (default: .venv/bin/python if it sees CUDA, else python3)
#   SKIP_TESTS=1      skip `pytest -m gpu`
#   STAGE_TIMEOUT=s   per-stage wall-clock limit (default 240)
#   GPU_CHECK_DEVICE=cpu  dry run of the script itself on a machine without CUDA (slug cpu-dry-run)
#
# Assumptions (the GPU box has no internet, so nothing is installed here):
#   - a CUDA build of torch >= 2.4 is already installed, with numpy, pyyaml, matplotlib,
#     tqdm and psutil; nvidia-ml-py (pynvml) is optional (without it the GPU name comes
#     from torch and driver/memory are not recorded); pytest only for the tests;
#   - this is a copy of the repository (params.yaml, src/, stages/); attnrepro need not be
#     pip-installed: PYTHONPATH=src is set below; dvc is not needed;
#   - the stages use the `latency` and `kv_cache` sections of params.yaml with --device cuda
#     (latency: n 512..8192 in fp16 and bf16, 5 warm-up + 30 timed reps; the naive n x n
#     path up to n = 65536, which is expected to hit out-of-memory and is recorded as such).
# Each stage runs even if the other fails; the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

if [ -z "${OUT:-}" ]; then
    echo "error: set OUT to the folder for the results (OUT=/tmp/gpu bash scripts/gpu_check.sh)" >&2
    exit 2
fi
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
TIMEOUT=${STAGE_TIMEOUT:-240}
export DEVICE=${GPU_CHECK_DEVICE:-cuda}  # GPU_CHECK_DEVICE=cpu: dry run of this script without a GPU

if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        PYTHON=.venv/bin/python
    fi
fi

# ---- preflight: CUDA, the imports the stages need, the device slug
if ! "$PYTHON" - >"$OUT/logs/preflight.log" 2>&1 <<'PY'
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
    cat "$OUT/logs/preflight.log" >&2
    echo "error: preflight failed (see $OUT/logs/preflight.log)" >&2
    exit 3
fi
cat "$OUT/logs/preflight.log"

SLUG=$("$PYTHON" - <<'PY'
import re
import torch
from attnrepro.envinfo import gpu_info
import os
if not os.environ["DEVICE"].startswith("cuda"):
    name = "cpu-dry-run"
else:
    name = gpu_info().get("gpu_name") or torch.cuda.get_device_name(0)
print(re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu")
PY
)
echo "==> device slug: $SLUG"

WORK="$OUT/.work"
rm -rf "$WORK"
mkdir -p "$WORK"
status=0

run_stage() {  # name
    local name=$1 t0 rc
    t0=$(date +%s)
    echo "==> $name ($DEVICE, timeout ${TIMEOUT}s)"
    timeout "$TIMEOUT" "$PYTHON" "stages/$name.py" --device "$DEVICE" --out-root "$WORK" >"$OUT/logs/$name.log" 2>&1
    rc=$?
    echo "    $name: exit $rc after $(( $(date +%s) - t0 )) s"
    tail -n 3 "$OUT/logs/$name.log"
    [ "$rc" -eq 0 ] || status=1
}
run_stage latency
run_stage kv_cache

# ---- lay the results out by device
M="$OUT/metrics/gpu/$SLUG"
P="$OUT/plots/gpu/$SLUG"
mkdir -p "$M" "$P"
for name in latency kv_cache; do
    [ -f "$WORK/metrics/$name.json" ] && cp "$WORK/metrics/$name.json" "$M/$name.json"
    [ -f "$WORK/metrics/env/$name.json" ] && cp "$WORK/metrics/env/$name.json" "$M/env_$name.json"
    [ -d "$WORK/plots/$name" ] && mkdir -p "$P/$name" && cp "$WORK/plots/$name/"* "$P/$name/"
done
rm -rf "$WORK"

if [ "${SKIP_TESTS:-0}" != "1" ]; then
    if "$PYTHON" -c "import pytest" 2>/dev/null; then
        echo "==> pytest -m gpu"
        timeout "$TIMEOUT" "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests/test_benchmark.py tests/test_kv_cache.py \
            >"$OUT/logs/pytest_gpu.log" 2>&1 || status=1
        tail -n 3 "$OUT/logs/pytest_gpu.log"
    else
        echo "==> pytest not installed: GPU tests skipped" | tee "$OUT/logs/pytest_gpu.log"
    fi
fi

{
    echo "device slug: $SLUG"
    echo "status: $status (0 = every step succeeded)"
    find "$OUT/metrics" "$OUT/plots" -type f | sed "s|^$OUT/||" | sort
} | tee "$OUT/SUMMARY.txt"
exit "$status"
