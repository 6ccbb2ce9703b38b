#!/bin/bash
# Stage 5b: every ARM backend source compiled for arm64-apple-macos14 with the flags its setup.py uses on a
# Mac, by clang 19 and zig's clang 22, and the undefined symbols checked against Apple's runtime
# (darwin_compile.py says how).
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"
"$BUILD_PY" "$A64_TOOLS/darwin_compile.py" "$REPO"
