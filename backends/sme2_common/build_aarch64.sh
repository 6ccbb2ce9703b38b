#!/bin/bash
# Cross-build one SME2 backend library from the shared sources (called by each backend's
# build_aarch64.sh). Usage: build_aarch64.sh <0|1 = EMG_SME_F16> <output .so path>
# Environment (the a64lane contract): CC (clang-19 --target=aarch64-linux-gnu -fuse-ld=lld),
# A64_RT (libclang_rt.builtins-aarch64.a: the SME ABI routines), EMG_INCLUDE (eemicrogpt.h's dir).
set -euo pipefail
f16=${1:?usage: build_aarch64.sh <0|1> <out.so>}
out=${2:?usage: build_aarch64.sh <0|1> <out.so>}
: "${CC:?set CC}" "${A64_RT:?set A64_RT}" "${EMG_INCLUDE:?set EMG_INCLUDE}"
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
# Not armv9-a: that lets clang auto-vectorise ordinary code with SVE, which Apple M4 lacks outside
# streaming mode. Only sme2_gemm.c gets the SME extensions; the probe gets none.
arch=-march=armv8.7-a
sme=$arch+sme2
[ "$f16" = 1 ] && sme=$sme+sme-f16f16
common=(-O3 -fPIC -fvisibility=hidden -std=c11 -Wall -Wextra -Werror -Wno-unused-command-line-argument -DEMG_SME_F16="$f16" -I"$EMG_INCLUDE")
$CC "${common[@]}" "$sme" -c "$src/sme2_gemm.c" -o "$obj/gemm.o"
$CC "${common[@]}" "$arch" -c "$src/sme2_step.c" -o "$obj/step.o"
$CC "${common[@]}" -O2 -march=armv8-a -c "$src/sme2_cpu.c" -o "$obj/cpu.o"
# The step and the probe must stay free of SVE/SME instructions (they run outside streaming mode, and
# the probe on CPUs without SME): check the objects rather than trust the flags.
objdump=$(command -v llvm-objdump-19 || command -v llvm-objdump || true)
if [ -n "$objdump" ]; then
  for o in step cpu; do
    if "$objdump" -d --mattr=+sve2,+sme2 "$obj/$o.o" | grep -Eq '[[:space:]]z[0-9]+\.|smstart|smstop|rdsvl|ptrue'; then
      echo "error: SVE/SME instructions in sme2_$o.c's object" >&2
      exit 1
    fi
  done
else
  echo "note: llvm-objdump not found; the no-SVE check of sme2_step.o/sme2_cpu.o was not run" >&2
fi
mkdir -p "$(dirname "$out")"
$CC -shared -Wl,-z,defs -Wl,--exclude-libs,ALL "$obj/gemm.o" "$obj/step.o" "$obj/cpu.o" "$A64_RT" -lm \
  -o "$out"
