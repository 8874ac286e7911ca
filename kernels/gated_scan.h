// gated_scan.h: the elementwise gated linear recurrence h_t = e^{g_t} h_{t−1} + x_t, o_t = h_t on the GPU, forward
// and backward, as a chunked parallel scan over 64-step chunks (kernels/gated_scan.cu says how).
// x: [B, T, C] in the activation dtype (fp32 or bf16), rows x_stride elements apart; g: [B, T, C] fp32 (log decay),
// rows g_stride apart; states fp32 [B, C]; output [B, T, C] contiguous in the activation dtype.
// The caller provides the scratch and the kept chunk-entry states (sizes below), so that all memory goes through
// hgrn's allocator.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

struct GatedScanCudaShape {
  int64_t batch = 0, time = 0, channels = 0;
};

// The chunk length of the CUDA kernels (fixed; the last chunk may be partial).
constexpr int64_t kGatedScanCudaChunk = 64;
// Floats of one per-chunk buffer: B·(NT − 1)·C with NT = ceil(T / 64) (0 when T <= 64: no buffers are needed then).
// The forward needs two (the chunk-entry states, kept for the backward, and one of scratch); the backward two of
// scratch besides the forward's chunk-entry states.
int64_t gated_scan_cuda_chunk_elements(const GatedScanCudaShape& shape);

struct GatedScanCudaForwardArgs {
  const void* x = nullptr;
  int64_t x_stride = 0;  // elements between x's rows; 0 = C (contiguous)
  DType act = DType::F32;
  const float* g = nullptr;
  int64_t g_stride = 0;                  // 0 = C
  const float* initial_state = nullptr;  // null: h_{−1} = 0
  void* output = nullptr;                // contiguous, act dtype
  float* final_state = nullptr;          // null: not written
  // The state entering every chunk but the first (written here; the backward reads it), and one scratch buffer;
  // gated_scan_cuda_chunk_elements floats each (both null when T <= 64).
  float* chunk_states = nullptr;
  float* scratch = nullptr;
  // Per-chunk reset masks [B, ceil(T / 64)] (kernels/sequence_resets.h): a set bit starts its step from the zero
  // state. Null: no resets.
  const uint64_t* reset_masks = nullptr;
};
void gated_scan_cuda_forward(const GatedScanCudaShape& shape, const GatedScanCudaForwardArgs& args);

struct GatedScanCudaBackwardArgs {
  const void* x = nullptr;
  int64_t x_stride = 0;
  DType act = DType::F32;
  const float* g = nullptr;
  int64_t g_stride = 0;
  const float* initial_state = nullptr;
  const float* chunk_states = nullptr;   // the forward's (null when T <= 64)
  const uint64_t* reset_masks = nullptr;  // the forward's
  const void* d_output = nullptr;        // null: zero; else contiguous, act dtype
  const float* d_final_state = nullptr;  // null: zero
  // Null where that gradient is not wanted. accumulate_* true adds into the buffer, false overwrites every element
  // (a fresh buffer: no zero fill, no read-back). dx and dg may be row-strided (0 = C).
  void* dx = nullptr;
  int64_t dx_stride = 0;
  float* dg = nullptr;
  int64_t dg_stride = 0;
  float* d_initial_state = nullptr;
  bool accumulate_dx = true, accumulate_dg = true, accumulate_d_initial_state = true;
  // Scratch, gated_scan_cuda_chunk_elements floats each (null when T <= 64).
  float* scratch_a = nullptr;
  float* scratch_b = nullptr;
};
void gated_scan_cuda_backward(const GatedScanCudaShape& shape, const GatedScanCudaBackwardArgs& args);

}  // namespace hgrn
