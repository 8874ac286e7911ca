// layernorm.h: LayerNorm over the last axis with weight and bias, y = (x − mean(x)) / sqrt(var(x) + eps) ⊙ w + b
// (the biased variance, as torch.nn.LayerNorm): the output norm of the HGRN1 paper's complex HGRU.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// x [..., D] contiguous; weight and bias [D] (each may be nullptr: ones / zeros). The statistics are computed in the
// input's dtype (fp32 or fp64), which the weight and bias share; the per-row mean and rstd are saved for the
// backward. CPU only: a CUDA input throws hgrn::Error.
Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, double eps);

}  // namespace hgrn
