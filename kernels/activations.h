// activations.h: silu and swiglu = silu(gate) ⊙ up on the GPU, forward and backward. Act dtype (fp32 or bf16),
// contiguous, n elements; arithmetic in fp32.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// y = silu(gate) ⊙ up, or y = silu(gate) when up is null.
void cuda_swiglu_forward(const void* gate, const void* up, void* y, int64_t n, DType dtype);
// Accumulates dgate += ∂y/∂gate · dy and dup += silu(gate) · dy; either may be null (no gradient wanted).
// up null: the silu backward (dup must be null).
void cuda_swiglu_backward(const void* gate, const void* up, const void* dy, void* dgate, void* dup, int64_t n,
                          DType dtype);

}  // namespace hgrn
