// cast.h: dtype conversion and fill on the GPU (what Tensor::to(dtype), copy_from and fill use for CUDA tensors).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// dst[i] = src[i] converted, for float dtypes (fp32, bf16, fp64) and int32/int64; n elements, contiguous.
void cuda_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);
// bytes zero bytes at dst (0 in every dtype), at memset speed.
void cuda_zero(void* dst, size_t bytes);
// dst[i] = value, any dtype.
void cuda_fill(void* dst, DType dtype, double value, int64_t n);

}  // namespace hgrn
