// rmsnorm.h: RMSNorm over the last axis, y = x / sqrt(mean(x²) + eps) ⊙ w (spec section 4). (The pre-norm residual
// stream's add, h = h + f(...), is made by f's last GEMM: ops/linear.h.)
#pragma once
#include "core/autograd.h"

namespace hgrn {

// x [..., D]; weight [D], or nullptr for the weightless variant (y = x · rstd). group_width G > 0 (a divisor of D):
// each run of G consecutive features is normalised on its own, with weight [G] (a per-head norm, as fla's
// FusedRMSNormGated over heads of width G); 0 normalises the whole last axis. The statistics are computed in the
// input's precision (fp32 for fp32, fp64 for fp64) on the CPU and in fp32 on the GPU; the per-row rstd is saved for
// backward. On the GPU x is fp32 or bf16 and the weight (a parameter) is fp32.
Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps, int64_t group_width = 0);

// The forward alone into given buffers, for code that runs without a tape on buffers made once (decoding,
// models/fused_decoder.h): y like x, rstd [rows] (fp32 on the GPU, x's dtype on the CPU). Allocates nothing.
void rmsnorm_forward_into(const Tensor& x, const Tensor* weight, double eps, Tensor& y, Tensor& rstd);

}  // namespace hgrn
