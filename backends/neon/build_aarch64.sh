#!/bin/bash
# Cross-build the Neon kernels library for the aarch64 lane (tools/a64lane). Inputs from the environment:
#   CC           C compiler for aarch64 Linux, e.g. "clang-19 --target=aarch64-linux-gnu -fuse-ld=lld"
#   EMG_INCLUDE  directory holding eemicrogpt.h
#   OUT          directory receiving _neon_kernels.so (the package dir, where plugin.py looks for it)
#   A64_RT       compiler-rt builtins archive (unused here: Neon code needs no runtime helpers)
set -euo pipefail
: "${CC:?set CC to an aarch64 C compiler}" "${EMG_INCLUDE:?set EMG_INCLUDE}" "${OUT:?set OUT}"
here=$(cd "$(dirname "$0")" && pwd)
read -r -a cc <<<"$CC"
mkdir -p "$OUT"
# The same flags setup.py uses on Linux aarch64, plus -Wl,-z,defs so that a missing symbol fails here.
"${cc[@]}" -std=c11 -O3 -march=armv8.2-a+fp16 -fPIC -shared -Wall -Wextra -Werror -Wl,-z,defs \
  -I"$EMG_INCLUDE" "$here"/csrc/*.c -lm -o "$OUT/_neon_kernels.so"
echo "built $OUT/_neon_kernels.so"
