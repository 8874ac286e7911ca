// elementwise.h: the residual add on the GPU, and the gradient accumulation (dst += src) that add's and reshape's
// backward reduce to; the elementwise product and the bias add (the complex HGRU's output gate and projection
// biases). Act dtype (fp32 or bf16), contiguous, n elements; arithmetic in fp32.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// y = a + b. y may alias a or b.
void cuda_add(const void* a, const void* b, void* y, int64_t n, DType dtype);
// dst += src.
void cuda_accumulate(void* dst, const void* src, int64_t n, DType dtype);
// dst (+)= scale[0] · factor · src: src fp32, dst fp32 or bf16 (dst_dtype), scale one fp32 on the device (an upstream
// gradient, read there: no host sync); accumulate = false overwrites dst. For a gradient computed before the
// factor it is scaled by was known (the fused LM head's, which is computed in the forward).
void cuda_scaled_accumulate(void* dst, DType dst_dtype, const float* src, const float* scale, float factor,
                            bool accumulate, int64_t n);

// y = a ⊙ b.
void cuda_mul(const void* a, const void* b, void* y, int64_t n, DType dtype);
// da (+)= dy ⊙ b, db (+)= dy ⊙ a: add_a / add_b true accumulates, false overwrites every element. Either may be null
// (not wanted); they may alias (mul(x, x)): da is written before db is read, by the same thread.
void cuda_mul_backward(const void* a, const void* b, const void* dy, void* da, void* db, bool add_a, bool add_b,
                       int64_t n, DType dtype);

// y = x + bias over rows of `width`: x and y act dtype [rows, width] contiguous, bias fp32 [width].
void cuda_add_bias(const void* x, const float* bias, void* y, int64_t rows, int64_t width, DType dtype);
// dbias += Σ_rows dy (fp32, accumulated), reduced without atomics in a fixed order (column_sums.cuh): the bits
// repeat run to run.
void cuda_add_bias_backward(const void* dy, float* dbias, int64_t rows, int64_t width, DType dtype);

}  // namespace hgrn
