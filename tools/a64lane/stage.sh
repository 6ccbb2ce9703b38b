#!/bin/bash
# Stage 4: install the project's pure-Python packages, the core and numpy_ref (with their .dist-info and
# entry points, which the registry discovers backends by) into the run's site dir $SITE. The ARM backends
# are built by stage 5. Sources are copied first so that pip's in-tree builds never leave build/ or
# *.egg-info behind in the working tree.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"
: "${SITE:?SITE must name the site dir of this run}"

src=$SITE.src
rm -rf "$src"
mkdir -p "$src"
copy_tree() { # copy_tree FROM TO [paths...]: the given paths (default: all) without build leftovers
  local from=$1 to=$2
  shift 2
  mkdir -p "$to"
  tar -C "$from" --exclude=build --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.so' \
    --exclude=.pytest_cache -cf - "${@:-.}" | tar -x -C "$to"
}

core_paths=(pyproject.toml eemicrogpt_core)
for f in README.md setup.py LICENSE; do [[ -e "$REPO/$f" ]] && core_paths+=("$f"); done
# The repository's layout is kept: numpy_ref's setup.py runs ../share.py, which copies ../lockstep.py and the
# core's _version.py (its version and core pin) into its _build/. The ARM backends are built and installed by
# build.sh, through their setup.py.
copy_tree "$REPO" "$src" "${core_paths[@]}"
copy_tree "$REPO/backends" "$src/backends" lockstep.py share.py
projects=("$src")
[[ -d "$REPO/backends/numpy_ref" ]] || die "backends/numpy_ref is missing: the conformance kit needs it"
copy_tree "$REPO/backends/numpy_ref" "$src/backends/numpy_ref"
projects+=("$src/backends/numpy_ref")

"$BUILD_PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --no-compile --target "$SITE" "${projects[@]}" \
  2>&1 | grep -v -e 'Running pip as the .root. user' -e 'pypi-more' || true
rm -rf "$src"
n_dist=$(find "$SITE" -maxdepth 1 -name '*.dist-info' | wc -l)
((n_dist == ${#projects[@]})) || die "installed $n_dist distributions from ${#projects[@]} projects into $SITE"
find "$SITE" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sort | tr '\n' ' '
echo
