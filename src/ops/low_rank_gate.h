// low_rank_gate.h: a gate made by a low-rank projection through a log-sigmoid, in one op: GLA's forget gate
// gk = log σ(u·W₂ᵀ + b) / 16, where u = x·W₁ᵀ is a narrow column block of the layer's fused projection.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// y = log σ(u·Wᵀ + b) / divisor (<= 0 for divisor > 0) over the last axis: u [..., R], weight [out, R], bias [out]
// -> y [..., out]. u may be row-strided (a column block: Tensor::columns), and its gradient is written so (into its
// columns of the parent's gradient). The logits x = u·Wᵀ + b are never stored: the backward makes them again, then
// with d = dy·σ(−x)/divisor, du = d·W, dW = dᵀ·u and db = Σ_rows d.
// On the GPU u is fp32 or bf16, weight and bias are fp32 parameters, y is fp32 (out_dtype F32: the log gates
// gla_recurrence reads) and every sum runs in fp32; R <= kLowRankGateMaxRank (kernels/low_rank_gate.h). On the CPU
// every tensor, y included (out_dtype), has u's dtype, fp32 or fp64.
Var low_rank_log_sigmoid_gate(Tape& tape, const Var& u, const Var& weight, const Var& bias, double divisor,
                              DType out_dtype);

}  // namespace hgrn
