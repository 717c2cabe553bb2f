#!/usr/bin/env bash
# Checks what an operator installs: `cmake --install` into a temporary prefix (what
# `make install PREFIX=...` runs), the .deb that `make package` builds with CPack (inspected with
# dpkg-deb), the systemd unit (systemd-analyze verify, hardening settings) and every shell script
# in deploy/, tests/ and .ci/run (shellcheck).
#
# Usage: check_install_package.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
  exit 2
fi
SOURCE_DIR=$(cd "$1" && pwd)
BUILD_DIR=$(cd "$2" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# shellcheck source-path=SCRIPTDIR source=check_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"

version=$(sed -n 's/^project(ckptd VERSION \([0-9.]*\).*/\1/p' "$SOURCE_DIR/CMakeLists.txt")

# ---------------------------------------------------------------- make install
prefix="$WORK/prefix"
check "cmake --install into a temporary prefix" cmake --install "$BUILD_DIR" --prefix "$prefix"
for f in bin/ckptd bin/ckptctl lib/systemd/system/ckptd.service \
         share/doc/ckptd/README.md share/doc/ckptd/ckptd.env.example \
         share/doc/ckptd/docs/ckptctl.md; do
  check "installed $f" test -s "$prefix/$f"
done
check "installed ckptd runs" grep -qx "ckptd $version" <("$prefix/bin/ckptd" --version)
check "installed ckptctl runs" grep -qx "ckptctl $version" <("$prefix/bin/ckptctl" --version)

# ---------------------------------------------------------------- make package
check "cpack builds a .deb" cpack --config "$BUILD_DIR/CPackConfig.cmake" -G DEB -B "$WORK/pkg"
deb=$(find "$WORK/pkg" -maxdepth 1 -name 'ckptd_*.deb' | head -n 1)
check "the .deb exists" test -n "$deb"
if [ -n "$deb" ]; then
  field() { dpkg-deb -f "$deb" "$1"; }
  check "package name is ckptd" test "$(field Package)" = ckptd
  check "package version is $version" test "$(field Version)" = "$version"
  check "depends on gRPC and RocksDB runtime libraries" \
    bash -c "dpkg-deb -f '$deb' Depends | grep -q 'libgrpc++' && dpkg-deb -f '$deb' Depends | grep -q librocksdb"
  dpkg-deb -c "$deb" | awk '{print $NF}' >"$WORK/contents"
  for f in ./usr/bin/ckptd ./usr/bin/ckptctl ./usr/lib/systemd/system/ckptd.service \
           ./usr/share/doc/ckptd/ckptd.env.example ./usr/share/doc/ckptd/README.md; do
    check "package contains $f" grep -qx "$f" "$WORK/contents"
  done
  check "package installs nothing outside /usr" bash -c "! grep -v '^\./usr/' '$WORK/contents' | grep -qv '^\./$'"
fi

# ---------------------------------------------------------------- systemd unit
unit="$SOURCE_DIR/deploy/ckptd.service"
# systemd-analyze checks that ExecStart exists: point it at the binary installed above.
mkdir -p "$WORK/unit"
sed "s|^ExecStart=/usr/bin/ckptd|ExecStart=$prefix/bin/ckptd|" "$unit" >"$WORK/unit/ckptd.service"
check "systemd-analyze verify ckptd.service" systemd-analyze verify "$WORK/unit/ckptd.service"
for setting in DynamicUser=yes StateDirectory=ckptd ProtectSystem=strict NoNewPrivileges=yes \
               ProtectHome=yes PrivateDevices=yes CapabilityBoundingSet= \
               "ExecStart=/usr/bin/ckptd" "EnvironmentFile=-/etc/default/ckptd"; do
  check "unit sets $setting" grep -qx "$setting" "$unit"
done
check "the unit's store is in its state directory" grep -qx "Environment=CKPTD_DATA=/var/lib/ckptd/store" "$unit"

# ---------------------------------------------------------------- scripts
mapfile -t scripts < <(find "$SOURCE_DIR/deploy" "$SOURCE_DIR/tests" -name '*.sh' | sort)
scripts+=("$SOURCE_DIR/.ci/run")
check "shellcheck ${#scripts[@]} scripts" shellcheck -x "${scripts[@]}"

finish install_package
