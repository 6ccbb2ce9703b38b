#!/bin/bash
# Stage 4: install the project's pure-Python packages (with their .dist-info and entry points, which the
# registry discovers backends by) into the run's site dir $SITE. Sources are copied first so that the
# host pip's in-tree builds never leave build/ or *.egg-info behind in the working tree.
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
# The repository's layout is kept: each backend's setup.py reads ../lockstep.py (its version and core pin).
copy_tree "$REPO" "$src" "${core_paths[@]}"
copy_tree "$REPO/backends" "$src/backends" lockstep.py
projects=("$src")
for dir in $(lane_backends); do
  name=$(basename "$dir")
  copy_tree "$dir" "$src/backends/$name"
  projects+=("$src/backends/$name")
done
[[ -d "$REPO/backends/numpy_ref" ]] || die "backends/numpy_ref is missing: the conformance kit needs it"
copy_tree "$REPO/backends/numpy_ref" "$src/backends/numpy_ref"
projects+=("$src/backends/numpy_ref")

"$HOST_PY" -m pip install -q --no-deps --no-build-isolation --no-compile --target "$SITE" "${projects[@]}" \
  2>&1 | grep -v -e 'Running pip as the .root. user' -e 'pypi-more' || true
rm -rf "$src"
n_dist=$(find "$SITE" -maxdepth 1 -name '*.dist-info' | wc -l)
((n_dist == ${#projects[@]})) || die "installed $n_dist distributions from ${#projects[@]} projects into $SITE"
find "$SITE" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sort | tr '\n' ' '
echo
