#!/bin/bash
# Stage 3b: the host build environment: a venv ($BUILD_VENV) with the setuptools the project's pyproject
# files require (the host's may be older) and ziglang (zig's clang 22 with macOS headers, for the Darwin
# compile stage). The ARM backends are built through their own setup.py with it, as users build them.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"

PKGS=("setuptools>=77" wheel "ziglang==0.17.1")
KEY="v1 ${PKGS[*]}"
if is_cached buildenv "$KEY" && [[ -x "$BUILD_PY" ]]; then
  echo "cached: $("$BUILD_PY" -m pip list --format=freeze 2>/dev/null | grep -Ei '^(setuptools|ziglang)=' | tr '\n' ' ')"
  exit 0
fi
rm -rf "$BUILD_VENV"
"$HOST_PY" -m venv "$BUILD_VENV"
"$BUILD_PY" -m pip install -q --disable-pip-version-check "${PKGS[@]}" 2>&1 | grep -v 'pypi-more\|/opt/pypi' || true
"$BUILD_PY" -c 'import setuptools, ziglang; print("setuptools", setuptools.__version__)'
"$BUILD_PY" -m ziglang version
mark_cached buildenv "$KEY"
