// gated_scan.h: HGRN1's token mixer, the elementwise gated linear recurrence (fla's HGRN):
//   h_t = e^{g_t} ⊙ h_{t−1} + x_t,   o_t = h_t,   h_{−1} = initial state (or 0),
// independently per batch and channel. Two exact CPU forms with hand-written backwards: the step-by-step scan and
// fla's chunk_hgrn (chunk-local scans from zero with the cumulative log decay, then the carry across chunks); on the
// GPU a chunked parallel scan (kernels/gated_scan.h).
#pragma once
#include <cstdint>

#include "core/autograd.h"

namespace hgrn {

// Sequential: step by step. Chunk: fla's two-pass chunkwise form.
enum class ScanMode { Sequential, Chunk };

struct GatedScanOutputs {
  Var output;       // [B, T, C]
  Var final_state;  // [B, C]
};

// x, g: [B, T, C]; g is the log decay (<= 0). initial_state: nullptr or [B, C], contiguous.
// CPU: all tensors share one floating dtype (fp32 or fp64), the state is kept in it; x and g may be row-strided (read
// through contiguous copies). chunk_size: the chunk form's chunk length (ignored by Sequential); 0 = 64; any positive
// length works, the last chunk may be partial.
// CUDA: x in the activation dtype (fp32 or bf16), g, initial_state and the final state fp32, the state carried in
// fp32; the output in x's dtype. x and g may be row-strided (column blocks of a fused projection's output), and
// their gradients are then written into their places in the whole tensor's gradient. Both modes run the same
// chunked kernels with 64-step chunks (chunk_size is ignored there); the forward keeps the state entering each chunk
// (B·(ceil(T/64) − 1)·C floats) for the backward.
// Gradients flow to x, g and initial_state (each only if it wants one) from both outputs' gradients (either may be
// absent).
// resets (optional): int32 [B, T] on x's device, nonzero where the state before step t is zero (ops/sequence_resets.h):
// h_t = x_t there, whatever came before (the initial state included), and dg_t = 0.
GatedScanOutputs gated_scan(Tape& tape, const Var& x, const Var& g, const Var& initial_state,
                            ScanMode mode = ScanMode::Chunk, int64_t chunk_size = 0, const Tensor& resets = Tensor());

}  // namespace hgrn
