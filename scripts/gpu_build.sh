#!/usr/bin/env bash
# gpu_build.sh: builds build-gpu/hgrn (the CUDA backend, Release) unless it is already there: what the GPU benchmark
# scripts run before they time anything. HGRN_CMAKE_ARGS passes extra CMake options, as for scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x build-gpu/hgrn ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHGRN_CUDA=ON ${HGRN_CMAKE_ARGS:-}
  cmake --build build-gpu -j"$(nproc)" --target hgrn
fi
