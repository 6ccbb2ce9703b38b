#!/bin/bash
# Stage 3: third-party aarch64 wheels for the emulated CPython 3.11, installed once into $WHEEL_SITE.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"

PKGS=(numpy cffi pluggy pyyaml pytest typer rich platformdirs)
KEY="v1 ${PKGS[*]}"
if is_cached wheels "$KEY" && [[ -d "$WHEEL_SITE/numpy" ]]; then
  echo "cached: $(find "$L/wheels" -name '*.whl' | wc -l) wheels"
  exit 0
fi
PLAT=(--only-binary=:all: --implementation cp --python-version 3.11 --platform manylinux2014_aarch64
  --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64)
rm -rf "$L/wheels" "$WHEEL_SITE"
mkdir -p "$L/wheels"
"$HOST_PY" -m pip download -q --dest "$L/wheels" "${PLAT[@]}" "${PKGS[@]}"
"$HOST_PY" -m pip install -q --no-index --find-links "$L/wheels" --target "$WHEEL_SITE" "${PLAT[@]}" "${PKGS[@]}"
ls "$L/wheels"
mark_cached wheels "$KEY"
