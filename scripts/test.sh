#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: set-up, lint, type check, the native tests, the sanitizer
# run of the x86 backend, the third-party example backend, and the aarch64 lane (Neon and SME2 under QEMU
# user-mode emulation). Set EEMICROGPT_SKIP_A64LANE=1 to leave the (slower) lane out of a local run.
# The names file: $EEMICROGPT_DATA, else ../shared/data/names.txt beside the checkout, else the verified
# download cache; without any, the first test that needs it fails with one line saying how to provide it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
section() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

section "ruff"
ruff check .

section "mypy (the core and the Python API; strictness in pyproject.toml [tool.mypy])"
mypy

section "example third-party backends (C built against eemicrogpt.h alone; Python)"
python -m pip install -q --disable-pip-version-check ./examples/minimal_native_backend ./examples/minimal_python_backend

section "pytest: core, numpy_ref, the native backends this CPU runs, the example backends"
# Every backend this CPU can run must run: the kit fails (not skips) a required backend that is unavailable.
EEMICROGPT_REQUIRE_BACKENDS=$(python scripts/required_backends.py)
export EEMICROGPT_REQUIRE_BACKENDS
echo "backends required on this CPU: $EEMICROGPT_REQUIRE_BACKENDS"
# The optional modules setup.sh installs: a test needing one fails, not skips, when it cannot be imported.
export EEMICROGPT_REQUIRE_EXTRAS=torch,safetensors,tensorboard,wandb,onnx,onnxruntime
pytest -q --durations=15 tests backends/*/tests examples/*/tests

section "wheels: core and every backend built, installed from the wheelhouse alone into a clean venv, CLI run"
bash scripts/wheels.sh

section "x86 backend under AddressSanitizer + UndefinedBehaviorSanitizer"
PYTHON=python bash backends/x86/tests/run_sanitized.sh

if [ "${EEMICROGPT_SKIP_A64LANE:-0}" = 1 ]; then
  section "aarch64 lane skipped (EEMICROGPT_SKIP_A64LANE=1)"
else
  section "aarch64 lane: neon, sme2_f32, sme2_f16 under qemu-aarch64"
  bash tools/a64lane/run.sh
fi
section "all test stages passed"
