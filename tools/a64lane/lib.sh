# shellcheck shell=bash
# Paths and helpers shared by the a64lane stage scripts. Sourced, never run on its own.

A64_TOOLS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${REPO:-$(cd "$A64_TOOLS/../.." && pwd)}
L=${A64_LANE_DIR:-$REPO/.a64lane}          # cache: downloads, sysroot, wheels (safe to delete)
SR=$L/sysroot                              # aarch64 runtime sysroot (QEMU_LD_PREFIX)
QEMU=$L/qemu/usr/bin/qemu-aarch64          # static QEMU 11 user-mode binary
WHEEL_SITE=$L/site-wheels                  # third-party aarch64 wheels, installed once
PY_A64=$SR/usr/bin/python3.11              # started by its sysroot path so sys.prefix is right
HOST_PY=${HOST_PY:-python3}                # must be CPython 3.11 (same .pyc magic as the sysroot's)
BUILD_VENV=$L/buildenv                     # host venv: the setuptools the pyprojects need, ziglang
BUILD_PY=$BUILD_VENV/bin/python
RT_DIR=$L/rt/usr/lib/llvm-19/lib/clang/19  # clang resource dir holding the aarch64 compiler-rt builtins
RT=$RT_DIR/lib/linux/libclang_rt.builtins-aarch64.a
export REPO L SR QEMU RT RT_DIR WHEEL_SITE PY_A64 HOST_PY BUILD_VENV BUILD_PY

die() { echo "a64lane: error: $*" >&2; exit 1; }

# A stage is cached when $L/stamps/<name> holds exactly the key it was built with.
is_cached() { [[ -f "$L/stamps/$1" && "$(cat "$L/stamps/$1")" == "$2" ]]; }
mark_cached() { mkdir -p "$L/stamps"; printf '%s' "$2" >"$L/stamps/$1"; }

# Seconds since the epoch with nanoseconds, for stage timings.
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# The ARM backends the lane handles: Python packages (pyproject.toml or setup.py) in backends/*/ holding a
# an a64lane.conf. Other directories (shared sources, arm_common) are used by the packages' setup.py.
# A64_LANE_ONLY (a comma list of those directory names, e.g. `neon`) restricts the build, Darwin and test
# stages to them; unset or empty means all.
lane_backends() {
  local dir
  for dir in "$REPO"/backends/*/; do
    dir=${dir%/}
    [[ -f "$dir/pyproject.toml" || -f "$dir/setup.py" ]] || continue
    [[ -f "$dir/a64lane.conf" ]] || continue
    [[ -z "${A64_LANE_ONLY:-}" || ",$A64_LANE_ONLY," == *",$(basename "$dir"),"* ]] && echo "$dir"
  done
  return 0
}

# Every name in A64_LANE_ONLY must be a lane backend (a typo would silently test nothing).
check_lane_only() {
  local name only=${A64_LANE_ONLY:-}
  for name in ${only//,/ }; do
    [[ -f "$REPO/backends/$name/a64lane.conf" ]] || die "A64_LANE_ONLY: backends/$name has no a64lane.conf"
  done
}

# The Python package directory name of a backend: the one holding plugin.py.
backend_package() {
  local plugin
  plugin=$(find "$1" -mindepth 2 -maxdepth 2 -name plugin.py -not -path '*/build/*' | head -1)
  [[ -n "$plugin" ]] || die "$1 has no <package>/plugin.py"
  basename "$(dirname "$plugin")"
}
