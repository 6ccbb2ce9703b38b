#!/usr/bin/env bash
# Packages as users install them. Builds an sdist of the core and of every backend and example backend,
# then its wheel from that sdist alone (`python -m build`: a distribution reaching outside its own directory
# fails here) into a wheelhouse, adds the third-party runtime dependencies, then installs
# from that wheelhouse ALONE (`--no-index`: no index, and no other find-links, can supply a package) into a
# clean virtualenv and runs the CLI from outside the checkout: --version, backends, a short train on real
# names, sample. Checks on the way: a backend installed alone pulls the core from the wheelhouse, at the
# version it pins; ARM backends built here are pure-Python wheels; the x86 wheel carries its libraries.
#
# Usage: bash scripts/wheels.sh      (PYTHON: the interpreter with `build`, default python; KEEP=1 keeps
# the work directory). The names file: $EEMICROGPT_DATA, else ../shared/data/names.txt from the repo root.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/eemicrogpt-wheels.XXXXXX")
[ "${KEEP:-0}" = 1 ] && echo "work directory: $WORK" || trap 'rm -rf "$WORK"' EXIT
HOUSE=$WORK/wheelhouse
SDISTS=$WORK/sdists
fail() { echo "wheels.sh: $*" >&2; exit 1; }
DATA=${EEMICROGPT_DATA:-$REPO/../shared/data/names.txt}
[ -f "$DATA" ] || fail "no names file at $DATA: set EEMICROGPT_DATA"
DATA=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")

echo "== building sdists into $SDISTS, and each wheel from its sdist into $HOUSE"
# A wheel setup.sh built from the same sdist content is reused (wheel_cache.sh); without a .venv in the
# checkout every wheel is built here.
if [ -d "$REPO/.venv" ]; then WHEEL_CACHE=${WHEEL_CACHE:-$REPO/.venv/wheel-cache}; else WHEEL_CACHE=$WORK/cache; fi
# shellcheck source=scripts/wheel_cache.sh
source "$REPO/scripts/wheel_cache.sh"
projects=(.)
for dir in backends/*/ examples/*/; do
  [ -f "$dir/pyproject.toml" ] && projects+=("${dir%/}")
