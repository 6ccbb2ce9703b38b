#!/usr/bin/env bash
# The main job: set up (see setup.sh), then train on the default config with the fastest backend here.
# Extra arguments go to `eemicrogpt train` (e.g. --backend numpy_ref, --config d64; `eemicrogpt configs` lists the configs).
# The names file: $EEMICROGPT_DATA if set, else the shared copy beside a checkout (../shared/data/names.txt)
# if there is one, else eemicrogpt downloads makemore's names.txt once and verifies its sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
shared_names=../shared/data/names.txt
if [ -z "${EEMICROGPT_DATA:-}" ] && [ -f "$shared_names" ]; then
  EEMICROGPT_DATA=$(realpath "$shared_names")
  export EEMICROGPT_DATA
  echo "using the names file at $EEMICROGPT_DATA"
fi
exec .venv/bin/eemicrogpt train "$@"
