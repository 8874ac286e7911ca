// rotary_embedding.cu: the rotary position embedding on the GPU (layout and maths in rotary_embedding.h). One block
// row (one position) at a time: its cosines and sines, by sincosf of the position times the host's fp32 frequency (the
// CPU reference's very bits; the accurate sincosf, not the fast intrinsic: angles reach thousands of radians), are
// formed once into shared memory, then the block's threads rotate the row's pairs with 32-bit index arithmetic.
#include "rotary_embedding.h"

#include <algorithm>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"

namespace hgrn {
namespace {

template <typename T>
__global__ void rotary_kernel(const T* in, T* out, bool add, RotaryRows d, RotaryFrequencies f, int pairs_per_row,
                              long long in_stride, long long out_stride) {
  __shared__ float cosines[kMaxRotaryPairs], sines[kMaxRotaryPairs];
  const int half = static_cast<int>(d.head_dim / 2), inner = static_cast<int>(d.inner);
  for (long long r = blockIdx.x; r < d.rows; r += gridDim.x) {
    const float position = static_cast<float>(d.first_position + r % d.time);
    __syncthreads();  // the previous row's readers are done with the tables
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float s, c;
      sincosf(position * f.inv_freq[i], &s, &c);
      cosines[i] = c;
      sines[i] = d.inverse ? -s : s;
    }
    __syncthreads();
    const T* x = in + r * in_stride;
    T* y = out + r * out_stride;
    for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < pairs_per_row; p += gridDim.y * blockDim.x) {
      // p = (h · half + i) · inner + w
      const int w = p % inner, hi = p / inner, i = hi % half, h = hi / half;
      const int e0 = (h * static_cast<int>(d.head_dim) + i) * inner + w, e1 = e0 + half * inner;
      const float x0 = load_f(x[e0]), x1 = load_f(x[e1]), c = cosines[i], s = sines[i];
      float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
      if (add) {
        y0 += load_f(y[e0]);
        y1 += load_f(y[e1]);
      }
      y[e0] = store_f<T>(y0);
      y[e1] = store_f<T>(y1);
    }
  }
}

}  // namespace

void cuda_rotary_embedding(const void* in, void* out, bool add, const RotaryRows& d, const RotaryFrequencies& f,
                           DType dtype) {
  HGRN_CHECK(d.head_dim % 2 == 0 && d.head_dim <= 2 * kMaxRotaryPairs && d.time > 0, "rotary_embedding CUDA: head width ",
             d.head_dim, " must be even and at most ", 2 * kMaxRotaryPairs, ", and time positive");
  const long long pairs_per_row = d.heads * (d.head_dim / 2) * d.inner;
  HGRN_CHECK(pairs_per_row < (1LL << 30), "rotary_embedding CUDA: ", pairs_per_row, " pairs a row: fewer than 2^30");
  if (d.rows == 0 || pairs_per_row == 0) return;
  const long long in_stride = d.in_stride ? d.in_stride : d.row_width();
  const long long out_stride = d.out_stride ? d.out_stride : d.row_width();
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<long long>(d.rows, 1LL << 30)),
                  static_cast<unsigned>(std::min<long long>((pairs_per_row + kThreads - 1) / kThreads, 65535)));
  HGRN_CUDA_DISPATCH_ACT(dtype, "rotary_embedding", [&] {
    rotary_kernel<act_t><<<grid, kThreads, 0, cuda_stream()>>>(static_cast<const act_t*>(in), static_cast<act_t*>(out),
                                                              add, d, f, static_cast<int>(pairs_per_row), in_stride,
                                                              out_stride);
    CUDA_CHECK_LAUNCH("rotary_embedding");
  });
}

}  // namespace hgrn
