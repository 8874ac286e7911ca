// sigmoid.cuh: the logistic sigmoid, the log-sigmoid and silu's derivative in fp32, shared by the activation kernels
// (activations.cu), the fused HGRN2 gates (hgrn2_gates.cu, where q = silu(q̂)) and GLA's low-rank gate
// (low_rank_gate.cu), so all compute the very same bits for a dtype.
#pragma once

#include "dtype_cuda.cuh"

namespace hgrn {

// As the CPU's stable_sigmoid: exp only of a non-positive number, so large |x| gives 0 or 1, never inf/inf. The
// divisor 1 + e^−|x| lies in [1, 2], where the hardware's approximate division (__fdividef, 2 ulp) is safe; it
// saves the IEEE division's ~10 instructions in kernels whose arithmetic, not memory, sets the time. Act: the dtype
// the result is rounded to, which picks the exponential (act_exp).
template <typename Act>
__device__ __forceinline__ float stable_sigmoid(float x) {
  const float e = act_exp<Act>(-fabsf(x));
  return __fdividef(x >= 0.f ? 1.f : e, 1.f + e);
}

// log σ(x) = min(x, 0) − log1p(e^{−|x|}), as the CPU's: IEEE expf and log1pf, since GLA's gates are this value
// divided by 16, small numbers whose relative accuracy the recurrence's decays carry.
__device__ __forceinline__ float log_sigmoid_value(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }

// silu'(x) · dy with s = σ(x): dy · s · (1 + x · (1 − s)).
__device__ __forceinline__ float silu_backward_value(float x, float s, float dy) {
  return dy * s * (1.f + x * (1.f - s));
}

// acc + v for a gradient accumulated onto one already stored, never contracted with v's last product into an FMA
// (which the compiler may or may not do, kernel by kernel): kernels that add the same term give the same bits.
__device__ __forceinline__ float accumulated(float acc, float v) { return __fadd_rn(acc, v); }

}  // namespace hgrn
