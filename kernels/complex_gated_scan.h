// complex_gated_scan.h: the complex gated linear recurrence of the HGRN1 paper's HGRU on the GPU, forward and
// backward: h_t = e^{g_t} e^{iθ} h_{t−1} + x_t with complex h and x = x_re + i·x_im, as a chunked parallel scan over
// 64-step chunks (kernels/complex_gated_scan.cu says how).
// x_re, x_im: [B, T, C] contiguous, activation dtype (fp32 or bf16); g: [B, T, C] fp32 (log decay); theta: [C] fp32;
// states fp32 [B, 2, C] ([Re; Im]); output [B, T, 2C] contiguous in the activation dtype, row t = [Re h_t, Im h_t].
// The caller provides the scratch and the kept chunk-entry states (sizes below), so that all memory goes through
// hgrn's allocator.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "gated_scan.h"

namespace hgrn {

// Floats of one complex per-chunk buffer: 2·B·(NT − 1)·C with NT = ceil(T / 64), the real parts then the imaginary
// parts (0 when T <= 64: no buffers are needed then). The forward needs two (the chunk-entry states, kept for the
// backward, and one of scratch); the backward two of scratch besides the forward's chunk-entry states.
int64_t complex_gated_scan_cuda_chunk_elements(const GatedScanCudaShape& shape);
// Floats of the backward's θ-gradient scratch: one row of C per (batch, chunk), B·NT·C.
int64_t complex_gated_scan_cuda_theta_rows(const GatedScanCudaShape& shape);

struct ComplexScanCudaForwardArgs {
  const void* x_re = nullptr;
  const void* x_im = nullptr;
  DType act = DType::F32;
  const float* g = nullptr;
  const float* theta = nullptr;
  const float* initial_state = nullptr;  // null: h_{−1} = 0
  void* output = nullptr;
  float* final_state = nullptr;  // null: not written
  // The state entering every chunk but the first (written here; the backward reads it), and one scratch buffer;
  // complex_gated_scan_cuda_chunk_elements floats each (both null when T <= 64).
  float* chunk_states = nullptr;
  float* scratch = nullptr;
  // Per-chunk reset masks [B, ceil(T / 64)] (kernels/sequence_resets.h): a set bit starts its step from the zero
  // state. Null: no resets.
  const uint64_t* reset_masks = nullptr;
};
void complex_gated_scan_cuda_forward(const GatedScanCudaShape& shape, const ComplexScanCudaForwardArgs& args);

struct ComplexScanCudaBackwardArgs {
  const void* x_re = nullptr;
  const void* x_im = nullptr;
  DType act = DType::F32;
  const float* g = nullptr;
  const float* theta = nullptr;
  const float* initial_state = nullptr;
  const float* chunk_states = nullptr;   // the forward's (null when T <= 64)
  const uint64_t* reset_masks = nullptr;  // the forward's
  const void* d_output = nullptr;        // null: zero; else [B, T, 2C] contiguous, act dtype
  const float* d_final_state = nullptr;  // null: zero
  // Null where that gradient is not wanted. accumulate_* true adds into the buffer, false overwrites every element
  // (a fresh buffer). dx_re and dx_im may alias (dx_re is written first). d_theta is always accumulated.
  void* dx_re = nullptr;
  void* dx_im = nullptr;
  float* dg = nullptr;
  float* d_theta = nullptr;
  float* d_initial_state = nullptr;
  bool accumulate_dx_re = true, accumulate_dx_im = true, accumulate_dg = true, accumulate_d_initial_state = true;
  // Scratch: complex_gated_scan_cuda_chunk_elements floats each (null when T <= 64), and
  // complex_gated_scan_cuda_theta_rows floats for d_theta (null when d_theta is).
  float* scratch_a = nullptr;
  float* scratch_b = nullptr;
  float* theta_rows = nullptr;
};
void complex_gated_scan_cuda_backward(const GatedScanCudaShape& shape, const ComplexScanCudaBackwardArgs& args);

}  // namespace hgrn
