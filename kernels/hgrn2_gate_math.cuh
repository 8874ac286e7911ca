// hgrn2_gate_math.cuh: the HGRN2 forget gate's per-element arithmetic on the GPU, forward (g, k) and backward
// (λ, ∂g/∂f̂, ∂g/∂γ), in fp32 with the CPU reference's branches (src/ops/hgrn2_gates.cpp explains them). Shared by
// the gates' own kernels (hgrn2_gates.cu) and the recurrence's backward, which runs the gates' backward in its
// gradient epilogue (gla_recurrence.cu), so that both compute the same function. min/max are spelled as
// std::min/std::max evaluate them, so that a NaN input propagates exactly as on the CPU instead of being swallowed by
// fminf/fmaxf.
#pragma once

#include <cmath>

#include "dtype_cuda.cuh"

namespace hgrn {
namespace gate_math {

__device__ __forceinline__ float std_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }

// log(exp(a) + exp(b)) for a, b ≤ 0, either possibly −inf.
__device__ __forceinline__ float log_add_exp(float a, float b) {
  const float hi = std_max(a, b), lo = std_min(a, b);
  if (hi == -INFINITY) return hi;
  return hi + log1pf(expf(lo - hi));
}

// σ(x), σ(−x) and e^−|x| from one exponential (never of a positive number), each to relative precision; 1 + e^−|x|
// lies in [1, 2], where the approximate division (2 ulp) is safe. Act: the dtype of the results the caller rounds to
// (act_exp): the gradients of bf16 activations take the multi-function unit's exponential (~1e-7 relative, far below
// bf16's 2^-9), fp32 keeps expf; the forward's g, fp32 whatever the activations and summed into the decays, always
// takes expf.
struct Sigmoids {
  float of_x, of_minus_x, tail;
};
template <typename Act = float>
__device__ __forceinline__ Sigmoids sigmoids(float x) {
  const float e = act_exp<Act>(-fabsf(x));
  const float r = __fdividef(1.f, 1.f + e);
  return x >= 0.f ? Sigmoids{r, e * r, e} : Sigmoids{e * r, r, e};
}

// Below this λ the gates take the CPU's log-space forms; at or above it 1/λ <= 2^100, so the direct products below
// neither overflow nor lose their relative precision (and λ is far above where fp32 turns subnormal).
constexpr float kSmallLambda = 0x1p-100f;

// The forget gate of one element: g = log λ and k = 1 − λ, λ = γ + (1 − γ)·σ(x); γ = 0 for an unbounded gate (layer 0,
// no lower bounds, or a bound that rounded to 0). log_gamma = logf(γ), log_one_minus_gamma = log1pf(−γ), the
// channel's, computed once by the caller. The CPU's branches (src/ops/hgrn2_gates.cpp), with cheaper forms where
// they are as accurate: k = u = (1 − γ)·σ(−x) directly (a product of two accurate factors; fla's k = 1 − λ) instead of
// −expm1(g), and for λ <= 1/2, g = log λ of the sum λ = γ + (1 − γ)·σ(x) of two non-negative terms (one rounding)
// instead of logaddexp, unless λ < kSmallLambda (σ(x) near underflow), where the log-space form keeps its precision.
// For λ > 1/2, log1p(−u) is log w + e/w with w = 1 − u rounded and e = (1 − u) − w its rounding error, exact by
// Fast2Sum (1 − w is exact by Sterbenz); the neglected (e/w)²/2 is below 2^-47. So both branches take one logf (of w or
// λ) on the same path: a warp's lanes take either branch, and with a log1pf on one and a logf on the other every warp
// ran both one after the other.
struct ForgetGate {
  float g, k;
};
__device__ __forceinline__ ForgetGate forget_gate(float x, float gamma, float log_gamma, float log_one_minus_gamma) {
  const Sigmoids s = sigmoids(x);
  if (gamma == 0.f) return {std_min(x, 0.f) - log1pf(s.tail), s.of_minus_x};
  const float u = (1.f - gamma) * s.of_minus_x;  // 1 − λ
  const bool near_one = u < 0.5f;                // λ > 1/2
  const float lambda = gamma + (1.f - gamma) * s.of_x;
  if (!near_one && lambda < kSmallLambda)
    return {log_add_exp(log_gamma, log_one_minus_gamma + (std_min(x, 0.f) - log1pf(s.tail))), u};
  const float w = near_one ? 1.f - u : lambda;
  const float e = near_one ? (1.f - w) - u : 0.f;
  const float g = logf(w) + __fdividef(e, w);  // w in [1/2, 1]: the approximate division is safe
  return {near_one ? std_max(g, log_gamma) : g, u};
}

// The decay λ = e^g and k = 1 − λ of forget_gate without its logarithm, for a recurrence that multiplies its state by
// e^g (HGRN1's scan): k is forget_gate's bit for bit; λ = 1 − k where λ > 1/2 (one rounding), else
// γ + (1 − γ)·σ(x), as forget_gate_grad takes it. With σ(±x) for the derivatives: ∂λ/∂f̂ = (1 − γ)·σ(x)·σ(−x),
// ∂λ/∂γ = σ(−x), and ∂k = −∂λ; no division, so nothing overflows however small λ is. expf, as for g.
struct DecayGate {
  float lambda, k, sigmoid_x, sigmoid_minus_x;
};
__device__ __forceinline__ DecayGate decay_gate(float x, float gamma) {
  const Sigmoids s = sigmoids(x);
  const float k = (1.f - gamma) * s.of_minus_x;
  const float lambda = k < 0.5f ? 1.f - k : gamma + (1.f - gamma) * s.of_x;
  return {lambda, k, s.of_x, s.of_minus_x};
}

// λ, ∂g/∂f̂ = (1 − γ)·σ(x)·σ(−x)/λ and ∂g/∂γ = σ(−x)/λ of one element (γ = 0: unbounded), with λ recomputed from f̂
// (g is not read back), for gradients rounded to Act (sigmoids). For λ >= kSmallLambda as products with 1/λ, σ(x)/λ <= 1/(1 − γ) taken first so that nothing
// overflows on the way; below it the CPU's exponentials of sums of logs.
struct ForgetGateGrad {
  float lambda, dg_df, dg_dgamma;
};
// The λ < kSmallLambda branch, out of line: taken only where σ(x) nears underflow, and inlined its logs and
// exponentials took registers from the common path (fewer threads per SM in the backward).
static __device__ __noinline__ ForgetGateGrad forget_gate_grad_small(float x, float gamma, float log_gamma,
                                                              float log_one_minus_gamma, float tail_exp) {
  const float g = forget_gate(x, gamma, log_gamma, log_one_minus_gamma).g;
  const float tail = log1pf(tail_exp);
  const float ls_x = std_min(x, 0.f) - tail, ls_minus_x = std_min(-x, 0.f) - tail;
  return {expf(g), expf(log_one_minus_gamma + ls_x - g + ls_minus_x), expf(ls_minus_x - g)};
}
template <typename Act>
__device__ __forceinline__ ForgetGateGrad forget_gate_grad(float x, float gamma, float log_gamma,
                                                          float log_one_minus_gamma) {
  const Sigmoids s = sigmoids<Act>(x);
  const float lambda = gamma + (1.f - gamma) * s.of_x;
  if (lambda >= kSmallLambda) {
    const float inv = __fdividef(1.f, lambda);
    return {lambda, (1.f - gamma) * (s.of_x * inv) * s.of_minus_x, s.of_minus_x * inv};
  }
  return forget_gate_grad_small(x, gamma, log_gamma, log_one_minus_gamma, s.tail);
}

}  // namespace gate_math
}  // namespace hgrn
