// lower_bounded_gated_scan.h: HGRN1's whole token-mixer recurrence on the GPU in one op, forward and backward
// (src/ops/lower_bounded_gated_scan.h has the maths): from î and f̂, per element the decay λ = e^g of the
// lower-bounded forget gate, u = silu(î)·(1 − λ), and the scan h_t = λ_t h_{t−1} + u_t over 64-step chunks
// (kernels/lower_bounded_gated_scan.cu says how). Only o and the chunk-entry states are stored; the backward
// recomputes λ and u from î and f̂ and reads h_{t−1} from o.
// î, f̂: [B, T, C] in the activation dtype (fp32 or bf16), rows *_stride elements apart (column blocks of a fused
// projection's output); γ row, states: fp32; o: [B, T, C] contiguous in the activation dtype.
// The caller provides the scratch and the kept chunk-entry states (sizes below), so that all memory goes through
// hgrn's allocator.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

struct LowerBoundedScanCudaShape {
  int64_t batch = 0, time = 0, channels = 0;
};

// The chunk length of the kernels (fixed; the last chunk may be partial).
constexpr int64_t kLowerBoundedScanCudaChunk = 64;
// Floats of one per-chunk buffer: B·(NT − 1)·C with NT = ceil(T / 64) (0 when T <= 64: no buffer is needed then).
// The forward needs two (the chunk-entry states, kept for the backward, and one of scratch); the backward two of
// scratch besides the forward's chunk-entry states.
int64_t lower_bounded_scan_cuda_chunk_elements(const LowerBoundedScanCudaShape& shape);
// Floats of the backward's workspace for γ's gradient: B·NT·C partial sums (one per batch, chunk and channel).
int64_t lower_bounded_scan_cuda_dgamma_workspace(const LowerBoundedScanCudaShape& shape);

struct LowerBoundedScanCudaForwardArgs {
  const void* i_hat = nullptr;
  int64_t i_stride = 0;  // elements between rows; 0 = C (contiguous)
  const void* f_hat = nullptr;
  int64_t f_stride = 0;
  DType act = DType::F32;
  const float* gamma_row = nullptr;      // [C]; null: the unbounded gate g = logsigmoid(f̂)
  const float* initial_state = nullptr;  // null: h_{−1} = 0
  void* output = nullptr;                // contiguous, act dtype
  float* final_state = nullptr;          // null: not written
  // The state entering every chunk but the first (written here; the backward reads it), and one scratch buffer;
  // lower_bounded_scan_cuda_chunk_elements floats each (both null when T <= 64).
  float* chunk_states = nullptr;
  float* scratch = nullptr;
  // Per-chunk reset masks [B, ceil(T / 64)] (kernels/sequence_resets.h): a set bit starts its step from the zero
  // state (h_{t−1} taken as 0). Null: no resets.
  const uint64_t* reset_masks = nullptr;
};
void lower_bounded_scan_cuda_forward(const LowerBoundedScanCudaShape& shape, const LowerBoundedScanCudaForwardArgs& args);

struct LowerBoundedScanCudaBackwardArgs {
  const void* i_hat = nullptr;
  int64_t i_stride = 0;
  const void* f_hat = nullptr;
  int64_t f_stride = 0;
  DType act = DType::F32;
  const float* gamma_row = nullptr;
  const float* initial_state = nullptr;
  const float* chunk_states = nullptr;   // the forward's (null when T <= 64)
  const uint64_t* reset_masks = nullptr;  // the forward's
  const void* output = nullptr;          // the forward's o (h in the activation dtype): h_{t−1} of the gradients
  const void* d_output = nullptr;        // null: zero; else contiguous, act dtype
  const float* d_final_state = nullptr;  // null: zero
  // Null where that gradient is not wanted. accumulate_* true adds into the buffer, false overwrites every element
  // (a fresh buffer: no zero fill, no read-back). di and df may be row-strided (0 = C); they must not overlap.
  void* di = nullptr;
  int64_t di_stride = 0;
  void* df = nullptr;
  int64_t df_stride = 0;
  float* d_initial_state = nullptr;
  bool accumulate_di = true, accumulate_df = true, accumulate_d_initial_state = true;
  // dγ_row += Σ over B·T (needs gamma_row and a workspace of lower_bounded_scan_cuda_dgamma_workspace floats); the
  // sum is taken in a fixed order: per (batch, chunk) by one thread, then over them by add_chunk_sums.
  float* dgamma_row = nullptr;
  float* workspace = nullptr;
  // Scratch, lower_bounded_scan_cuda_chunk_elements floats each (null when T <= 64).
  float* scratch_a = nullptr;
  float* scratch_b = nullptr;
};
void lower_bounded_scan_cuda_backward(const LowerBoundedScanCudaShape& shape,
                                      const LowerBoundedScanCudaBackwardArgs& args);

// One token for decoding (src/ops/lower_bounded_gated_scan.h, lower_bounded_gated_scan_step): per sequence b, one
// block over its C channels, h ← λ ⊙ h + silu(î) ⊙ (1 − λ) with the state read and written once in place, then
// out = RMSNorm(h) ⊙ w ⊙ silu(ĝ) (the norm's sum of squares in a fixed order). Allocates nothing.
struct LowerBoundedScanStepArgs {
  int64_t batch = 0, channels = 0;
  DType act = DType::F32;                         // î, f̂, ĝ and out: fp32 or bf16
  const void* i_hat = nullptr;                    // [B, C], rows i_stride elements apart
  const void* f_hat = nullptr;                    // [B, C], rows f_stride apart
  const void* g_hat = nullptr;                    // [B, C], rows g_stride apart
  int64_t i_stride = 0, f_stride = 0, g_stride = 0;
  const float* gamma_row = nullptr;  // [C]; null: the unbounded gate
  float* state = nullptr;            // [B, C] fp32, in place
  const float* norm_weight = nullptr;  // [C]
  float eps = 0.f;
  void* out = nullptr;  // [B, C] contiguous
};
void lower_bounded_scan_cuda_step(const LowerBoundedScanStepArgs& args);

}  // namespace hgrn
