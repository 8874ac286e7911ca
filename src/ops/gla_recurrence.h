// gla_recurrence.h: gated linear attention (GLA), the token-mixing recurrence of HGRN2 (the HGRU2: key k = 1 − λ),
// GLA and RetNet (a constant decay per head).
// Per batch and head a K×V matrix state evolves as S_t = Diag(e^{g_t}) S_{t−1} + k_tᵀ v_t and is read out as
// o_t = scale · q_t S_t. Two exact CPU forms with hand-written backwards: the step-by-step recurrence and fla's
// chunkwise form (spec section 7); the chunkwise one is the reference the CUDA kernel is held to.
#pragma once
#include <cstdint>

#include "core/autograd.h"
#include "ops/hgrn2_gates.h"

namespace hgrn {

// Naive: step-by-step recurrence. Chunk: chunkwise form (spec section 7).
enum class RecurrenceMode { Naive, Chunk };

struct GlaOutputs {
  Var output;       // [B, T, H*V]
  Var final_state;  // [B, H, K, V]
};

// q, k: [B, T, H*K]; v: [B, T, H*V] (head-major features: index h*K + c). g, the log forget gate (<= 0), is one of
//  * [B, T, H*K]: per step and key channel (HGRN2, GLA);
//  * [B, T, H]: a scalar decay per head and step, shared by the head's key channels (its gradient is [B, T, H]);
//  * [H]: one constant log decay per head (RetNet's fixed decays; a constant: no gradient).
// The scalar ones run the scalar-decay mode of the same forms on the CPU and of the same kernels on CUDA (the decay
// factors out of the intra-chunk channel sums: one q kᵀ product per chunk, one decay per pair).
// q, k and v may be row-strided (column blocks of one fused projection's output: linear_columns), in every decay
// mode: they are read in place, and a column block's gradient is written into its columns of the projection's
// gradient; g and initial_state are contiguous.
// initial_state: nullptr or [B, H, K, V]. On the CPU all tensors share one floating dtype (fp32 or fp64), and the state
// is accumulated in that dtype (fp32 for fp32 inputs, as fla does).
// On CUDA (kernels/gla_recurrence.h): q, k, v in the activation dtype (fp32 or bf16), g and initial_state fp32; the
// output is in v's dtype, the final state fp32; K <= 256. Both modes run the chunkwise kernels with 64-step chunks
// (chunk_size is ignored there), and the backward recomputes the per-chunk states (unless keep_states, below).
// chunk_size: the chunk length BT of the chunkwise form (ignored by Naive); 0 = fla's choice
// min(64, max(16, next_pow2(T))). Any positive length works; the last chunk may be partial.
// Gradients flow to q, k, v, g and initial_state (each only if it wants one) from both outputs' gradients.
// gates (optional): where q, g and k are a layer's HGRN2 gates (hgrn2_gates' origin, with exactly these q, g, k): on
// the GPU the backward then forms q̂'s, f̂'s and γ's gradients itself where nothing else gave q, g or k a gradient
// (the same function; Hgrn2GatesOrigin), instead of storing dq, dk and dg for the gates' backward.
// keep_states: on the GPU, the forward's per-chunk states (B·H·ceil(T/64)·K·V in the activation dtype) are kept for
// the backward, which then skips the state pass that recomputes them (the same bits: a memory-for-time trade). The CPU
// backward always recomputes them.
// resets (optional): int32 [B, T] on q's device, nonzero where the state before step t is zero (ops/sequence_resets.h):
// S_t = k_tᵀ v_t there, whatever came before (the initial state included), and g_t gets no gradient through the decay
// it would have applied.
GlaOutputs gla_recurrence(Tape& tape, const Var& q, const Var& k, const Var& v, const Var& g,
                              const Var& initial_state, int64_t num_heads, double scale, RecurrenceMode mode,
                              int64_t chunk_size = 0, std::shared_ptr<const Hgrn2GatesOrigin> gates = nullptr,
                              bool keep_states = false, const Tensor& resets = Tensor());

}  // namespace hgrn
