// lower_bounded_gla_step.h: one token of HGRN2's token-mixing recurrence with its gates, for decoding: the state
// read and written once in place, the gates computed where q̂ and f̂ are read. Per sequence b and head h:
//   q = silu(q̂),  λ = e^g with g the lower-bounded log forget gate of f̂ (hgrn2_forget_gate),  k = 1 − λ,
//   S ← Diag(λ) S + kᵀ v,   o = scale · q S.
// The CPU reference is exactly hgrn2_gates followed by gla_recurrence on one position (what HGRN2's op-by-op decoding
// step runs); the GPU is one kernel (kernels/lower_bounded_gla_step.h). No tape: decoding takes no gradients.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace hgrn {

// q_hat, f_hat [B, H·K] and v [B, H·V]: row-strided (column blocks of the fused q/f/i projection's output), one
// dtype. gamma: the layers' lower bounds [L, H·K] (lower_bound_transform), or undefined (no bounds); layer 0 is
// unbounded. state [B, H, K, V] contiguous, updated in place; out [B, H·V] contiguous.
// CPU: every tensor in one floating dtype (fp32 or fp64). CUDA: q̂, f̂, v and out in the activation dtype (fp32 or
// bf16), gamma and state fp32, K <= 1024; nothing is allocated (the step can be captured in a CUDA graph).
void lower_bounded_gla_step(const Tensor& q_hat, const Tensor& f_hat, const Tensor& v, const Tensor& gamma,
                            int64_t layer, int64_t num_heads, double scale, Tensor& state, Tensor& out);

}  // namespace hgrn
