#!/usr/bin/env bash
# Build AddressSanitizer + UndefinedBehaviorSanitizer copies of the x86 libraries into a temporary
# directory and run the x86 tests (conformance kit included) against them. Any sanitizer report aborts
# the process, so pytest dies and this script exits non-zero.
#   usage: backends/x86/tests/run_sanitized.sh [extra pytest args, e.g. -k d16]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python}
include=${EEMICROGPT_INCLUDE:-$("$python" -c 'import eemicrogpt_core; print(eemicrogpt_core.get_include())')}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# -O3 as in the release build, so the numerics are the release's: an -O1 build rounds differently in places
# (mul+add contraction) and once drifted past the kit's trajectory bound after a ReLU flip (avx2, d32).
# -g1: line tables are all a report's stack needs; full -g made gcc track variables twice per kernel (its size
# limit) and took 3.0 GB per library instead of 1.6 (avx512 on AMD Zen 5, gcc 12: 657 s against 690 s).
# ASan's checks as calls (--param=asan-instrumentation-with-call-threshold=0) built in 385 s but ran the tests
# 3x slower: no gain overall.
# EMG_X86_FEW_WIDTHS: four of the sixteen per-width specialisations (16, 48, 64, 256; step.c says why),
# every other width through the run-time-width step, the same step_impl.h source: the instrumented build
# took about 30 minutes of a loaded 2-core machine with all sixteen; without instrumentation the four
# compile step.c in 28 s where the sixteen took about 60 s (avx512, the same loaded machine).
san=(-O3 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -DEMG_X86_FEW_WIDTHS)
common=(-std=gnu11 -fPIC -shared -fno-math-errno -fvisibility=hidden -I"$include" -I"$here/csrc")
kernels=("$here/csrc/step.c" "$here/csrc/step_wide.c" "$here/csrc/session.c" "$here/csrc/threads.c" "$here/csrc/pool.c" "$here/csrc/peak.c")
# Only the variants this CPU runs: the tests skip the others, so their instrumented builds (minutes of
# compiler time each) would test nothing.
declare -A flags=(
    [avx512]="-mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma"
    [avx512_bf16]="-mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma -mavx512bf16 -DEMG_BF16"
    [avx2]="-mavx2 -mfma"
    [amx_bf16]="-mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma -mavx512bf16 -mamx-tile -mamx-bf16 -DEMG_BF16 -DEMG_AMX"
)
echo "building sanitized libraries in $out"
builds=()
for variant in avx512 avx512_bf16 avx2 amx_bf16; do
    lacks=$("$python" -c 'import sys; from eemicrogpt_backend_x86.probe import cpu_lacks
print(cpu_lacks(sys.argv[1]) or "")' "$variant")
    if [ -n "$lacks" ]; then
        echo "  $variant: not built ($lacks)"
        continue
    fi
    echo "  $variant"
    # shellcheck disable=SC2086  # the flags are words
    gcc "${san[@]}" "${common[@]}" ${flags[$variant]} "${kernels[@]}" -o "$out/_emg_$variant.so" -lm -lpthread &
    builds+=($!)
done
gcc "${san[@]}" "${common[@]}" "$here/csrc/probe.c" -o "$out/_emg_probe.so"
for build in "${builds[@]}"; do wait "$build"; done

export EEMICROGPT_X86_LIB_DIR="$out"
# Python itself leaks by design: leak checking off; everything else fatal. Reports go to files because
# pytest captures (and on abort loses) the test process's stderr; they are printed below.
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:log_path=$out/asan
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$out/ubsan
status=0
# The trajectory checks are left out: they run the same calls as the one-step checks for tens of steps more,
# which adds numerics (checked by the release build's run) and no code path.
LD_PRELOAD=$(gcc -print-file-name=libasan.so) "$python" -m pytest -q -p no:cacheprovider --durations=10 \
    -k "not trajectory and not training_follows" "$here/tests" "$@" \
    || status=$?
if compgen -G "$out/asan.*" > /dev/null || compgen -G "$out/ubsan.*" > /dev/null; then
    echo "sanitizer reports:" >&2
    for report in "$out"/asan.* "$out"/ubsan.*; do [ -e "$report" ] && cat "$report" >&2; done
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
