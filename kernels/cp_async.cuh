// cp_async.cuh: asynchronous global → shared copies (cp.async, sm_80+), the primitives that kernels staging data
// ahead of use share: the recurrence's tiles (gla_recurrence.cu) and the RMSNorm rows (rmsnorm.cu).
// A thread's copies become visible to that same thread once cp_async_wait has returned for their group; data that
// other threads read needs a barrier after the wait as well.
#pragma once
#include <cstdint>

namespace hgrn {

// Shared-memory address of p, as cp.async takes it.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes from src (16-byte aligned) to the shared address `to`, through L2 only (.cg: streamed data skips L1).
__device__ __forceinline__ void cp_async_16(unsigned to, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src));
}
// Closes the group of the copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight (N = 0: all have landed).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace hgrn
