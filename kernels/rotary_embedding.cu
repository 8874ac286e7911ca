// rotary_embedding.cu: the rotary position embedding on the GPU (layout and maths in rotary_embedding.h): one thread
// per rotated pair, the angle the position times the host's fp32 frequency (the CPU reference's very bits), its
// cosine and sine by sincosf (the accurate one, not the fast intrinsic: angles reach thousands of radians).
#include "rotary_embedding.h"

#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"

namespace hgrn {
namespace {

template <typename T>
__global__ void rotary_kernel(const T* in, T* out, bool add, RotaryRows d, RotaryFrequencies f,
                              long long pairs_per_row, long long in_stride, long long out_stride, long long total) {
  const long long half = d.head_dim / 2;
  for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
       p += (long long)gridDim.x * blockDim.x) {
    // p = ((r · heads + h) · half + i) · inner + w
    const long long r = p / pairs_per_row, in_row = p % pairs_per_row;
    const long long w = in_row % d.inner, i = in_row / d.inner % half, h = in_row / d.inner / half;
    const float position = static_cast<float>(d.first_position + r % d.time);
    float s, c;
    sincosf(position * f.inv_freq[i], &s, &c);
    if (d.inverse) s = -s;
    const long long e0 = (h * d.head_dim + i) * d.inner + w, e1 = e0 + half * d.inner;
    const float x0 = load_f(in[r * in_stride + e0]), x1 = load_f(in[r * in_stride + e1]);
    float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    T* y = out + r * out_stride;
    if (add) {
      y0 += load_f(y[e0]);
      y1 += load_f(y[e1]);
    }
    y[e0] = store_f<T>(y0);
    y[e1] = store_f<T>(y1);
  }
}

}  // namespace

void cuda_rotary_embedding(const void* in, void* out, bool add, const RotaryRows& d, const RotaryFrequencies& f,
                           DType dtype) {
  HGRN_CHECK(d.head_dim % 2 == 0 && d.head_dim <= 2 * kMaxRotaryPairs && d.time > 0, "rotary_embedding CUDA: head width ",
             d.head_dim, " must be even and at most ", 2 * kMaxRotaryPairs, ", and time positive");
  const long long pairs_per_row = d.heads * (d.head_dim / 2) * d.inner, total = d.rows * pairs_per_row;
  if (total == 0) return;
  const long long in_stride = d.in_stride ? d.in_stride : d.row_width();
  const long long out_stride = d.out_stride ? d.out_stride : d.row_width();
  constexpr int kThreads = 256;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rotary_embedding", [&] {
    rotary_kernel<act_t><<<grid_for(total, kThreads), kThreads, 0, cuda_stream()>>>(
        static_cast<const act_t*>(in), static_cast<act_t*>(out), add, d, f, pairs_per_row, in_stride, out_stride,
        total);
    CUDA_CHECK_LAUNCH("rotary_embedding");
  });
}

}  // namespace hgrn
