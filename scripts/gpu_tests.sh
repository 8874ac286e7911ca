#!/usr/bin/env bash
# gpu_tests.sh: on a machine with an NVIDIA GPU and the CUDA Toolkit: builds hgrn with the CUDA backend into
# build-gpu/ and runs the whole test suite there (GPU tests included; on a machine without a GPU they skip; with
# 2 or 4 GPUs the multi-GPU tests DistributedCuda.* run too, through mpirun with NCCL_NVLS_ENABLE=0).
# Writes the full log to ${1:-build-gpu/gpu-tests.log} and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${1:-build-gpu/gpu-tests.log}
command -v nvcc >/dev/null || { echo "gpu_tests: nvcc not found: install the CUDA Toolkit" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "gpu_tests: nvidia-smi failed"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHGRN_CUDA=ON ${HGRN_CMAKE_ARGS:-}
cmake --build build-gpu -j"$(nproc)"
mkdir -p "$(dirname "$log")"
set +e
ctest --test-dir build-gpu --output-on-failure -j"$(nproc)" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo "---- GPU tests (skipped ones listed) ----"
grep -E "tests passed|Skipped|\*\*\*Skipped|Failed" "$log" | tail -20 || true
exit "$status"
