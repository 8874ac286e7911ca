// cuda_context.h: the process's CUDA state that kernels share: the compute stream every kernel and copy runs on,
// the cuBLASLt handle and its workspace, and the device's properties. Created on first use.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "cuda_check.h"

namespace hgrn {

cudaStream_t cuda_stream();            // all hgrn kernels, copies and GEMMs run here, in order
cublasLtHandle_t cublaslt_handle();
void* cublaslt_workspace(size_t* bytes);  // a fixed scratch buffer for cuBLASLt (allocated once)
const cudaDeviceProp& cuda_device_properties();
// cuBLASLt's heuristic for a described matmul (D laid out as C) that fits the workspace: up to `requested`
// algorithms into results, best first; returns how many.
int cublaslt_algorithms(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t c, int requested, cublasLtMatmulHeuristicResult_t* results);
// The index of the fastest of `found` candidates, each timed (best of 3 runs after a warm-up) by run(algo), which
// returns false when the algorithm cannot run (gemm.cu; HGRN_GEMM_LOG=1 prints each candidate at `flops` per run).
int cublaslt_fastest(const cublasLtMatmulHeuristicResult_t* results, int found, double flops,
                     const std::function<bool(const cublasLtMatmulAlgo_t&)>& run);
// Whether GEMMs time cuBLASLt's candidates (set_gemm_autotune, gemm.h) or take its first choice.
bool gemm_autotune_enabled();

// Blocks a 1-D grid of `threads`-thread blocks covering n items (capped so that huge n uses grid-stride loops).
inline unsigned grid_for(long long n, int threads) {
  long long blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  return static_cast<unsigned>(blocks);
}

// Raises `kernel`'s dynamic shared-memory limit to `dynamic_smem` bytes (needed past 48 KB), once per kernel: the
// size must be the same at every launch.
template <auto kernel>
void allow_dynamic_smem(size_t dynamic_smem) {
  static const bool done = [dynamic_smem] {
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_smem)));
    return true;
  }();
  (void)done;
}

// How many blocks of `kernel` the GPU holds at once with `threads` threads and `dynamic_smem` bytes of dynamic shared
// memory per block (both fixed per kernel): asked of the occupancy calculator once per kernel, after raising the
// kernel's shared-memory limit to `dynamic_smem`.
template <auto kernel>
int64_t resident_blocks(int threads, size_t dynamic_smem) {
  static const int64_t resident = [threads, dynamic_smem] {
    allow_dynamic_smem<kernel>(dynamic_smem);
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dynamic_smem));
    return static_cast<int64_t>(std::max(per_sm, 1)) * cuda_device_properties().multiProcessorCount;
  }();
  return resident;
}

}  // namespace hgrn
