#!/usr/bin/env bash
# Installs exactly the Debian 12 packages ckptd needs to build, test and benchmark.
# Idempotent: does nothing when every package is already present. Runs as root, or through
# sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev
  libabsl-dev libspdlog-dev libfmt-dev librocksdb-dev
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev
  python3 python3-numpy python3-protobuf
  systemd shellcheck
  prometheus-cpp-dev prometheus
  python3-grpcio python3-xxhash python3-pytest python3-pip python3-venv openssl
  python3-yaml
  python3-matplotlib
  pybind11-dev python3-dev
  clang lld libclang-rt-14-dev
)
# kubectl, for the offline checks of deploy/k8s: Debian's kubernetes-client, unless a kubectl is
# installed already (another package shipping /usr/bin/kubectl would conflict with it).
if ! command -v kubectl >/dev/null 2>&1; then
  PACKAGES+=(kubernetes-client)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install-deps: not root and no sudo; please install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