done
mkdir -p "$HOUSE" "$SDISTS"
for project in "${projects[@]}"; do
  # Isolated builds (setuptools from the index); in-tree build/ and *.egg-info are git-ignored leftovers.
  # pip unpacks the sdist elsewhere and builds the wheel from that alone.
  # The example backends are third-party style: they build against the core's headers, named the way their
  # READMEs tell a third party to (an isolated build has no core installed to ask). Ours ship copies.
  (
    [[ $project == examples/* ]] && export EEMICROGPT_INCLUDE="$REPO/eemicrogpt_core/include"
    sdist_and_wheel "$project" "$SDISTS" "$HOUSE" >/dev/null
  ) || fail "building $project (its sdist, then the wheel from it) failed"
done
ls "$SDISTS" "$HOUSE"

echo "== checking the backends' sdists carry their shared files (backends/share.py copies them into _build/)"
for dir in backends/*/; do
  [ -f "$dir/setup.py" ] || continue
  dist=$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/pyproject.toml" | tr - _)
  sdist=$(ls "$SDISTS/$dist"-*.tar.gz 2>/dev/null) || fail "no sdist of $dir"
  listing=$(tar -tzf "$sdist")
  for shared in _build/lockstep.py _build/_version.py; do
    grep -q "^[^/]*/$shared\$" <<<"$listing" || fail "$sdist lacks $shared"
  done
done

echo "== checking the wheels' platform tags"
for pure in eemicrogpt_backend_neon eemicrogpt_backend_sme2 eemicrogpt_backend_sme2_f16; do
  if [ "$(uname -m)" = x86_64 ]; then
    ls "$HOUSE"/"$pure"-*-py3-none-any.whl >/dev/null 2>&1 \
      || fail "$pure: expected a pure-Python wheel on x86_64 (the backend reports itself unavailable here)"
  fi
done
if [ "$(uname -m)" = x86_64 ]; then
  x86_wheel=$(ls "$HOUSE"/eemicrogpt_backend_x86-*-linux_x86_64.whl 2>/dev/null) \
    || fail "eemicrogpt_backend_x86: expected a linux_x86_64 wheel"
  listing=$("$PY" -m zipfile -l "$x86_wheel")
  libs=(_emg_avx512 _emg_avx2 _emg_probe)
  # The bf16 libraries are optional in setup.py (compilers without the flags skip them); a compiler that
  # takes the flags must have built them.
  cc=${CC:-gcc}
  "$cc" -mavx512bf16 -E -x c /dev/null >/dev/null 2>&1 && libs+=(_emg_avx512_bf16)
  "$cc" -mavx512bf16 -mamx-tile -mamx-bf16 -E -x c /dev/null >/dev/null 2>&1 && libs+=(_emg_amx_bf16)
  for lib in "${libs[@]}"; do
    grep -q "eemicrogpt_backend_x86/$lib" <<<"$listing" || fail "$x86_wheel lacks $lib"
  done
fi

echo "== adding the core's third-party dependencies (never eemicrogpt itself) to the wheelhouse"
core_wheel=$(ls "$HOUSE"/eemicrogpt-*.whl)
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --dest "$HOUSE" "$core_wheel" \
  2>&1 | grep -v -e 'pypi-more' || true

echo "== clean virtualenv, installing from the wheelhouse only"
"$PY" -m venv "$WORK/venv"
# PIP_CONFIG_FILE=/dev/null: this machine's pip config (extra index, find-links) plays no part either.
VPIP=(env PIP_CONFIG_FILE=/dev/null "$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$HOUSE")
"${VPIP[@]}" eemicrogpt-backend-x86 2>&1 | grep -v -e 'pypi-more' || true
core_version=$("$PY" -c "import ast,sys; print(ast.literal_eval(open('eemicrogpt_core/_version.py').read().split('=')[1].strip()))")
got=$("$WORK/venv/bin/python" -c "from importlib.metadata import version; print(version('eemicrogpt'))") \
  || fail "installing eemicrogpt-backend-x86 alone did not install the core"
[ "$got" = "$core_version" ] || fail "the core installed with the x86 backend is $got, not $core_version"
"${VPIP[@]}" eemicrogpt-backend-numpy eemicrogpt-backend-neon eemicrogpt-backend-sme2 eemicrogpt-backend-sme2-f16 \
  eemicrogpt-backend-example-c eemicrogpt-backend-example-py 2>&1 | grep -v -e 'pypi-more' || true
"$WORK/venv/bin/python" -m pip check --disable-pip-version-check

echo "== the CLI from the virtualenv (run outside the checkout, so nothing is imported from it)"
cd "$WORK"
EMG=$WORK/venv/bin/eemicrogpt
where=$("$WORK/venv/bin/python" -c "import eemicrogpt_core; print(eemicrogpt_core.__file__)")
[[ $where == "$WORK/venv/"* ]] || fail "eemicrogpt_core imported from $where, not from the virtualenv"
"$EMG" --version | tee "$WORK/version.txt"
for dist in eemicrogpt-backend-x86 eemicrogpt-backend-numpy eemicrogpt-backend-neon eemicrogpt-backend-sme2 \
  eemicrogpt-backend-sme2-f16 eemicrogpt-backend-example-c eemicrogpt-backend-example-py; do
  grep -q "^  $dist " "$WORK/version.txt" || fail "--version does not list $dist"
done
head -1 "$WORK/version.txt" | grep -qx "eemicrogpt $core_version" || fail "--version does not start with the core"
"$EMG" backends
"$EMG" backends --json >"$WORK/backends.json"
"$WORK/venv/bin/python" - "$WORK/backends.json" <<'EOF'
import json, platform, sys
report = json.load(open(sys.argv[1]))
rows = {b["name"]: b for b in report["backends"]}
missing = {"numpy_ref", "avx512", "avx2", "neon", "sme2_f32", "sme2_f16", "sme2_f16w", "example_c", "example_py"} - set(rows)
assert not missing, f"backends missing from the wheel install: {missing}"
assert not report["plugin_failures"], report["plugin_failures"]
assert rows["numpy_ref"]["available"] and rows["example_c"]["available"], rows
if platform.machine() == "x86_64":  # the ARM wheels here are pure Python: installed, and say why they cannot run
    for name in ("neon", "sme2_f32", "sme2_f16", "sme2_f16w"):
        assert not rows[name]["available"] and "aarch64" in rows[name]["reason"], rows[name]
EOF
"$EMG" train --steps 60 --log-every 30 --data "$DATA" --out "$WORK/run"
"$EMG" sample "$WORK/run" -n 5 | tee "$WORK/samples.txt"
[ "$(grep -c . "$WORK/samples.txt")" = 5 ] || fail "sample did not print 5 names"
"$EMG" configs | tee "$WORK/configs.txt"
for name in d16 d32 d64 d128 bpc1s bpc1s_steps pareto time_to_2; do
  grep -q "^  $name " "$WORK/configs.txt" || fail "eemicrogpt configs does not list $name: the wheel lacks it"
done
"$EMG" train --config d16 --steps 30 --log-every 30 --data "$DATA" --out "$WORK/run-d16"
echo "== wheels: built, installed from the wheelhouse alone and run"
