#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for eemicrogpt: system build tools, a venv in .venv, the core and every
# backend that builds here (ARM backends install as pure Python on x86 and report themselves unavailable).
# Idempotent: re-running only reinstalls the project's own packages.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v gcc >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "== installing system packages (gcc, python3-venv)"
  apt-get update -q && apt-get install -y -q --no-install-recommends build-essential python3-venv
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip setuptools wheel
echo "== installing eemicrogpt (core) and backends"
# plot and ray are optional extras for users; the tests exercise both (Ray against a real local cluster).
"${PIP[@]}" -e ".[test,plot,ray]"
# One pip call: some backends depend on others (sme2_f16 on sme2_f32), so pip must see them together.
backends=()
for backend in backends/*/; do
  [ -f "$backend/pyproject.toml" ] && backends+=("./$backend")
done
"${PIP[@]}" "${backends[@]}"
.venv/bin/eemicrogpt backends
