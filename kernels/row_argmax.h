// row_argmax.h: the GPU kernel of row_argmax (src/ops/row_argmax.h): per row, the lowest index of the largest
// non-NaN value among its first `limit` (0 where all are NaN).
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// x: `rows` rows `stride` elements apart, fp32 or bf16; out: int32 [rows]. One block per row; deterministic (the
// choice does not depend on the order of the comparisons).
void cuda_row_argmax(const void* x, DType dtype, int64_t rows, int64_t stride, int64_t limit, int32_t* out);

}  // namespace hgrn
