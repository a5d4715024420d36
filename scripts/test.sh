#!/usr/bin/env bash
# Set up the environment and run the test suite (unit tests + an end-to-end
# `dvc repro` on a tiny configuration). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source .venv/bin/activate
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "error: pytest collected no tests; that is a failure here" >&2
    exit 1
fi
exit "$rc"
