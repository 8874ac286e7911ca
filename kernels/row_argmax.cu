// row_argmax.cu: one block per row; each thread keeps the best (value, index) of its strided columns, loaded as
// 16-byte packs where the rows are aligned, then shuffles and one shared-memory round combine them. "Better" is a
// total order on non-NaN pairs (the larger value, then the lower index), so the result is the same whichever pairs
// meet first.
#include <cstdint>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "row_argmax.h"

namespace hgrn {

namespace {

constexpr int kThreads = 1024;
constexpr int kBatch = 16;  // columns a thread loads before comparing them (unaligned rows)
constexpr int kPackedBatch = 32;  // values a thread loads as packs before comparing them (aligned rows)

// a is better than b: a larger value, or an equal one at a lower index. An index of `none` is no candidate (its
// value is never compared).
__device__ __forceinline__ bool better(float a_value, int a_index, float b_value, int b_index, int none) {
  if (a_index == none) return false;
  if (b_index == none) return true;
  return a_value > b_value || (a_value == b_value && a_index < b_index);
}

// The better of this lane's (value, index) and its partner's `offset` lanes away, in every lane a butterfly reaches.
__device__ __forceinline__ void warp_best(float& value, int& index, int none) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (better(other_value, other_index, value, index, none)) value = other_value, index = other_index;
  }
}

template <typename T, bool kPacked>
__global__ void __launch_bounds__(kThreads) row_argmax_kernel(const T* x, long long stride, int limit, int32_t* out) {
  constexpr int V = 16 / sizeof(T);  // values of a pack
  constexpr int kPackBatch = kPackedBatch / V;
  __shared__ float values[kThreads / 32];
  __shared__ int indices[kThreads / 32];
  wait_for_previous_kernel();  // a programmatic dependent of the kernel that wrote x (dependent_launch.cuh)
  const T* row = x + static_cast<long long>(blockIdx.x) * stride;
  const int none = limit;
  float best_value = 0.f;
  int best_index = none;
  const auto consider = [&](float v, int c) {
    if (!isnan(v) && better(v, c, best_value, best_index, none)) best_value = v, best_index = c;
  };
  // Loads issued before their comparisons: one block reads a whole row (at batch 1, the only block), so it needs many
  // loads in flight.
  int scalar_from = 0;
  if constexpr (kPacked) {
    const int packs = limit / V;
    for (int p0 = threadIdx.x; p0 < packs; p0 += kThreads * kPackBatch) {
      float v[kPackBatch][V];
#pragma unroll
      for (int i = 0; i < kPackBatch; ++i)
        if (p0 + i * kThreads < packs) load_pack<V>(row, p0 + i * kThreads, v[i]);
#pragma unroll
      for (int i = 0; i < kPackBatch; ++i)
        if (p0 + i * kThreads < packs)
#pragma unroll
          for (int q = 0; q < V; ++q) consider(v[i][q], (p0 + i * kThreads) * V + q);
    }
    scalar_from = packs * V;  // the columns past the last whole pack
  }
  for (int c0 = scalar_from + threadIdx.x; c0 < limit; c0 += kThreads * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = c0 + i * kThreads;
      v[i] = c < limit ? load_f(row[c]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (c0 + i * kThreads < limit) consider(v[i], c0 + i * kThreads);
  }
  warp_best(best_value, best_index, none);
  if (threadIdx.x % 32 == 0) values[threadIdx.x / 32] = best_value, indices[threadIdx.x / 32] = best_index;
  __syncthreads();
  if (threadIdx.x < 32) {
    best_value = values[threadIdx.x];
    best_index = indices[threadIdx.x];
    warp_best(best_value, best_index, none);
    if (threadIdx.x == 0) out[blockIdx.x] = best_index == none ? 0 : best_index;
  }
}

}  // namespace

void cuda_row_argmax(const void* x, DType dtype, int64_t rows, int64_t stride, int64_t limit, int32_t* out) {
  HGRN_CHECK(rows <= 0x7fffffff, "row_argmax: ", rows, " rows is too many for one launch");
  HGRN_CUDA_DISPATCH_ACT(dtype, "row_argmax", [&] {
    const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && stride % (16 / sizeof(act_t)) == 0;
    with_flag(aligned, [&](auto packed) {
      launch_as_dependent(row_argmax_kernel<act_t, decltype(packed)::value>, dim3(static_cast<unsigned>(rows)),
                          dim3(kThreads), 0, static_cast<const act_t*>(x), static_cast<long long>(stride),
                          static_cast<int>(limit), out);
    });
  });
  CUDA_CHECK_LAUNCH("row_argmax");
}

}  // namespace hgrn
