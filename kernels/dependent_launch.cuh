// dependent_launch.cuh: programmatic dependent launch (Hopper and later). A kernel launched with launch_as_dependent
// may start while the kernel before it on the stream is still running, once that one has called
// allow_dependent_launch (or finished), so that its launch and its first loads overlap the other's tail. Every such
// kernel keeps one rule: it calls wait_for_previous_kernel (griddepcontrol.wait: the previous kernel has finished and
// its writes are visible) before it touches memory that kernel, or one still running before it, may write or read.
// What it may do before: read what no kernel writes while it runs (weights during decoding), and prefetch into L2
// (a hint: never a wrong value). A kernel that allows only after it has waited keeps its dependents one kernel
// behind it; one that allows earlier answers for what its dependents read before their wait (gla_recurrence.cu).
// Both calls are no-ops where the launch is plain.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.h"
#include "cuda_context.h"

namespace hgrn {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The start of a dependent kernel that touches memory from its first instruction: it waits for the kernel before,
// then lets the next one launch (which, waiting in turn, stays one kernel behind).
__device__ __forceinline__ void begin_dependent_kernel() {
  wait_for_previous_kernel();
  allow_dependent_launch();
}

// Asks L2 to fetch the 128-byte line holding p (no register written, nothing waited for).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Whether kernels launch as programmatic dependents: compute capability 9.0 or later and this build's code for it
// (without the griddepcontrol instructions a kernel would not wait). Every kernel of the library is built for the
// same architectures, so the first one asked answers for all, once per process.
bool dependent_launch_supported(const void* kernel);

// kernel<<<grid, block, bytes>>>(args...) on the compute stream, as a programmatic dependent of the kernel before it
// where that is supported (above), else in plain stream order.
template <typename... Params, typename... Args>
void launch_as_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t bytes, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = bytes;
  config.stream = cuda_stream();
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_supported(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace hgrn
