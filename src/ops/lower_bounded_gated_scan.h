// lower_bounded_gated_scan.h: HGRN1's token-mixer recurrence as one op (fla's HGRNAttention between its projections
// and its norm): from the input and forget projections î and f̂,
//   g = the lower-bounded log forget gate of f̂ (hgrn2_forget_gate: logsigmoid(f̂), or log(γ + (1 − γ)·σ(f̂))),
//   u = silu(î) ⊙ (1 − e^g),   h_t = e^{g_t} ⊙ h_{t−1} + u_t,   o_t = h_t,   h_{−1} = initial state (or 0).
// On the CPU exactly the composition hgrn2_forget_gate, input_gate_from_forget, swiglu and gated_scan (the
// reference); on the GPU one chunked scan that computes the gates where it reads î and f̂ and stores nothing but o and
// the chunk-entry states (kernels/lower_bounded_gated_scan.h); its backward recomputes the gates.
#pragma once
#include <cstdint>

#include "core/autograd.h"
#include "ops/gated_scan.h"

namespace hgrn {

// i_hat, f_hat: [B, T, C], one dtype, row-strided (column blocks of a fused projection's output); their gradients go
// into their places in the whole tensor's gradient. gamma: nullptr (no lower bound) or [L, C], the layers' bounds
// (lower_bound_transform); layer 0 is unbounded and never touches gamma's gradient. initial_state: nullptr or [B, C].
// CPU: everything in one floating dtype (fp32 or fp64); mode picks gated_scan's form. CUDA: î and f̂ (and the output)
// in the activation dtype (fp32 or bf16), gamma, the states and their gradients fp32; mode is ignored (one chunked
// form). Gradients flow to î, f̂, gamma and initial_state (each only if it wants one) from both outputs' gradients
// (either may be absent); γ's is a per-channel sum over B·T, taken in a fixed order.
// resets (optional): int32 [B, T] as gated_scan's: h_{t−1} counts as 0 at a reset step, so h_t = u_t there (u still
// holds 1 − e^g, through which g keeps its gradient).
GatedScanOutputs lower_bounded_gated_scan(Tape& tape, const Var& i_hat, const Var& f_hat, const Var& gamma,
                                          int64_t layer, const Var& initial_state, ScanMode mode = ScanMode::Chunk,
                                          const Tensor& resets = Tensor());

// One token of the recurrence for decoding, with the output norm HGRN1 puts after it (fla's FusedRMSNormGated): the
// state read and written once, in place, and no tape.
//   h ← e^g ⊙ h + silu(î) ⊙ (1 − e^g),   out = RMSNorm(h) ⊙ norm_weight ⊙ silu(ĝ)   (RMSNorm over the C channels)
// The CPU reference is exactly HGRN1's op-by-op step: this op on one position (Sequential), rmsnorm and
// swiglu(ĝ, ·); the GPU is one kernel (kernels/lower_bounded_gated_scan.h).
// i_hat, f_hat, g_hat [B, C]: row-strided (column blocks of the fused projection's output), one dtype; gamma and layer
// as above; state [B, C] contiguous, updated in place; norm_weight [C]; out [B, C] contiguous.
// CPU: every tensor in one floating dtype. CUDA: î, f̂, ĝ and out in the activation dtype (fp32 or bf16), gamma, state
// and norm_weight fp32; nothing is allocated (the step can be captured in a CUDA graph).
void lower_bounded_gated_scan_step(const Tensor& i_hat, const Tensor& f_hat, const Tensor& gamma, int64_t layer,
                                   Tensor& state, const Tensor& g_hat, const Tensor& norm_weight, double eps,
                                   Tensor& out);

}  // namespace hgrn
