// cuda_context.h: the process's CUDA state that kernels share: the compute stream every kernel and copy runs on,
// the cuBLASLt handle and its workspace, and the device's properties. Created on first use.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace hgrn {

cudaStream_t cuda_stream();            // all hgrn kernels, copies and GEMMs run here, in order
cublasLtHandle_t cublaslt_handle();
void* cublaslt_workspace(size_t* bytes);  // a fixed scratch buffer for cuBLASLt (allocated once)
const cudaDeviceProp& cuda_device_properties();

// Blocks a 1-D grid of `threads`-thread blocks covering n items (capped so that huge n uses grid-stride loops).
inline unsigned grid_for(long long n, int threads) {
  long long blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  return static_cast<unsigned>(blocks);
}

}  // namespace hgrn
