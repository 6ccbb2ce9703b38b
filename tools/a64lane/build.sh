#!/bin/bash
# Stage 5: build every ARM backend the way users do, through its setup.py (pip wheel), cross-compiled for
# aarch64 Linux: _PYTHON_HOST_PLATFORM makes sysconfig (and so the setup.py files) target linux-aarch64,
# CC/LDSHARED are clang-19 for that target with the aarch64 compiler-rt (the SME ABI routines).
# EEMICROGPT_STRICT_BUILD=1 turns every "not built" warning of the build into a failure and requires
# llvm-objdump for the object check. Each wheel is unpacked into $SITE like an install.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"
: "${SITE:?SITE must name the site dir of this run}"
check_lane_only

src=$SITE.build
rm -rf "$src"
mkdir -p "$src/eemicrogpt_core"
tar -C "$REPO" --exclude=build --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.so' \
  --exclude=.pytest_cache -cf - backends eemicrogpt_core/include eemicrogpt_core/_version.py | tar -x -C "$src"

export _PYTHON_HOST_PLATFORM=linux-aarch64 SETUPTOOLS_EXT_SUFFIX=.cpython-311-aarch64-linux-gnu.so
export EEMICROGPT_STRICT_BUILD=1 LLVM_OBJDUMP=llvm-objdump-19
export CC="clang-19 --target=aarch64-linux-gnu"
export LDSHARED="clang-19 --target=aarch64-linux-gnu -fuse-ld=lld -shared -resource-dir=$RT_DIR"
for dir in $(lane_backends); do
  name=$(basename "$dir")
  pkg=$(backend_package "$dir")
  echo "-- $name -> $pkg"
  log=$src/$name.log
  if ! "$BUILD_PY" -m pip wheel -v --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$src/wheels/$name" "$src/backends/$name" >"$log" 2>&1; then
    grep -v '^ *$' "$log" | tail -40
    die "$name: pip wheel through its setup.py failed"
  fi
  grep -E '^ *(warning|error)\b|object check' "$log" | grep -v byte-compiling || true
  wheel=$(find "$src/wheels/$name" -name '*.whl' | head -1)
  [[ "$wheel" == *linux_aarch64.whl ]] || die "$name: expected a linux_aarch64 wheel, got ${wheel:-none}"
  "$BUILD_PY" -m zipfile -e "$wheel" "$SITE"
  lib=$(find "$SITE/$pkg" -maxdepth 1 -name '*.so' | head -1)
  [[ -n "$lib" ]] || die "$name: the wheel holds no library in $pkg"
  echo "built $(basename "$wheel"): $pkg/$(basename "$lib")"
done
rm -rf "$src"
