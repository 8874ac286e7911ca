// chunk_sums.cuh: the second pass of hgrn's deterministic column reductions (a weight gradient summed over rows):
// dst[c] += Σ_chunks partials[chunk, c] (for a fresh buffer dst[c] = that sum), where each first-pass block wrote one
// row of partial sums for its chunk of rows. Block (kChunkSumColumns, Lanes): lane y sums chunks y, y + Lanes, … in
// order (many loads in flight rather than one thread walking every chunk), then lane 0 adds the lanes in lane order.
// The order is fixed by the shape and Lanes alone, so the bits never depend on scheduling (no atomics).
#pragma once
#include "core/check.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"

namespace hgrn {

constexpr int kChunkSumColumns = 32;

template <int Lanes>
__global__ void add_chunk_sums_kernel(const float* partials, float* dst, long long chunks, long long width,
                                      bool accumulate) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  __shared__ float lane_sums[Lanes][kChunkSumColumns + 1];
  const long long c = blockIdx.x * (long long)kChunkSumColumns + threadIdx.x;
  float s = 0.f;
  if (c < width)
    for (long long k = threadIdx.y; k < chunks; k += Lanes) s += partials[k * width + c];
  lane_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
    float total = 0.f;
    for (int lane = 0; lane < Lanes; ++lane) total += lane_sums[lane][threadIdx.x];
    // + 0: a fresh sum's bits are those of adding it to a zero fill (−0 becomes +0).
    dst[c] = accumulate ? dst[c] + total : total + 0.f;
  }
}

// Queues the pass on the compute stream. `name` goes into the launch-failure message; accumulate false: dst is
// written, not read (a fresh gradient buffer needs no zero fill).
template <int Lanes>
void add_chunk_sums(const float* partials, float* dst, long long chunks, long long width, const char* name,
                    bool accumulate = true) {
  const long long blocks = (width + kChunkSumColumns - 1) / kChunkSumColumns;
  HGRN_CHECK(blocks <= 0x7fffffffLL, name, ": width ", width, " exceeds the launch grid");
  launch_as_dependent(add_chunk_sums_kernel<Lanes>, dim3(static_cast<unsigned>(blocks)), dim3(kChunkSumColumns, Lanes),
                      0, partials, dst, chunks, width, accumulate);
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace hgrn
