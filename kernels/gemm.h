// gemm.h: the GPU matrix multiply every projection uses, through cuBLASLt (tensor cores for bf16, fp32 accumulate).
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// Row-major, the same contract as gemm_cpu: C[m, n] = alpha · op(A) · op(B) + beta · C, where op(A) is [m, k]
// (A is stored [m, k] with leading dimension lda, or [k, m] when trans_a) and op(B) is [k, n] (stored [k, n], or
// [n, k] when trans_b). A and B share ab_dtype (fp32 or bf16); C is fp32 or bf16. Accumulation is always fp32:
// fp32 inputs use true fp32 (no TF32), so the fp32 GPU path stays comparable to the CPU reference.
// c_in non-null (with beta != 0): the addend is read from c_in instead of C, C = alpha · op(A) · op(B) + beta · c_in,
// c_in laid out like C; the sum is rounded to C's dtype once (a residual added in the GEMM's epilogue).
void cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
               const void* b, int64_t ldb, DType ab_dtype, float beta, void* c, int64_t ldc, DType c_dtype,
               const void* c_in = nullptr);

}  // namespace hgrn

namespace hgrn {
// The GPU's measured bf16 tensor-core throughput (TFLOP/s): the best of a few 8192³ GEMMs (fp32 accumulate).
// The denominator of the MFU the trainer and `hgrn bench` print: measured, not the datasheet's figure.
double measure_bf16_gemm_tflops();
// The other ceiling a kernel is held to: the GPU's measured memory bandwidth, the best of a few 1 GiB
// device-to-device copies, as bytes read plus bytes written per second (GB/s). Measured here, next to the GEMM rate,
// with the same timing helper.
double measure_device_copy_gbps();

// Autotuning: off (the default), each GEMM shape uses cuBLASLt's first heuristic choice, a deterministic choice, so
// that runs and resumed runs repeat bit for bit. On, the first call of each shape times up to 8 of cuBLASLt's
// candidate algorithms and keeps the fastest: faster (the heuristic is poor for some shapes, e.g. [32768 x 1024] x
// [1024 x 1024] on Hopper), but timing noise may pick another algorithm in another process, and algorithms differ in
// summation order, so results are reproducible only within one process. training.deterministic switches it.
void set_gemm_autotune(bool enabled);
}  // namespace hgrn
