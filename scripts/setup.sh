#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for eemicrogpt: system build tools, a venv in .venv, the core and every
# backend that builds here (ARM backends install as pure Python on x86 and report themselves unavailable).
# Idempotent: re-running reinstalls the project's own packages (a backend whose sources did not change from
# its cached wheel, without compiling). Prints a line per step; the full output of each step goes to
# .venv/setup-logs/ and is shown only when the step fails.
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
# The plot, ray, tensorboard, wandb and onnx extras too: the tests exercise `eemicrogpt plot`, a real Ray
# cluster, `--log-to` (event files read back with TensorBoard's reader, a W&B offline run) and the ONNX export
# (run by onnxruntime).
step "eemicrogpt (core, editable, with test tools and the plot, ray, tensorboard, wandb and onnx extras)" \
  "${PIP[@]}" -e ".[test,plot,ray,tensorboard,wandb,onnx]"
# PyTorch for the export tests (Run.to_torch, --format torch). Pinned: 2.13.0 is the CPU build that lies on
# this kind of machine's disk (pip's find-links); any other version, or an unpinned install, would download
# a CUDA build of several GB from the index.
step "torch 2.13.0 (CPU build, for the export tests)" "${PIP[@]}" torch==2.13.0
# Each backend on its own (none depends on another; a failure names the backend and keeps its own log), from
# a wheel built from its sdist, as users get it. The wheels are cached by sdist content (wheel_cache.sh):
# a re-run with unchanged sources, and scripts/wheels.sh after this, take them instead of compiling again.
PY=.venv/bin/python WHEEL_CACHE=.venv/wheel-cache
# shellcheck source=scripts/wheel_cache.sh
source scripts/wheel_cache.sh
built=$(mktemp -d)
trap 'rm -rf "$built"' EXIT
install_backend() { # install_backend DIR: its wheel (built from its sdist, or cached), over any earlier one
  local wheel
  wheel=$(sdist_and_wheel "$1" "$built/sdists" "$built/wheels") || return 1
  "${PIP[@]}" --no-deps --force-reinstall "$wheel"
}
for backend in backends/*/; do
  if [ -f "$backend/pyproject.toml" ]; then step "backend $(basename "$backend")" install_backend "$backend"; fi
done
# Wheels of older sources (built or reused before $built was made) go: the cache holds one tree's worth.
find "$WHEEL_CACHE" -mindepth 1 -maxdepth 1 -type d ! -newer "$built" -exec rm -rf {} +
.venv/bin/eemicrogpt backends
