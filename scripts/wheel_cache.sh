# Sourced by setup.sh and wheels.sh: a project's sdist, and its wheel built from that sdist, with the wheel
# kept in a cache keyed by the sdist's content. The x86 backend's wheel is minutes of compiler time; setup.sh
# builds it once and wheels.sh, run after it on the same tree, takes the same wheel instead of compiling the
# same sources again. Any change to what goes into an sdist changes the key.
#   needs: PY (the Python with `build` and pip), WHEEL_CACHE (a directory)

# sdist_digest SDIST: sha256 of the sdist's member names and contents (not of the tarball, whose bytes carry
# build times)
sdist_digest() {
  { tar -tzf "$1"; tar -xzOf "$1"; } | sha256sum | cut -d' ' -f1
}

# sdist_and_wheel PROJECT SDIST_DIR WHEEL_DIR: build PROJECT's sdist into SDIST_DIR and put the wheel built
# from it into WHEEL_DIR, from WHEEL_CACHE when the same sdist content was built before. Prints the wheel's
# path and whether it was built or reused. The environment passes through to the build (EEMICROGPT_INCLUDE).
sdist_and_wheel() {
  local project=$1 sdists=$2 wheels=$3 out sdist key cached
  out=$(mktemp -d)
  "$PY" -m build --sdist --outdir "$out" "$project" >"$out/build.log" 2>&1 \
    || { cat "$out/build.log" >&2; rm -rf "$out"; echo "building the sdist of $project failed" >&2; return 1; }
  sdist=$(ls "$out"/*.tar.gz)
  key=$(sdist_digest "$sdist")
  cached=$WHEEL_CACHE/$key
  if ! ls "$cached"/*.whl >/dev/null 2>&1; then
    rm -rf "$cached.tmp" && mkdir -p "$cached.tmp"
    "$PY" -m pip wheel -q --no-deps --disable-pip-version-check -w "$cached.tmp" "$sdist" >"$out/build.log" 2>&1 \
      || { cat "$out/build.log" >&2; rm -rf "$out" "$cached.tmp"; echo "building the wheel of $project from its sdist failed" >&2; return 1; }
    rm -rf "$cached" && mv "$cached.tmp" "$cached"
    echo "  $project: wheel built from its sdist" >&2
  else
    touch "$cached" # in use: setup.sh drops the entries a run did not touch
    echo "  $project: wheel of the same sdist content reused ($cached)" >&2
  fi
  mkdir -p "$sdists" "$wheels"
  mv "$sdist" "$sdists"/
  cp "$cached"/*.whl "$wheels"/
  rm -rf "$out"
  ls "$wheels"/"$(basename "$(ls "$cached"/*.whl)")"
}
