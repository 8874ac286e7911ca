// gemm_cpu.cpp: OpenBLAS cblas_sgemm / cblas_dgemm wrappers (row-major).
#include "ops/gemm_cpu.h"

#include <cblas.h>

extern "C" void openblas_set_num_threads(int);

namespace hgrn {

static CBLAS_TRANSPOSE op(bool t) { return t ? CblasTrans : CblasNoTrans; }

template <>
void gemm_cpu<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <>
void gemm_cpu<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                      const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_cpu_set_threads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

}  // namespace hgrn
