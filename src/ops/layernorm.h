// layernorm.h: LayerNorm over the last axis with weight and bias, y = (x − mean(x)) / sqrt(var(x) + eps) ⊙ w + b
// (the biased variance, as torch.nn.LayerNorm): the output norm of the HGRN1 paper's complex HGRU.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// x [..., D] contiguous; weight and bias [D] (each may be nullptr: ones / zeros). On the CPU the statistics are
// computed in the input's dtype (fp32 or fp64), which the weight and bias share; on the GPU (kernels/layernorm.h) x is
// fp32 or bf16, the weight and bias (parameters) fp32, and the statistics fp32. The per-row mean and rstd are saved
// for the backward.
Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, double eps);

}  // namespace hgrn
