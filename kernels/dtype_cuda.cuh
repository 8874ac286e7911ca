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
