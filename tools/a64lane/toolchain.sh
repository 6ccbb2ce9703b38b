#!/bin/bash
# Stage 1: the host toolchain (bookworm packages; installed only when missing). llvm-19 brings
# llvm-objdump-19, which the sme2 build uses to check that no SVE/SME instruction leaks into plain code.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"

need=()
for p in clang-19 lld-19 llvm-19 libc6-dev-arm64-cross ca-certificates; do
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
clang-19 --version | head -1
