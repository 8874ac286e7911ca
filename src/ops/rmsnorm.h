// rmsnorm.h: RMSNorm over the last axis, y = x / sqrt(mean(x²) + eps) ⊙ w (spec section 4). (The pre-norm residual
// stream's add, h = h + f(...), is made by f's last GEMM: ops/linear.h.)
#pragma once
#include "core/autograd.h"
#include "ops/fp8.h"

namespace hgrn {

// x [..., D]; weight [D], or nullptr for the weightless variant (y = x · rstd). group_width G > 0 (a divisor of D):
// each run of G consecutive features is normalised on its own, with weight [G] (a per-head norm, as fla's
// FusedRMSNormGated over heads of width G); 0 normalises the whole last axis. The statistics are computed in the
// input's precision (fp32 for fp32, fp64 for fp64) on the CPU and in fp32 on the GPU; the per-row rstd is saved for
// backward. On the GPU x is fp32 or bf16 and the weight (a parameter) is fp32.
Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps, int64_t group_width = 0);

// The swish-gated norm y = silu(gate) ⊙ (RMSNorm(x) ⊙ w), fla's FusedRMSNormGated (swish): the pieces of
// swiglu_linear's normalised up operand (ops/swiglu_linear.h). x [..., D] contiguous, normalised in runs of
// group_width features (0: all D) as rmsnorm; gate like x, or row-strided (a column block of a fused projection). The
// bits are those of rmsnorm followed by swiglu (the norm's output rounded to x's dtype before the product): on the
// GPU one pass each way where the rows fit one warp, the composition otherwise and on the CPU.
// Forward: writes y (like x, contiguous); returns the per-row rstd the backward takes (as rmsnorm saves it).
Tensor gated_rmsnorm_forward(const Tensor& x, const Tensor* weight, const Tensor& gate, double eps, int64_t group_width,
                             Tensor& y);
// The same with y written as FP8 codes only (ops/fp8.h: Fp8CodesOut; its amax folded where codes.amax is set): a
// projection's FP8 input with no act-dtype copy (swiglu_linear).
Tensor gated_rmsnorm_forward_codes(const Tensor& x, const Tensor* weight, const Tensor& gate, double eps,
                                   int64_t group_width, const Fp8CodesOut& codes);
// Backward from dy (like x, contiguous): the gradients of x, weight and gate, each where wanted; y non-null (may be
// dy itself) also gets the forward's output again, or y_codes (in place of y, no amax) its FP8 codes.
void gated_rmsnorm_backward(const Var& x, const Var& weight, const Var& gate, const Tensor& rstd, double eps,
                            int64_t group_width, const Tensor& dy, Tensor* y, const Fp8CodesOut* y_codes = nullptr);

// The forward alone into given buffers, for code that runs without a tape on buffers made once (decoding,
// models/fused_decoder.h): y like x, rstd [rows] (fp32 on the GPU, x's dtype on the CPU). Allocates nothing.
void rmsnorm_forward_into(const Tensor& x, const Tensor* weight, double eps, Tensor& y, Tensor& rstd);

}  // namespace hgrn
