#!/bin/bash
# Stage 1: the host toolchain (bookworm packages; installed only when missing), then proof that it works.
# llvm-objdump-19 (llvm-19) lets the sme2 build check that no SVE/SME instruction leaks into plain code.
# clang finds the aarch64 libc headers, crt files and libgcc only through a GCC cross installation:
# without libgcc-12-dev-arm64-cross it silently falls back to the host's /usr/include.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"

need=()
for p in clang-19 lld-19 llvm-19 libc6-dev-arm64-cross libgcc-12-dev-arm64-cross ca-certificates; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
"$HOST_PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' ||
  die "HOST_PY=$HOST_PY must be CPython 3.11 (its compileall output is reused by the emulated 3.11)"
"$HOST_PY" -m pip --version >/dev/null || die "$HOST_PY has no pip"
# stage.sh installs the project's packages without build isolation: the host's setuptools must read
# their PEP 639 license metadata.
"$HOST_PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' ||
  die "$HOST_PY needs setuptools >= 77 (run the lane from the project's .venv, or: $HOST_PY -m pip install 'setuptools>=77')"

# Compile and link a one-line aarch64 program that includes a libc header, so a missing piece fails here,
# named, instead of deep inside a backend build.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <string.h>\nint main(void) { return (int)strlen(""); }\n' >"$probe/t.c"
if ! clang-19 --target=aarch64-linux-gnu -c "$probe/t.c" -o "$probe/t.o" 2>"$probe/err"; then
  cat "$probe/err" >&2
  die "clang-19 cannot compile for aarch64-linux-gnu: the aarch64 libc headers are not found (install libc6-dev-arm64-cross and libgcc-12-dev-arm64-cross)"
fi
if ! clang-19 --target=aarch64-linux-gnu -fuse-ld=lld "$probe/t.o" -o "$probe/t" 2>"$probe/err"; then
  cat "$probe/err" >&2
  die "clang-19 cannot link for aarch64-linux-gnu: crt files or libgcc missing (install libgcc-12-dev-arm64-cross and lld-19)"
fi
echo "$(clang-19 --version | head -1): aarch64-linux-gnu compile and link OK"
