#!/bin/bash
# Stage 6: for each backends/<dir>/a64lane.conf, under each QEMU_CPU it lists: the registry check, the
# backend's pytest suite and its end-to-end train command, all in the emulated aarch64 CPython.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"
: "${SITE:?SITE must name the site dir of this run}"

cd "$REPO" # relative paths in a64lane.conf (e.g. --config configs/d64.yaml) are relative to the repo root
NAMES=${EEMICROGPT_DATA:-$REPO/../shared/data/names.txt}
[[ -f "$NAMES" ]] || die "names file $NAMES not found (set EEMICROGPT_DATA)"
export EEMICROGPT_DATA=$NAMES
export QEMU_LD_PREFIX=$SR PYTHONPATH=$SITE:$WHEEL_SITE PYTHONDONTWRITEBYTECODE=1
export A64LANE=1 # tests may shorten long runs under emulation (documented in README.md)
# -P: never put the working directory on sys.path, so only the staged packages are imported.
PY=("$QEMU" "$PY_A64" -P)
failures=()

timed() { # timed LABEL CMD...: run, print the wall time, record a failure instead of stopping
  local t0 rc=0
  t0=$(now)
  echo "   \$ ${*:2}" | sed "s|$REPO/||g; s|$L/||g"
  "${@:2}" || rc=$?
  echo "   [$1: $(elapsed "$t0" "$(now)")s, exit $rc]"
  ((rc == 0)) || failures+=("$1")
}

run_train() { # run_train LABEL ARGS...: the CLI must exit 0 and print sampled names
  local out=$SITE.train log rc=0
  log=$(mktemp)
  rm -rf "$out"
  "${PY[@]}" -c 'import sys; from eemicrogpt_core.cli import app; sys.argv[0] = "eemicrogpt"; app()' \
    train --data "$NAMES" --out "$out" "${@:2}" >"$log" 2>&1 || rc=$?
  sed 's/^/      /' "$log"
  if ((rc == 0)) && ! grep -q '^samples: .' "$log"; then
    echo "      (no 'samples:' line in the output)"
    rc=1
  fi
  rm -rf "$out" "$log"
  return "$rc"
}

for dir in $(lane_backends); do
  conf=$dir/a64lane.conf
  name=$(basename "$dir")
  [[ -f "$conf" ]] || die "$name has build_aarch64.sh but no a64lane.conf"
  train_args=()
  mapfile -t train_lines < <(sed -n 's/^train[[:space:]]\+//p' "$conf")
  while read -r kind cpu opts; do
    [[ "$kind" == cpu ]] || continue
    require="" unavailable="" tests=yes train=""
    for opt in $opts; do
      case "$opt" in
        require=*) require=${opt#require=} ;;
        unavailable=*) unavailable=${opt#unavailable=} ;;
        tests=yes | tests=no) tests=${opt#tests=} ;;
        train=yes | train=no) train=${opt#train=} ;;
        *) die "$conf: unknown option '$opt' on 'cpu $cpu'" ;;
      esac
    done
    [[ -n "$train" ]] || { [[ -n "$require" ]] && train=yes || train=no; }
    echo "== $name, QEMU_CPU=$cpu (require: ${require:--}; unavailable: ${unavailable:--})"
    export QEMU_CPU=$cpu EEMICROGPT_REQUIRE_BACKENDS=$require
    # With SME but sve=off, numpy's OpenBLAS would pick SME kernels and fault: force a Neon core type.
    if [[ "$cpu" == *sve=off* ]]; then export OPENBLAS_CORETYPE=NEOVERSEN1; else unset OPENBLAS_CORETYPE; fi
    timed "$name/$cpu/registry" "${PY[@]}" "$A64_TOOLS/check_backends.py" --require "$require" \
      --unavailable "$unavailable"
    if [[ "$tests" == yes ]]; then
      timed "$name/$cpu/pytest" "${PY[@]}" -m pytest -q -p no:cacheprovider -rs "$dir/tests"
    fi
    if [[ "$train" == yes ]]; then
      for line in "${train_lines[@]}"; do
        read -r -a train_args <<<"$line"
        timed "$name/$cpu/train" run_train "$name" "${train_args[@]}"
      done
    fi
  done <"$conf"
done
if ((${#failures[@]})); then
  echo "a64lane: FAILED: ${failures[*]}" >&2
  exit 1
fi
