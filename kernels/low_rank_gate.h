// low_rank_gate.h: a gate made by a low-rank projection through a log-sigmoid on the GPU, forward and backward
// (src/ops/low_rank_gate.h has the maths and the CPU reference): y = log σ(u·Wᵀ + b) / divisor with u [rows, rank]
// in fp32 or bf16 (row-strided: a column block of a fused projection's output), W [out, rank] and b [out] fp32
// parameters, y fp32; every sum in fp32. The logits are never stored: the backward makes them again from u, W and b.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// The widest rank the kernels take (W's tile lives in shared memory).
constexpr int64_t kLowRankGateMaxRank = 64;

struct LowRankGateShape {
  int64_t rows = 0, out = 0, rank = 0;
  int64_t u_stride = 0;  // elements between u's rows (0: rank, contiguous)
};

// y [rows, out] (contiguous) = log σ(u·Wᵀ + b) / divisor.
void cuda_low_rank_gate_forward(const void* u, DType u_dtype, const float* weight, const float* bias, float divisor,
                                float* y, const LowRankGateShape& shape);

// The backward of cuda_low_rank_gate_forward from dy [rows, out] (fp32, contiguous), with d = dy·σ(−x)/divisor:
// du (+)= d·W (u's dtype, rows du_stride elements apart; add_du false overwrites every element), dbias += Σ_rows d
// (fp32), and dᵀ·u as partial sums over blocks of rows into dweight_partials (cuda_low_rank_gate_weight_partials
// floats), which cuda_low_rank_gate_add_weight_partials adds into the weight's gradient: a separate step, so that a
// weight gradient can wait (ops/linear.h: WeightGradientQueue). Each output may be null (not computed). The sums over
// rows and over the outputs take a fixed order set by the shape alone (no atomics).
struct LowRankGateBackwardArgs {
  const void* u = nullptr;
  DType u_dtype = DType::F32;
  const float* weight = nullptr;
  const float* bias = nullptr;
  const float* dy = nullptr;
  float divisor = 1.0f;
  void* du = nullptr;
  int64_t du_stride = 0;  // 0: rank
  bool add_du = false;
  float* dweight_partials = nullptr;
  float* dbias = nullptr;
  LowRankGateShape shape;
};
void cuda_low_rank_gate_backward(const LowRankGateBackwardArgs& args);
int64_t cuda_low_rank_gate_weight_partials(const LowRankGateShape& shape);
// dweight [out, rank] += the partial sums, in their fixed order.
void cuda_low_rank_gate_add_weight_partials(const float* partials, float* dweight, const LowRankGateShape& shape);

}  // namespace hgrn
