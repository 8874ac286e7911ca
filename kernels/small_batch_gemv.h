// small_batch_gemv.h: y (+)= x·Wᵀ for a few rows of x (decoding's tokens), as matrix-vector products that stream the
// weight once: the projections of linear_product_into (src/ops/linear.cpp) when they have at most
// kSmallBatchGemvMaxRows rows, where a GEMM library's tiles and split-K reductions cost more than reading W.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// The most rows of x one launch takes (each warp keeps one fp32 sum per row).
constexpr int64_t kSmallBatchGemvMaxRows = 8;

// Whether cuda_small_batch_gemv takes these operands: fp32 or bf16, 1 to kSmallBatchGemvMaxRows rows, k a multiple of
// a 16-byte pack (8 bf16 or 4 fp32 values) with x and w 16-byte aligned, and x's rows (as fp32) fitting the shared
// memory of a block. Otherwise the caller takes the GEMM.
bool small_batch_gemv_applies(int64_t rows, int64_t n, int64_t k, const void* x, const void* w, DType dtype);

// y[r, j] = Σ_c x[r, c]·w[j, c] for r < rows, j < n, summed in fp32 in an order fixed by the shapes (no atomics: the
// bits repeat launch to launch). x [rows, k] and w [n, k] contiguous, y rows ldy elements apart (a column block of a
// wider buffer), all of one dtype. accumulate: y = y_old + Σ, rounded once to y's dtype (a GEMM's beta 1).
void cuda_small_batch_gemv(const void* x, const void* w, void* y, int64_t ldy, int64_t rows, int64_t n, int64_t k,
                           DType dtype, bool accumulate);

}  // namespace hgrn
