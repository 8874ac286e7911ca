// activations.h: silu and swiglu = silu(gate) ⊙ up on the GPU, forward and backward. Act dtype (fp32 or bf16),
// contiguous, n elements; arithmetic in fp32.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// y = silu(gate) ⊙ up, or y = silu(gate) when up is null.
void cuda_swiglu_forward(const void* gate, const void* up, void* y, int64_t n, DType dtype);
// dgate (+)= ∂y/∂gate · dy and dup (+)= silu(gate) · dy: add_gate / add_up true accumulates, false overwrites
// (every element is written). Either may be null (no gradient wanted); they may alias (dgate is written first).
// up null: the silu backward (dup must be null). y (may be null, may be dy itself): also the forward's output again,
// for a backward that recomputes it (swiglu_linear).
void cuda_swiglu_backward(const void* gate, const void* up, const void* dy, void* dgate, void* dup, void* y,
                          bool add_gate, bool add_up, int64_t n, DType dtype);

}  // namespace hgrn
