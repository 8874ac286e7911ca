// complex_gated_scan.h: the complex gated linear recurrence of the HGRN1 paper's HGRU (Qin et al., NeurIPS 2023):
//   h_t = e^{g_t} · e^{iθ} · h_{t−1} + x_t,   h_{−1} = initial state (or 0),
// per batch and channel, with h and x complex (x = x_re + i·x_im), g the real log decay (<= 0) and θ a real rotation
// angle per channel, the same at every step. Two exact CPU forms with hand-written backwards: step by step, and
// chunkwise (chunk-local scans from zero, then the carry e^{G_t} e^{inθ} h_{start−1} across chunks), as gated_scan.
#pragma once
#include <cstdint>

#include "core/autograd.h"
#include "ops/gated_scan.h"

namespace hgrn {

struct ComplexGatedScanOutputs {
  Var output;       // [B, T, 2C]: row t is [Re h_t, Im h_t], the concatenation the paper's output gate reads
  Var final_state;  // [B, 2, C]: [Re h_{T−1}; Im h_{T−1}]
};

// x_re, x_im, g: [B, T, C] (row-strided views are read through contiguous copies); theta: [C]; initial_state: nullptr
// or [B, 2, C] laid out as final_state. On the CPU all tensors share one floating dtype (fp32 or fp64), in which the
// state is kept; on the GPU x_re, x_im and the output are fp32 or bf16, g, theta and the states fp32 (the chunked
// kernels of kernels/complex_gated_scan.h, 64-step chunks whatever mode and chunk_size say).
// chunk_size: the chunk form's length (ignored by Sequential); 0 = 64; the last chunk may be partial.
// Gradients flow to x_re, x_im, g, theta and initial_state (each only if it wants one) from both outputs' gradients
// (either may be absent).
// resets (optional): int32 [B, T] on x's device, nonzero where the state before step t is zero (ops/sequence_resets.h):
// h_t = x_t there, and neither g_t nor θ gets a gradient from that step's (absent) decay.
ComplexGatedScanOutputs complex_gated_scan(Tape& tape, const Var& x_re, const Var& x_im, const Var& g,
                                           const Var& theta, const Var& initial_state,
                                           ScanMode mode = ScanMode::Chunk, int64_t chunk_size = 0,
                                           const Tensor& resets = Tensor());

}  // namespace hgrn
