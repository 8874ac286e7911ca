// elementwise.h: the residual add on the GPU, and the gradient accumulation (dst += src) that add's and reshape's
// backward reduce to. Act dtype (fp32 or bf16), contiguous, n elements; arithmetic in fp32.
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

}  // namespace hgrn
