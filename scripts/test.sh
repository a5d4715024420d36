#!/usr/bin/env bash
# Set up the environment and run the test suite (unit tests + an end-to-end
# `dvc repro` on a tiny configuration) on every core (pytest-xdist; ATTNREPRO_TEST_WORKERS=N
# for N workers, 0 for none), a test file to a worker: a module's fixture (the sweeps' trained repository)
# is built once, not again each time a worker comes back to its file. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source .venv/bin/activate
set +e
python -m pytest -n "${ATTNREPRO_TEST_WORKERS:-auto}" --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "error: pytest collected no tests; that is a failure here" >&2
    exit 1
fi
exit "$rc"
