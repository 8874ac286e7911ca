// layernorm.h: LayerNorm over the last axis on the GPU, forward and backward: y = (x − μ) · rstd ⊙ w + b with
// rstd = (var(x) + eps)^(-1/2) (the biased variance). x, y and their gradients are act dtype (fp32 or bf16)
// [rows, width], contiguous; the weight, the bias, their gradients and the saved mean and rstd are fp32; statistics
// are computed in fp32.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// weight and bias may each be null (ones / zeros). Writes y and the per-row mean and rstd [rows].
void cuda_layernorm_forward(const void* x, const float* weight, const float* bias, void* y, float* mean, float* rstd,
                            int64_t rows, int64_t width, double eps, DType dtype);

// With x̂ = (x − μ) · rstd and u = dy ⊙ w: dx (+)= rstd · (u − mean(u) − x̂ · mean(u ⊙ x̂)) (null: not wanted; add true
// accumulates, false overwrites every element); dweight += Σ_rows dy ⊙ x̂ and dbias += Σ_rows dy (fp32, each null
// for none, always accumulated), reduced without atomics in a fixed order (column_sums.cuh): bits repeat run to run.
void cuda_layernorm_backward(const void* x, const float* weight, const float* mean, const float* rstd, const void* dy,
                             void* dx, bool add, float* dweight, float* dbias, int64_t rows, int64_t width,
                             DType dtype);

}  // namespace hgrn
