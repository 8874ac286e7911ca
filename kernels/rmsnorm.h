// rmsnorm.h: RMSNorm and the fused residual add + RMSNorm on the GPU, forward and backward. x, y and their
// gradients are act dtype (fp32 or bf16) [rows, width], contiguous; the weight, its gradient and the saved rstd are
// fp32; statistics are computed in fp32.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// y = x̂ · w with x̂ = x · rstd, rstd = (mean(x²) + eps)^(-1/2) per row (written to rstd [rows]); weight may be null
// (y = x̂). With delta non-null this is add_rmsnorm: s = x + delta is written to `sum` (rounded to the act dtype)
// and the rounded s is normalised, so the result equals add followed by rmsnorm.
void cuda_rmsnorm_forward(const void* x, const void* delta, void* sum, const float* weight, void* y, float* rstd,
                          int64_t rows, int64_t width, double eps, DType dtype);

// The backward, with x the tensor that was normalised (add_rmsnorm: the saved sum). With g = dsum + ∂y/∂x · dy,
// writes dx0 (+)= g and dx1 (+)= g (add_rmsnorm: the residual's and the delta's gradients; each may be null): add0 /
// add1 true accumulates, false overwrites every element (a fresh buffer). dx0 and dx1 may alias (one tensor as both
// inputs): dx0 is written first, so pass add1 = true then. dweight += Σ_rows dy ⊙ x̂ (fp32; null for none; always
// accumulated). dy null: no gradient reached y (g = dsum, dweight untouched); dsum null: no extra gradient. dweight
// is reduced in a fixed order (no atomics): bits repeat run to run. y non-null: also writes the forward's output
// x̂ · w again, with the forward's arithmetic (the same bits), for a caller that freed it (ops/recompute.h).
void cuda_rmsnorm_backward(const void* x, const float* weight, const float* rstd, const void* dy, const void* dsum,
                           void* dx0, void* dx1, bool add0, bool add1, float* dweight, void* y, int64_t rows,
                           int64_t width, DType dtype);

}  // namespace hgrn
