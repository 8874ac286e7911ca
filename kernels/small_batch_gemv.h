// small_batch_gemv.h: y (+)= x·Wᵀ for a few rows of x (decoding's tokens), as matrix-vector products that stream the
// weight once: the projections of linear_product_into (src/ops/linear.cpp) when they have at most
// kSmallBatchGemvMaxRows rows, where a GEMM library's tiles and split-K reductions cost more than reading W.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// The most rows of x one launch takes (each warp keeps one fp32 sum per row).
constexpr int64_t kSmallBatchGemvMaxRows = 8;

// One row whose weights take at least this many bytes runs at 32 warps a block, one block an SM (more loads in flight);
// fewer bytes, or more rows, at 8 warps a block on half the GPU, so that the next kernel's blocks start beside it.
constexpr int64_t kSmallBatchGemvWideBytes = int64_t{16} << 20;

// How the kernel makes the rows it multiplies from x (each block stages them once, so that no launch and no buffer of
// their own are needed): x as it is; RMSNorm'd, x·rstd·w with rstd = (mean(x²) + eps)^−½ per row (norm_weight: fp32
// [k]; decoding's pre-norms), as rstd·Σ (x·w)·W in fp32, the normed row never rounded to x's dtype; or SwiGLU,
// silu(x)·up with x the gate (the MLP's activation; activations.h's arithmetic), rounded to x's dtype as swiglu
// stores it. x's and up's rows are x_stride and up_stride elements apart (0: k; column blocks of the MLP's fused
// gate/up output).
struct GemvInput {
  const float* norm_weight = nullptr;
  float eps = 0.f;
  const void* up = nullptr;
  int64_t x_stride = 0, up_stride = 0;
};

// Whether cuda_small_batch_gemv takes these operands: fp32 or bf16, 1 to kSmallBatchGemvMaxRows rows, k a multiple of
// a 16-byte pack (8 bf16 or 4 fp32 values) with x and w 16-byte aligned, and x's rows (as fp32) fitting the shared
// memory of a block. Otherwise the caller takes the GEMM.
bool small_batch_gemv_applies(int64_t rows, int64_t n, int64_t k, const void* x, const void* w, DType dtype);

// y[r, j] = Σ_c x[r, c]·w[j, c] for r < rows, j < n, summed in fp32 in an order fixed by the shapes (no atomics: the
// bits repeat launch to launch). x [rows, k] and w [n, k] contiguous, of one dtype; y rows ldy elements apart (a
// column block of a wider buffer), of y_dtype: x's, or fp32 for bf16 x (decoding's logits). accumulate: y = y_old + Σ,
// rounded once to y's dtype (a GEMM's beta 1). input (may be null: x as it is) says how x becomes the multiplied rows
// (GemvInput; strides on 16 bytes, up aligned).
void cuda_small_batch_gemv(const void* x, const void* w, void* y, DType y_dtype, int64_t ldy, int64_t rows, int64_t n,
                           int64_t k, DType dtype, bool accumulate, const GemvInput* input = nullptr);

}  // namespace hgrn
