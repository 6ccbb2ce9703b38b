#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: set-up, lint, the native tests, the sanitizer run of the
# x86 backend, the third-party example backend, and the aarch64 lane (Neon and SME2 under QEMU user-mode
# emulation). Set EEMICROGPT_SKIP_A64LANE=1 to leave the (slower) lane out of a local run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
section() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

section "ruff"
ruff check .

section "example third-party backends (C built against eemicrogpt.h alone; Python)"
python -m pip install -q --disable-pip-version-check ./examples/minimal_native_backend ./examples/minimal_python_backend

section "pytest: core, numpy_ref, the native backends this CPU runs, the example backend"
# x86 backends must not be skipped on this machine: a missing one fails.
EEMICROGPT_REQUIRE_BACKENDS=numpy_ref,avx512,avx2,example_c,example_py \
  pytest -q tests backends/*/tests examples/*/tests

section "x86 backend under AddressSanitizer + UndefinedBehaviorSanitizer"
PYTHON=python bash backends/x86/tests/run_sanitized.sh

if [ "${EEMICROGPT_SKIP_A64LANE:-0}" = 1 ]; then
  section "aarch64 lane skipped (EEMICROGPT_SKIP_A64LANE=1)"
else
  section "aarch64 lane: neon, sme2_f32, sme2_f16 under qemu-aarch64"
  bash tools/a64lane/run.sh
fi
section "all test stages passed"
