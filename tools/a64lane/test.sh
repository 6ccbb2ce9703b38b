#!/bin/bash
# Stage 6: for each backends/<dir>/a64lane.conf, under each QEMU_CPU it lists (one "pass"): the registry
# check, the backend's pytest suite and its end-to-end train command, all in the emulated aarch64 CPython.
# Passes run concurrently, A64_JOBS at a time (default: the number of CPUs), the costliest first (a pass's
# cost= option: its measured seconds; none counts 0), so no long pass starts last while the other job idles;
# each pass's output is collected in a log and printed whole, in conf order, once it is done.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"
: "${SITE:?SITE must name the site dir of this run}"

cd "$REPO" # relative paths in a64lane.conf (e.g. --config d64) are relative to the repo root
NAMES=${EEMICROGPT_DATA:-$REPO/../shared/data/names.txt}
[[ -f "$NAMES" ]] || die "names file $NAMES not found (set EEMICROGPT_DATA)"
export EEMICROGPT_DATA=$NAMES
export QEMU_LD_PREFIX=$SR PYTHONPATH=$SITE:$WHEEL_SITE PYTHONDONTWRITEBYTECODE=1
export A64LANE=1 # tests may shorten long runs under emulation (documented in README.md)
JOBS=${A64_JOBS:-$(nproc)}
# -P: never put the working directory on sys.path, so only the staged packages are imported.
PY=("$QEMU" "$PY_A64" -P)

timed() { # timed LABEL CMD...: run, print the wall time; a failure is printed and returned, not fatal
  local t0 rc=0
  t0=$(now)
  echo "   \$ ${*:2}" | sed "s|$REPO/||g; s|$L/||g"
  "${@:2}" || rc=$?
  echo "   [$1: $(elapsed "$t0" "$(now)")s, exit $rc]"
  ((rc == 0)) || echo "   FAILED: $1"
  return "$rc"
}

run_train() { # run_train OUTDIR ARGS...: the CLI must exit 0 and print sampled names
  local out=$1 log rc=0
  log=$out.log
  rm -rf "$out"
  "${PY[@]}" -c 'import sys; from eemicrogpt_core.interface.cli import app; sys.argv[0] = "eemicrogpt"; app()' \
    train --data "$NAMES" --out "$out" "${@:2}" >"$log" 2>&1 || rc=$?
  sed 's/^/      /' "$log"
  if ((rc == 0)) && ! grep -q '^samples: .' "$log"; then
    echo "      (no 'samples:' line in the output)"
    rc=1
  fi
  rm -rf "$out" "$log"
  return "$rc"
}

run_pass() { # run_pass ID DIR CPU OPTS: one emulated CPU of one backend; non-zero if any step failed
  local id=$1 dir=$2 cpu=$3 opts=$4 name require="" unavailable="" tests=yes select="" train="" rc=0 line
  local -a train_args select_args=()
  name=$(basename "$dir")
  for opt in $opts; do
    case "$opt" in
      require=*) require=${opt#require=} ;;
      unavailable=*) unavailable=${opt#unavailable=} ;;
      tests=yes | tests=no) tests=${opt#tests=} ;;
      select=*) select=${opt#select=} ;;
      train=yes | train=no) train=${opt#train=} ;;
      cost=*) ;; # read (and checked) when the passes are collected
      *) echo "   FAILED: $dir/a64lane.conf: unknown option '$opt' on 'cpu $cpu'"; return 1 ;;
    esac
  done
  [[ -n "$train" ]] || { [[ -n "$require" ]] && train=yes || train=no; }
  echo "== $name, QEMU_CPU=$cpu (require: ${require:--}; unavailable: ${unavailable:--})"
  export QEMU_CPU=$cpu EEMICROGPT_REQUIRE_BACKENDS=$require
  # With SME but sve=off, numpy's OpenBLAS would pick SME kernels and fault: force a Neon core type.
  if [[ "$cpu" == *sve=off* ]]; then export OPENBLAS_CORETYPE=NEOVERSEN1; else unset OPENBLAS_CORETYPE; fi
  timed "$name/$cpu/registry" "${PY[@]}" "$A64_TOOLS/check_backends.py" --require "$require" \
    --unavailable "$unavailable" || rc=1
  [[ -n "$select" ]] && select_args=(-k "${select//,/ or }")
  if [[ "$tests" == yes ]]; then
    timed "$name/$cpu/pytest" "${PY[@]}" -m pytest -q -p no:cacheprovider -rs --durations=12 "${select_args[@]}" "$dir/tests" || rc=1
  fi
  if [[ "$train" == yes ]]; then
    while read -r line; do
      read -r -a train_args <<<"$line"
      timed "$name/$cpu/train" run_train "$SITE.train$id" "${train_args[@]}" || rc=1
    done < <(sed -n 's/^train[[:space:]]\+//p' "$dir/a64lane.conf")
  fi
  return "$rc"
}

# Collect the passes: "<dir> <cpu> <options>" per cpu line of every conf, and each one's cost (0 without).
passes=() costs=()
for dir in $(lane_backends); do
  while read -r kind cpu opts; do
    [[ "$kind" == cpu ]] || continue
    cost=0
    for opt in ${opts:-}; do
      [[ "$opt" == cost=* ]] || continue
      cost=${opt#cost=}
      [[ "$cost" =~ ^[0-9]+$ ]] || die "$dir/a64lane.conf: cost must be whole seconds, got '$opt' on 'cpu $cpu'"
    done
    passes+=("$dir"$'\t'"$cpu"$'\t'"${opts:-}")
    costs+=("$cost")
  done <"$dir/a64lane.conf"
done
((${#passes[@]})) || die "no a64lane.conf lists a cpu"

# Pass indices by falling cost (stable: conf order among equals).
mapfile -t order < <(for i in "${!passes[@]}"; do echo "${costs[$i]} $i"; done | sort -s -k1,1nr | cut -d' ' -f2)

echo "${#passes[@]} passes, $JOBS at a time, the costliest first"
for i in "${order[@]}"; do
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
  IFS=$'\t' read -r dir cpu opts <<<"${passes[$i]}"
  (
    rc=0
    run_pass "$i" "$dir" "$cpu" "$opts" || rc=$?
    echo "$rc" >"$SITE.pass$i.rc"
  ) >"$SITE.pass$i.log" 2>&1 &
done
wait

failed=0
for i in "${!passes[@]}"; do
  cat "$SITE.pass$i.log"
  [[ "$(cat "$SITE.pass$i.rc" 2>/dev/null)" == 0 ]] || failed=1
done

# The ARM speed proxy (benchmarks/a64_insn_count.py) on its tiny case with this run's neon build, so a change
# that breaks the counter fails here; host Python, only the standard library (the staged site is aarch64's).
if lane_backends | grep -q '/neon$'; then
  echo "== benchmarks/a64_insn_count.py --smoke"
  timed "a64_insn_count/smoke" env -u PYTHONPATH A64_LANE_DIR="$L" "$HOST_PY" "$REPO/benchmarks/a64_insn_count.py" \
    --smoke --site "$SITE" || failed=1
fi
if ((failed)); then
  echo "a64lane: FAILED: $(grep -h '^   FAILED: ' "$SITE".pass*.log | sed 's/^   FAILED: //' | tr '\n' ' ')" >&2
  exit 1
fi
