// elementwise.cu: the residual add and gradient accumulation (elementwise.h). One kernel serves both, since
// dst += src is add with the output aliasing the first input (each element is read and written by one thread).
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

}  // namespace hgrn
