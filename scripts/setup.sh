#!/usr/bin/env bash
# setup.sh: installs the Debian/Ubuntu packages hgrn builds with (only those missing) and builds hgrn into build/.
# Safe to run twice. Extra CMake arguments: HGRN_CMAKE_ARGS="-DHGRN_CUDA=OFF" ./scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git libyaml-cpp-dev libcli11-dev libhdf5-dev
          libopenblas-openmp-dev libgtest-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libzstd-dev zlib1g-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  # Another apt-get (unattended upgrades on a fresh machine) may hold the dpkg lock: wait for it up to 10 minutes
  # instead of failing at once.
  wait_lock=(-o DPkg::Lock::Timeout=600)
  $sudo apt-get "${wait_lock[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi

# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${HGRN_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
echo "setup: built build/hgrn"
