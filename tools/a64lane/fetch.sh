#!/bin/bash
# Stage 2: QEMU 11 (trixie-backports), arm64 compiler-rt builtins and an arm64 CPython 3.11 sysroot.
# Foreign .debs come from a private apt instance (own sources list, lists and cache under $L) and are only
# unpacked with dpkg-deb: the host's apt and dpkg configuration is never touched.
set -euo pipefail
# shellcheck source=tools/a64lane/lib.sh
source "$(dirname "$0")/lib.sh"

ARM64_DEBS=(libclang-rt-19-dev python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
  libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libssl3 libffi8 libbz2-1.0 liblzma5 libuuid1
  libcrypt1 libsqlite3-0 libncursesw6 libtinfo6 libreadline8)
KEY="v1 qemu-user/trixie-backports ${ARM64_DEBS[*]}"
if is_cached fetch "$KEY" && [[ -x "$QEMU" && -f "$RT" && -x "$PY_A64" ]]; then
  echo "cached: $("$QEMU" --version | head -1)"
  exit 0
fi

rm -rf "$L/apt" "$L/debs" "$L/qemu" "$L/rt" "$SR"
mkdir -p "$L"/{apt/lists/partial,apt/cache/archives/partial,debs,qemu,rt} "$SR"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$L/apt/sources.list" <<SRC
deb [arch=arm64 signed-by=$KEYRING] http://deb.debian.org/debian bookworm main
deb [arch=arm64 signed-by=$KEYRING] http://deb.debian.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=$KEYRING] http://deb.debian.org/debian trixie-backports main
SRC
APT=(apt-get -q -o APT::Sandbox::User=root -o Acquire::Languages=none
  -o Dir::Etc::SourceList="$L/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
  -o Dir::State::Lists="$L/apt/lists" -o Dir::Cache="$L/apt/cache"
  -o APT::Architectures::=amd64 -o APT::Architectures::=arm64)
"${APT[@]}" update >"$L/apt/update.log" 2>&1 || { cat "$L/apt/update.log"; die "private apt update failed"; }

wanted=(qemu-user/trixie-backports)
for p in "${ARM64_DEBS[@]}"; do wanted+=("$p:arm64"); done
(cd "$L/debs" && "${APT[@]}" download "${wanted[@]}" >"$L/apt/download.log" 2>&1) ||
  { cat "$L/apt/download.log"; die "downloading .debs failed"; }

qemu_deb=("$L"/debs/qemu-user_*_amd64.deb)
dpkg-deb --fsys-tarfile "${qemu_deb[0]}" | tar -x -C "$L/qemu" ./usr/bin/qemu-aarch64
for deb in "$L"/debs/*_arm64.deb; do
  case "$deb" in
    */libclang-rt-19-dev_*) dpkg-deb -x "$deb" "$L/rt" ;;
    *) dpkg-deb -x "$deb" "$SR" ;;
  esac
done
[[ -f "$RT" ]] || die "compiler-rt builtins not found at $RT"
# Debian ships the stdlib without .pyc files: compile them once on the host (same 3.11 magic), or every
# emulated interpreter start pays for it.
"$HOST_PY" -m compileall -q -j0 "$SR/usr/lib/python3.11" >/dev/null || echo "compileall: some files failed (harmless)"
rm -rf "$L/apt/cache/archives"/*.deb
"$QEMU" --version | head -1
mark_cached fetch "$KEY"
