// launch.cuh: how every hgrn kernel is launched: on the compute stream, with programmatic dependent launch (PDL) on
// Hopper and later, which hides most of the gap between one kernel's end and the next one's start (~1.6 us each, and
// over a thousand kernels a hgrn2-385m step).
//
// Under PDL a kernel may be scheduled while the one before it on the stream is still running. That stays correct by
// one rule: every kernel launched by launch_kernel calls start_after_previous_kernel() first, before it reads or writes
// any memory (and before any early return). The call waits until the previous kernel has finished and its writes are
// visible (griddepcontrol.wait), then lets the next kernel start launching (griddepcontrol.launch_dependents), so that
// its launch overlaps this one. As each kernel waits for the one before it, stream order holds transitively; GEMMs
// (cuBLASLt), copies and memsets keep plain stream order on both sides.
// Off (plain stream order) below compute capability 9.0, when the kernels were not compiled for sm_90 or later (the
// instructions would be missing), or with HGRN_PROGRAMMATIC_LAUNCH=0 (a way to rule PDL out when chasing a bug).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.h"
#include "cuda_context.h"

namespace hgrn {

__device__ __forceinline__ void start_after_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, shared_bytes, cuda_stream()>>>(args...); `name` is for the error message. The kernel
// must begin with start_after_previous_kernel().
template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = cuda_stream();
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch_enabled() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess)
    throw Error(detail::concat("CUDA kernel ", name, " failed to launch: ", cudaGetErrorString(err),
                               " (grid ", grid.x, "x", grid.y, "x", grid.z, ", block ", block.x, "x", block.y, "x",
                               block.z, ", ", shared_bytes, " bytes of shared memory)"));
}

}  // namespace hgrn
