// activations.h: silu (the query activation), swiglu = silu(gate) ⊙ up (the GatedMLP's activation), fused so
// that the MLP's product is one op with one saved pair of inputs, sigmoid (the complex HGRU's output gate) and
// log_sigmoid (a log gate; GLA's forget gate runs it fused with its projection: ops/low_rank_gate.h).
#pragma once
#include "core/autograd.h"
#include "ops/fp8.h"

namespace hgrn {

// y = x · σ(x).
Var silu(Tape& tape, const Var& x);

// y = σ(x) = 1 / (1 + e^{−x}); x contiguous.
Var sigmoid(Tape& tape, const Var& x);

// y = log σ(x) / divisor (<= 0 for divisor > 0), in out_dtype: x's, or on the GPU fp32 for bf16 or fp32 x (the log
// gates gla_recurrence reads in fp32). x contiguous. dx = dy · σ(−x) / divisor. GLA's forget gate is
// log_sigmoid(x, gate_logit_normalizer) of its low-rank logits, computed in one op by low_rank_log_sigmoid_gate.
Var log_sigmoid(Tape& tape, const Var& x, double divisor, DType out_dtype);

// y = silu(gate) ⊙ up; gate and up have the same shape.
Var swiglu(Tape& tape, const Var& gate, const Var& up);

// The pieces swiglu is made of, for ops that fuse it with what follows (swiglu_linear):
// y = silu(gate) ⊙ up, or silu(gate) when up is null, into y (gate's shape, dtype and device).
void swiglu_forward(const Tensor& gate, const Tensor* up, Tensor& y);
// swiglu's y written as FP8 codes only ([rows, width] contiguous, on gate's device; ops/fp8.h: Fp8CodesOut), its
// amax folded where codes.amax is set: a projection's FP8 input with no act-dtype copy. On the GPU one kernel; on the
// CPU y is made and then cast (the same values).
void swiglu_forward_codes(const Tensor& gate, const Tensor& up, const Fp8CodesOut& codes);
// The gradients of gate and up as FP8 codes (out: the buffer, scale and amax) in columns gate_column and
// up_column of a row-major code matrix [rows, row_width]: a fused projection's output gradient (swiglu_linear).
struct SwigluGradientCodes {
  Fp8CodesOut out;
  int64_t row_width = 0, gate_column = 0, up_column = 0;
};
// The gradients of gate and up (each when it wants one) from dy. recomputed_output (swiglu only; may be null, may
// be dy itself): also y again, each element written after dy's was read. recomputed_codes (swiglu only, in place of
// recomputed_output, no amax): y again as FP8 codes. gradient_codes (swiglu only; both want a gradient and have
// none yet): their gradients written as those codes only, gate's and up's gradient buffers left undefined; on the
// GPU one kernel, on the CPU the gradients made and then cast (the same codes and amax).
void swiglu_backward(const Var& gate, const Var& up, const Tensor& dy, Tensor* recomputed_output,
                     const Fp8CodesOut* recomputed_codes = nullptr,
                     const SwigluGradientCodes* gradient_codes = nullptr);

}  // namespace hgrn
