// elementwise.cu: the residual add and gradient accumulation (elementwise.h). One kernel serves both, since
// dst += src is add with the output aliasing the first input (each element is read and written by one thread); and
// the scaled accumulation of an fp32 gradient into a gradient of either dtype.
#include "cuda_check.h"
#include "elementwise.cuh"
#include "elementwise.h"

namespace hgrn {

namespace {
template <typename T, int V>
__global__ void add_kernel(const T* a, const T* b, T* y, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float av[V], bv[V];
    load_pack<V>(a, i, av);
    load_pack<V>(b, i, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) av[k] += bv[k];
    store_pack<V>(y, i, av);
  }
}
template <typename T, int V>
__global__ void scaled_accumulate_kernel(T* dst, const float* src, const float* scale, float factor, bool accumulate,
                                         long long packs) {
  const float a = scale[0] * factor;
  HGRN_FOR_EACH_PACK(i, packs) {
    float sv[V], dv[V];
    load_pack<V>(src, i, sv);
    if (accumulate) load_pack<V>(dst, i, dv);
#pragma unroll
    for (int k = 0; k < V; ++k) dv[k] = accumulate ? fmaf(a, sv[k], dv[k]) : a * sv[k];
    store_pack<V>(dst, i, dv);
  }
}
}  // namespace

void cuda_add(const void* a, const void* b, void* y, int64_t n, DType dtype) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "add", [&] {
    const act_t* at = static_cast<const act_t*>(a);
    const act_t* bt = static_cast<const act_t*>(b);
    act_t* yt = static_cast<act_t*>(y);
    launch_packed<act_t>(n, {a, b, y}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      add_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
          at + first, bt + first, yt + first, packs);
      CUDA_CHECK_LAUNCH("add");
    });
  });
}

void cuda_accumulate(void* dst, const void* src, int64_t n, DType dtype) { cuda_add(dst, src, dst, n, dtype); }

void cuda_scaled_accumulate(void* dst, DType dst_dtype, const float* src, const float* scale, float factor,
                            bool accumulate, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dst_dtype, "scaled_accumulate", [&] {
    act_t* d = static_cast<act_t*>(dst);
    // Packs of 4: 16 bytes of the fp32 source, 8 or 16 of the destination.
    launch_packed<float>(n, {dst, src}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      scaled_accumulate_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0,
                                           cuda_stream()>>>(d + first, src + first, scale, factor, accumulate, packs);
      CUDA_CHECK_LAUNCH("scaled_accumulate");
    });
  });
}

}  // namespace hgrn
