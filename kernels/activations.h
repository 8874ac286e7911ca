// activations.h: silu and swiglu = silu(gate) ⊙ up on the GPU, forward and backward, the sigmoid (the complex
// HGRU's output gate) and log σ (a log gate). Act dtype (fp32 or bf16);
// arithmetic in fp32. The tensors are `rows` rows of `width` elements: gate, up and their gradients may be
// row-strided (rows *_stride elements apart: column blocks of a fused projection's output), y and dy are contiguous.
// A contiguous problem is one row of n elements.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "ops/fp8.h"

namespace hgrn {

struct SwigluRows {
  int64_t rows = 0, width = 0;
  int64_t gate_stride = 0, up_stride = 0, dgate_stride = 0, dup_stride = 0;  // 0: width (contiguous rows)
  // The backward's gradient codes (below): the code matrix's row width, and the first columns of dgate's and dup's.
  int64_t codes_width = 0, dgate_column = 0, dup_column = 0;
};
// y = silu(gate) ⊙ up, or y = silu(gate) when up is null. codes (swiglu only): the output as FP8 codes in place of y
// (y unused), their amax folded where codes->amax is set (ops/fp8.h: Fp8CodesOut).
void cuda_swiglu_forward(const void* gate, const void* up, void* y, const SwigluRows& shape, DType dtype,
                         const Fp8CodesOut* codes = nullptr);
// dgate (+)= ∂y/∂gate · dy and dup (+)= silu(gate) · dy: add_gate / add_up true accumulates, false overwrites
// (every element is written). Either may be null (no gradient wanted); they may alias (dgate is written first).
// up null: the silu backward (dup must be null). y (may be null, may be dy itself): also the forward's output again,
// for a backward that recomputes it (swiglu_linear). codes (swiglu only, y null, no amax): that output as FP8 codes
// instead, at the forward's scale. gradient_codes (swiglu only; dgate and dup null, nothing added): the two gradients
// as FP8 codes instead, into columns shape.dgate_column and shape.dup_column of a row-major code matrix of
// shape.codes_width columns, their amax folded where gradient_codes->amax is set.
void cuda_swiglu_backward(const void* gate, const void* up, const void* dy, void* dgate, void* dup, void* y,
                          bool add_gate, bool add_up, const SwigluRows& shape, DType dtype,
                          const Fp8CodesOut* codes = nullptr, const Fp8CodesOut* gradient_codes = nullptr);

// y = log σ(x) / divisor over n contiguous elements; x in x_dtype (fp32 or bf16), y in y_dtype (x's or fp32).
void cuda_log_sigmoid_forward(const void* x, DType x_dtype, void* y, DType y_dtype, float divisor, int64_t n);
// dx (+)= dy · σ(−x) / divisor: dx in x_dtype, dy in dy_dtype (the output's); add true accumulates, false overwrites.
void cuda_log_sigmoid_backward(const void* x, DType x_dtype, const void* dy, DType dy_dtype, void* dx, bool add,
                               float divisor, int64_t n);

// y = σ(x) over n contiguous elements.
void cuda_sigmoid_forward(const void* x, void* y, int64_t n, DType dtype);
// dx (+)= dy · y · (1 − y) from the forward's output y: add true accumulates, false overwrites every element.
void cuda_sigmoid_backward(const void* y, const void* dy, void* dx, bool add, int64_t n, DType dtype);

}  // namespace hgrn
