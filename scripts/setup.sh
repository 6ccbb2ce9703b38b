#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for eemicrogpt: system build tools, a venv in .venv, the core and every
# backend that builds here (ARM backends install as pure Python on x86 and report themselves unavailable).
# Idempotent: re-running only reinstalls the project's own packages. Prints a line per step; the full
# output of each step goes to .venv/setup-logs/ and is shown only when the step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v gcc >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "== installing system packages (gcc, python3-venv)"
  apt-get update -q && apt-get install -y -q --no-install-recommends build-essential python3-venv
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
logs=.venv/setup-logs
mkdir -p "$logs"

# step NAME COMMAND...: run quietly into $logs/NAME.log; on failure show the log's end and stop.
step() {
  local name=$1 log="$logs/${1//[^a-zA-Z0-9]/_}.log"
  shift
  echo "== $name"
  if ! "$@" >"$log" 2>&1; then
    echo "setup: '$name' failed; the last lines of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

PIP=(.venv/bin/python -m pip install --disable-pip-version-check)
step "pip, setuptools, wheel" "${PIP[@]}" --upgrade pip setuptools wheel
# The plot and ray extras too: the tests exercise `eemicrogpt plot` and a real Ray cluster.
step "eemicrogpt (core, editable, with test tools, plot and ray extras)" "${PIP[@]}" -e ".[test,plot,ray]"
# One pip call: some backends depend on others (sme2_f16 on sme2_f32), so pip must see them together.
backends=()
for backend in backends/*/; do
  [ -f "$backend/pyproject.toml" ] && backends+=("./$backend")
done
step "backends: $(basename -a "${backends[@]}" | tr '\n' ' ')" "${PIP[@]}" "${backends[@]}"
.venv/bin/eemicrogpt backends
