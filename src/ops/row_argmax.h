// row_argmax.h: the index of each row's largest value, e.g. greedy decoding's next token from a batch of logits.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace hgrn {

// x [rows, n] (row-strided) -> out int32 [rows] (contiguous, x's device): per row, the lowest index c < limit
// (0 < limit <= n) of the largest value among x[row, 0 .. limit), NaN never chosen (0 where the first `limit` values
// are all NaN). For finite values this is std::max_element's choice, the host's greedy sample. No tape; allocates
// nothing on the GPU. x: fp32 or bf16 on the GPU, fp32 or fp64 on the CPU.
void row_argmax(const Tensor& x, int64_t limit, Tensor& out);

}  // namespace hgrn
