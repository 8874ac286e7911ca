// rmsnorm.h: RMSNorm on the GPU, forward and backward. x, y and their gradients are act dtype (fp32 or bf16)
// [rows, width], contiguous; the weight, its gradient and the saved rstd are fp32; statistics are computed in fp32.
// (The model's residual adds happen in the GEMM epilogues before the norms: src/ops/linear.h.)
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// y = x̂ · w with x̂ = x · rstd, rstd = (mean(x²) + eps)^(-1/2) per row (written to rstd [rows]); weight may be null
// (y = x̂).
void cuda_rmsnorm_forward(const void* x, const float* weight, void* y, float* rstd, int64_t rows, int64_t width,
                          double eps, DType dtype);

// The backward: with g = ∂y/∂x · dy, writes dx (+)= g (null: not wanted): add true accumulates, false overwrites
// every element (a fresh buffer). dweight += Σ_rows dy ⊙ x̂ (fp32; null for none; always accumulated). dy null: no
// gradient reached y (nothing but y below is written). dweight is reduced in a fixed order (no atomics): bits repeat
// run to run. y non-null: also writes the forward's output x̂ · w again, with the forward's arithmetic (the same
// bits), for a caller that freed it (ops/recompute.h).
void cuda_rmsnorm_backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx, bool add,
                           float* dweight, void* y, int64_t rows, int64_t width, DType dtype);

}  // namespace hgrn
