// fp8.h: the GPU pieces of FP8 linear layers, each the device counterpart of a CPU reference in ops/fp8.h: the scaled
// cast that reports its input's amax, the cast that also writes the transpose, the transpose of codes already cast, the
// delayed-scaling update, and the scaled FP8 GEMMs of a linear layer through cuBLASLt, for ops/fp8_linear.h
// (docs/fp8.md).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "ops/fp8.h"

namespace hgrn {

// out[i] = fp8_from_float(x[i] · *scale) for n contiguous elements of x (fp32, or bf16 widened to fp32), the product
// rounded to fp32 and cast by __nv_cvt_float_to_fp8(·, __NV_SATFINITE, format): fp8_quantize on the GPU. `scale` is a
// device fp32 (delayed scaling keeps it on the GPU). `amax`, a device fp32 or null, becomes max(*amax, fp8_amax(x)),
// so that several casts of one tensor in a step fold into one value (fp8_record_amax); it must hold a non-negative
// value (0 at the start of a step), since it is folded as integer bits. The result does not depend on the order of
// the reduction.
void cuda_fp8_quantize(const void* x, DType x_dtype, int64_t n, const float* scale, Fp8Format format, uint8_t* out,
                       float* amax);

// The same cast of a row-major [rows, cols] x writing its transpose out_t ([cols, rows], row-major) and, where `out`
// is not null, the untransposed out ([rows, cols]) too, from one read of x. The backward GEMMs need Wᵀ, Xᵀ and dYᵀ
// with the reduced dimension contiguous (cuda_fp8_linear_gemm).
void cuda_fp8_quantize_transpose(const void* x, DType x_dtype, int64_t rows, int64_t cols, const float* scale,
                                 Fp8Format format, uint8_t* out, uint8_t* out_t, float* amax);

// codes_t ([cols, rows], row-major) = the transpose of the row-major [rows, cols] FP8 codes, byte for byte, by the
// transposed cast's tiles. The cast is elementwise, so codes cast once and transposed are the codes the transposed
// cast writes at the same scale: a weight cast for the forward gives Wᵀ for the input gradient without a second read
// of its fp32 values.
void cuda_fp8_transpose_codes(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* codes_t);

// The end-of-step delayed-scaling update of `tensors` tensors of one format, one warp each: tensor t's state is
// amax_history[t·history_length, (t + 1)·history_length), positions[t] (within the history) and scales[t], all on
// the device, laid out as Fp8ScalingState's fields. Where step_amax (a device array of `tensors`, or null) is given,
// step_amax[t] is first folded into the current slot (fp8_record_amax) and reset to 0 for the next step; then
// fp8_update_scale(state, format, margin), bit for bit.
void cuda_fp8_update_scales(float* amax_history, int64_t history_length, int64_t* positions, float* scales,
                            float* step_amax, int64_t tensors, Fp8Format format, int margin);

// inverses[i · stride] = fp8_scale_inverse(scales[i]) (1 / scale in fp32) for n device floats: the factors the GEMMs
// read, each `stride` floats apart (cuBLASLt's scale pointers need at least 16-byte alignment).
void cuda_fp8_scale_inverses(const float* scales, float* inverses, int64_t n, int64_t stride);

// An FP8 matrix on the GPU: its codes, their format and a device fp32 holding the dequantising factor 1 / scale
// (fp8_scale_inverse), which cuBLASLt multiplies the products by.
struct Fp8Matrix {
  const uint8_t* codes = nullptr;
  Fp8Format format = Fp8Format::E4M3;
  const float* scale_inverse = nullptr;
};

// C[m, n] = a_scale_inv · b_scale_inv · A · Bᵀ + beta · C_in in hgrn's row-major terms, A stored [m, k] (leading
// dimension lda) and B stored [n, k] (ldb), both with k contiguous: fp8_gemm_cpu(false, true, ...) on the GPU. C is
// fp32 or bf16 (leading dimension ldc); accumulation is fp32. fast_accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM):
// the tensor cores' partial sums are never promoted to full fp32 along k; faster, less accurate (Transformer Engine
// uses it for the forward GEMM only). This is the one layout cuBLASLt's FP8 kernels take ("TN" in its column-major
// terms). Refused with an hgrn::Error naming the shapes: m, n or k not a positive multiple of 16, leading dimensions
// or pointers not 16-byte aligned, E5M2 x E5M2, C neither fp32 nor bf16, a GPU older than sm_89 (Ada, Hopper).
// C_in is c itself (in place) unless c_in is given: then it is read from there, laid out as C, and left unchanged.
void cuda_fp8_gemm(int64_t m, int64_t n, int64_t k, const Fp8Matrix& a, int64_t lda, const Fp8Matrix& b, int64_t ldb,
                   float beta, void* c, int64_t ldc, DType c_dtype, bool fast_accumulation,
                   const void* c_in = nullptr);

// The three GEMMs of a linear layer Y = X·Wᵀ (X [rows, in], W [out, in]), each as one cuda_fp8_gemm on dense
// operands, with the operands it takes (a, b) and what it writes:
//   Forward:    a = X [rows, in],   b = W [out, in]    -> Y [rows, out]  = X·Wᵀ
//   InputGrad:  a = dY [rows, out], b = Wᵀ [in, out]   -> dX [rows, in]  = dY·W
//   WeightGrad: a = dYᵀ [out, rows], b = Xᵀ [in, rows] -> dW [out, in]   = dYᵀ·X (beta = 1 accumulates into dW)
// The transposed operands come from cuda_fp8_quantize_transpose. rows, in_features and out_features must be
// multiples of 16 (the refusal names the GEMM and the three sizes).
enum class Fp8LinearGemm { Forward, InputGrad, WeightGrad };
void cuda_fp8_linear_gemm(Fp8LinearGemm gemm, int64_t rows, int64_t in_features, int64_t out_features,
                          const Fp8Matrix& a, const Fp8Matrix& b, float beta, void* out, DType out_dtype,
                          bool fast_accumulation);

}  // namespace hgrn
