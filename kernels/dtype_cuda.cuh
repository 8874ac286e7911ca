// dtype_cuda.cuh: the element types kernels compute on (fp32, bf16 activations) and the dispatch from hgrn::DType.
// Arithmetic is always fp32: a bf16 element is widened on load and rounded (to nearest even) on store.
#pragma once
#include <cuda_bf16.h>

#include <string>
#include <type_traits>

#include "core/check.h"
#include "core/dtype.h"

namespace hgrn {

__device__ __forceinline__ float load_f(float x) { return x; }
__device__ __forceinline__ float load_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T store_f(float x);
template <> __device__ __forceinline__ float store_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 store_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// in[0..V) rounded to T as store_f rounds each, two at a time: bf16's paired conversion is one instruction for two
// values, with the same bits.
template <typename T, int V>
__device__ __forceinline__ void store_f_pairs(const float (&in)[V], T (&out)[V]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && V % 2 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(in[k], in[k + 1]);
      out[k] = pair.x, out[k + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = store_f<T>(in[k]);
  }
}
// v[k] replaced by its value as it reads back once stored as T (load_f(store_f<T>(v[k]))), paired as store_f_pairs.
template <typename T, int V>
__device__ __forceinline__ void round_to_stored(float (&v)[V]) {
  T stored[V];
  store_f_pairs<T, V>(v, stored);
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = load_f(stored[k]);
}

// e^x for a result that enters values of activation dtype Act. bf16: the multi-function unit's 2^(x·log2 e) (__expf:
// relative error below 2^-16 where the result is a normal number, 0 where it would underflow), far under bf16's 2^-9
// rounding, instead of expf's range reduction in kernels bound by their arithmetic (the fused gates, the loss's online
// softmax). fp32 keeps expf, whose accuracy its tolerances need.
template <typename Act>
__device__ __forceinline__ float act_exp(float x) {
  if constexpr (std::is_same_v<Act, float>)
    return expf(x);
  else
    return __expf(x);
}

}  // namespace hgrn

// Calls the lambda with act_t = float or __nv_bfloat16 for the activation dtype (fp32 or bf16).
#define HGRN_CUDA_DISPATCH_ACT(dtype, NAME, ...)                                                        \
  [&] {                                                                                                \
    switch (dtype) {                                                                                   \
      case ::hgrn::DType::F32: { using act_t = float; return __VA_ARGS__(); }                         \
      case ::hgrn::DType::BF16: { using act_t = __nv_bfloat16; return __VA_ARGS__(); }                \
      default:                                                                                         \
        throw ::hgrn::Error(std::string(NAME) + ": no CUDA kernel for dtype " +                        \
                            ::hgrn::dtype_name(dtype) + " (GPU activations are fp32 or bf16)");        \
    }                                                                                                  \
  }()
