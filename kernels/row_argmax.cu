// row_argmax.cu: one block per row; each thread keeps the best (value, index) of its strided columns, then a shared
// memory tree combines them. "Better" is a total order on non-NaN pairs (the larger value, then the lower index), so
// the result is the same whichever pairs meet first.
#include <cstdint>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "row_argmax.h"

namespace hgrn {

namespace {

constexpr int kThreads = 1024;
constexpr int kBatch = 16;  // columns a thread loads before comparing them

// a is better than b: a larger value, or an equal one at a lower index. An index of `none` is no candidate (its
// value is never compared).
__device__ __forceinline__ bool better(float a_value, int a_index, float b_value, int b_index, int none) {
  if (a_index == none) return false;
  if (b_index == none) return true;
  return a_value > b_value || (a_value == b_value && a_index < b_index);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) row_argmax_kernel(const T* x, long long stride, int limit, int32_t* out) {
  __shared__ float values[kThreads];
  __shared__ int indices[kThreads];
  wait_for_previous_kernel();  // a programmatic dependent of the kernel that wrote x (dependent_launch.cuh)
  const T* row = x + static_cast<long long>(blockIdx.x) * stride;
  const int none = limit;
  float best_value = 0.f;
  int best_index = none;
  // kBatch loads issued before their comparisons: one block reads a whole row (at batch 1, the only block), so it
  // needs many loads in flight.
  for (int c0 = threadIdx.x; c0 < limit; c0 += kThreads * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = c0 + i * kThreads;
      v[i] = c < limit ? load_f(row[c]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int c = c0 + i * kThreads;
      if (c < limit && !isnan(v[i]) && better(v[i], c, best_value, best_index, none)) {
        best_value = v[i];
        best_index = c;
      }
    }
  }
  values[threadIdx.x] = best_value;
  indices[threadIdx.x] = best_index;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      const int other = threadIdx.x + half;
      if (better(values[other], indices[other], values[threadIdx.x], indices[threadIdx.x], none)) {
        values[threadIdx.x] = values[other];
        indices[threadIdx.x] = indices[other];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = indices[0] == none ? 0 : indices[0];
}

}  // namespace

void cuda_row_argmax(const void* x, DType dtype, int64_t rows, int64_t stride, int64_t limit, int32_t* out) {
  HGRN_CHECK(rows <= 0x7fffffff, "row_argmax: ", rows, " rows is too many for one launch");
  HGRN_CUDA_DISPATCH_ACT(dtype, "row_argmax", [&] {
    launch_as_dependent(row_argmax_kernel<act_t>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0,
                        static_cast<const act_t*>(x), static_cast<long long>(stride), static_cast<int>(limit), out);
  });
  CUDA_CHECK_LAUNCH("row_argmax");
}

}  // namespace hgrn
