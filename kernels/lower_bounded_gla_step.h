// lower_bounded_gla_step.h: the GPU kernel of lower_bounded_gla_step (src/ops/lower_bounded_gla_step.h): one token of
// HGRN2's recurrence with its gates, S ← Diag(λ) S + kᵀ v and o = scale · q S per sequence and head, the fp32 state
// read and written once in place. Deterministic (fixed-order sums, no atomics); allocates nothing.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

struct LowerBoundedGlaStepArgs {
  int64_t batch = 0, heads = 0, key_dim = 0, value_dim = 0;  // K <= 1024
  DType act = DType::F32;                                    // q̂, f̂, v and out: fp32 or bf16
  const void* q_hat = nullptr;                               // [B, H·K], rows q_hat_stride elements apart
  const void* f_hat = nullptr;                               // [B, H·K], rows f_hat_stride apart
  const void* v = nullptr;                                   // [B, H·V], rows v_stride apart
  int64_t q_hat_stride = 0, f_hat_stride = 0, v_stride = 0;
  const float* gamma_row = nullptr;  // γ_ℓ [H·K]; null: the unbounded gate (layer 0, or no lower bounds)
  float scale = 1.f;
  float* state = nullptr;  // [B, H, K, V] fp32, in place
  void* out = nullptr;     // [B, H·V] contiguous
};
void cuda_lower_bounded_gla_step(const LowerBoundedGlaStepArgs& args);

}  // namespace hgrn
