#!/usr/bin/env bash
# Set up the environment and run the whole pipeline (dvc repro), then gate the
# results against the committed reference and the published claims.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
source .venv/bin/activate
dvc repro "$@"
attnrepro check
