#!/bin/bash
# Stage 5: cross-compile every ARM backend with its backends/<dir>/build_aarch64.sh into its package dir
# inside $SITE (where its plugin's find_library looks).
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"
: "${SITE:?SITE must name the site dir of this run}"

export CC="clang-19 --target=aarch64-linux-gnu -fuse-ld=lld"
export A64_RT=$RT EMG_INCLUDE=$REPO/eemicrogpt_core/include
for dir in $(lane_backends); do
  [[ -f "$dir/build_aarch64.sh" ]] || continue
  pkg=$(backend_package "$dir")
  [[ -d "$SITE/$pkg" ]] || die "$pkg was not staged into $SITE"
  echo "-- $(basename "$dir") -> $pkg"
  OUT=$SITE/$pkg bash "$dir/build_aarch64.sh"
done
