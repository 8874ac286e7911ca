// swiglu_linear.h: the GatedMLP's down projection and its activation as one op, y = (silu(gate) ⊙ up)·Wᵀ, so that
// the backward can make the MLP's widest activation (hidden = silu(gate) ⊙ up, [tokens, MLP width]) in the same pass
// that reads gate and up for their gradients, instead of a separate recomputation pass before the projection's
// backward (which reads gate and up once more: 2 x [tokens, width] fewer reads per layer).
//
// The backward's order: dhidden = dy·W (a fresh buffer, never zero-filled); then one element-wise pass reads gate,
// up and dhidden, writes dgate, dup and, over dhidden, hidden itself; then dW += dyᵀ·hidden. Same products and the
// same element-wise arithmetic as linear(swiglu(gate, up)), so the same values (hidden is recomputed bit for bit).
//
// Under FP8 (ops/fp8_linear.h) with hidden not kept, hidden exists only as the projection's E4M3 codes: the forward's
// element-wise pass writes them (and their amax) in place of bf16, and so does the backward's, for dW. A tensor's
// first cast (no scale yet) takes the bf16 path above.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// gate, up [..., F] (same shape, dtype, device; on the GPU they may be row-strided: the column blocks of the fused
// gate/up projection, linear_columns, whose gradients are then written in place); weight [out, F] (linear's contract: an fp32 master weight serves
// bf16 inputs through its bf16 copy). keep_hidden: keep hidden from the forward for the backward (F values per row
// held across the step) instead of recomputing it there. residual (optional, [..., out]): y = residual + hidden·Wᵀ,
// added by the GEMM as in linear.
//
// up_norm (optional): up enters normalised, RMSNorm(up) ⊙ up_norm->weight over runs of group_width features (0: the
// whole row), which makes the op fla's FusedRMSNormGated (swish) followed by the output projection. up is then the
// contiguous norm input, and the norm's output is never stored: one pass makes hidden from up and gate, and one pass
// of the backward makes the gradients of up, gate and the norm's weight (ops/rmsnorm.h: gated_rmsnorm_*), with the
// bits of rmsnorm followed by swiglu_linear.
struct UpNorm {
  Var weight;
  double eps = 0;
  int64_t group_width = 0;
};
Var swiglu_linear(Tape& tape, const Var& gate, const Var& up, const Var& weight, bool keep_hidden,
                  const Var& residual = nullptr, const UpNorm* up_norm = nullptr);

}  // namespace hgrn
