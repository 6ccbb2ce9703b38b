#!/bin/bash
# The aarch64 lane: cross-build the ARM backends and test them in an aarch64 CPython under QEMU user-mode
# emulation. Idempotent; downloads, sysroot and wheels are cached under $A64_LANE_DIR (default
# <repo>/.a64lane). Prints stage timings; exits non-zero on any failure. See tools/a64lane/README.md.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"

check_lane_only
mkdir -p "$L"
T0=$(now)
stage() { # stage TITLE SCRIPT: run one stage script and print its wall time
  local t0
  t0=$(now)
  echo "### $1"
  bash "$A64_TOOLS/$2"
  echo "### [$(elapsed "$t0" "$(now)")s | total $(elapsed "$T0" "$(now)")s] $1"
}

# The cached stages are shared between concurrent runs: build them under a lock.
exec 9>"$L/.lock"
flock 9
stage "1. host toolchain" toolchain.sh
stage "2. QEMU, compiler-rt and the aarch64 CPython sysroot" fetch.sh
stage "3. aarch64 wheels" wheels.sh
stage "3b. host build venv (setuptools, ziglang)" buildenv.sh
flock -u 9

# Everything below is per run, in a private site dir, so concurrent runs do not disturb each other.
SITE=$(mktemp -d "$L/run.XXXXXX")
export SITE
trap 'rm -rf "$SITE" "$SITE".*' EXIT
stage "4. stage the project's packages" stage.sh
stage "5. build the ARM backends through their setup.py (cross)" build.sh
stage "5b. Darwin compile (clang 19, zig clang 22): arm64-apple-macos14" darwin.sh
stage "6. tests under qemu-aarch64" test.sh
echo "a64lane: all stages passed in $(elapsed "$T0" "$(now)")s"
