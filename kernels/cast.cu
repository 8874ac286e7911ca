// cast.cu: elementwise dtype conversion and fill (cast.h). Conversion goes through double for fp64/int sources and
// through float otherwise; bf16 results round to nearest even, as the CPU's bf16::from_float does.
#include <cuda_bf16.h>

#include "cast.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "elementwise.cuh"

namespace hgrn {

namespace {
template <typename T> __device__ __forceinline__ double to_double(T x) { return static_cast<double>(x); }
template <> __device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_double(double x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_double(double x) {
  return __float2bfloat16_rn(static_cast<float>(x));
}
template <> __device__ __forceinline__ float from_double(double x) { return static_cast<float>(x); }

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = from_double<D>(to_double(src[i]));
}
// The hot casts (fp32 <-> bf16 for weights and activations) avoid double arithmetic. fp32 -> bf16, the weights'
// compute copies (hgrn2-1b casts 126 of them a step under recompute_weight_copies), goes V elements a thread through
// elementwise.cuh's packs (a 16-byte load, an 8-byte store): element by element it ran at ~40% of the copy rate.
template <int V>
__global__ void cast_f32_to_bf16_kernel(const float* src, __nv_bfloat16* dst, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float v[V];
    load_pack<V>(src, i, v);
    store_pack<V>(dst, i, v);  // __float2bfloat16_rn: round to nearest even
  }
}
template <>
__global__ void cast_kernel(const __nv_bfloat16* src, float* dst, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

template <typename D>
__global__ void fill_kernel(D* dst, double value, long long n) {
  const D v = from_double<D>(value);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = v;
}

template <typename F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    case DType::F64: f(double{}); break;
    case DType::I32: f(int32_t{}); break;
    case DType::I64: f(int64_t{}); break;
  }
}
}  // namespace

void cuda_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16) {
    const float* s = static_cast<const float*>(src);
    __nv_bfloat16* d = static_cast<__nv_bfloat16*>(dst);
    launch_packed<float>(n, {src, dst}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      cast_f32_to_bf16_kernel<V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
          s + first, d + first, packs);
      CUDA_CHECK_LAUNCH("cast");
    });
    return;
  }
  with_type(src_dtype, [&](auto s) {
    with_type(dst_dtype, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      cast_kernel<S, D><<<grid_for(n, 256), 256, 0, cuda_stream()>>>(static_cast<const S*>(src),
                                                                     static_cast<D*>(dst), n);
    });
  });
  CUDA_CHECK_LAUNCH("cast");
}

void cuda_zero(void* dst, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda_stream()));
}

void cuda_fill(void* dst, DType dtype, double value, int64_t n) {
  if (n == 0) return;
  with_type(dtype, [&](auto d) {
    using D = decltype(d);
    fill_kernel<D><<<grid_for(n, 256), 256, 0, cuda_stream()>>>(static_cast<D*>(dst), value, n);
  });
  CUDA_CHECK_LAUNCH("fill");
}

}  // namespace hgrn
