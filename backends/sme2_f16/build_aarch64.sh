#!/bin/bash
# Cross-build sme2_f16's library for the aarch64 lane (tools/a64lane): CC, A64_RT, EMG_INCLUDE and OUT
# come from the lane; the sources and flags live in ../sme2_common (shared with sme2_f32).
set -euo pipefail
: "${OUT:?set OUT to the package dir receiving _emg_sme2_f16.so}"
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/../sme2_common/build_aarch64.sh" 1 "$OUT/_emg_sme2_f16.so"
echo "built $OUT/_emg_sme2_f16.so"
