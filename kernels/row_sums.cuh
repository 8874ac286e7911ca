// row_sums.cuh: what the norm kernels (rmsnorm.cu, layernorm.cu) that take one block per row share: the sum of a
// value over a warp's or the block's threads, in a fixed order so that the bits repeat run to run, and the launch
// shape.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/check.h"

namespace hgrn {

// Threads of a row's block: about 4 elements per thread, whole warps, at most 1024 threads.
inline int row_block_threads(int64_t width) {
  const int64_t warps = ((width + 3) / 4 + 31) / 32;
  return static_cast<int>(std::clamp<int64_t>(warps, 1, 32) * 32);
}

// The widths these kernels take (a row's offsets are ints).
inline void check_row_width(int64_t width, const char* op) {
  HGRN_CHECK(width > 0 && width <= (int64_t{1} << 30), op, ": width ", width, " out of range");
}

// Blocks for `rows` rows (grid-striding past 2^20).
inline unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20)); }

// The sum of v over the warp, the same bits in every lane (a butterfly of shuffles: each lane adds the same pairs).
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block, the same value in every thread. blockDim.x must be a multiple of 32. The order is
// fixed (a shuffle tree in each warp, then the warp totals in warp order), so the bits repeat run to run.
// warp_sums is __shared__ float[32]; the leading barrier lets a loop call this again without a race on it.
__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
  v = warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < (int)blockDim.x / 32; ++w) total += warp_sums[w];
  return total;
}

}  // namespace hgrn
