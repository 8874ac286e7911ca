// gemm_cpu.h: the CPU matrix product behind every projection, C = alpha·op(A)·op(B) + beta·C in row-major layout.
// Backed by OpenBLAS (Debian's libopenblas), which is blocked, vectorised and threaded.
#pragma once
#include <cstdint>

namespace hgrn {

template <typename T>
void gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Sets the number of threads OpenBLAS uses (0 = leave its default: all cores).
void gemm_cpu_set_threads(int threads);

}  // namespace hgrn
