// rmsnorm.h: RMSNorm over the last axis, y = x / sqrt(mean(x²) + eps) ⊙ w (spec section 4), and the fused residual
// add + RMSNorm of the pre-norm residual stream (h = h + f(...); x = norm(h)).
#pragma once
#include "core/autograd.h"

namespace hgrn {

// x [..., D]; weight [D], or nullptr for the weightless variant (y = x · rstd). The statistics are computed in the
// input's precision (fp32 for fp32, fp64 for fp64) on the CPU and in fp32 on the GPU; the per-row rstd is saved for
// backward. On the GPU x is fp32 or bf16 and the weight (a parameter) is fp32.
Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps);

struct AddRmsNormResult {
  Var sum;     // residual + delta: the residual stream's next value
  Var normed;  // rmsnorm(sum, weight, eps)
};

// sum = residual + delta and normed = RMSNorm(sum) ⊙ weight in one pass; equal to add followed by rmsnorm (on the
// GPU with bf16 activations, the norm is taken of the sum as rounded to bf16, as the unfused ops would). In backward
// the sum's gradient is its own (when anything used it) plus the norm's input gradient, and flows to both inputs.
// residual and delta have the same shape, dtype and device; weight as for rmsnorm (nullptr: weightless).
AddRmsNormResult add_rmsnorm(Tape& tape, const Var& residual, const Var& delta, const Var& weight, double eps);

}  // namespace hgrn
