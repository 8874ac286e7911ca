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

}  // namespace hgrn
