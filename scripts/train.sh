#!/usr/bin/env bash
# The main job: set up (see setup.sh), then train on the default config with the fastest backend here.
# Extra arguments go to `eemicrogpt train` (e.g. --backend numpy_ref, --config configs/d64.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/eemicrogpt train "$@"
