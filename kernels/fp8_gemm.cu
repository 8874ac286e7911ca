// fp8_gemm.cu: the scaled FP8 GEMM on cuBLASLt (fp8.h). cuBLASLt's FP8 kernels take one layout only, "TN" in its
// column-major terms: its A transposed, its B not, i.e. both operands with the reduced dimension k contiguous. In
// hgrn's row-major terms that is C = A·Bᵀ with A [m, k] and B [n, k], computed as the column-major Cᵀ = B·Aᵀ (as in
// gemm.cu): cuBLASLt's A is our B (transposed), its B our A. The algorithm of each problem is cuBLASLt's first
// heuristic choice, cached, so that results repeat bit for bit; with GEMM autotuning on (set_gemm_autotune, gemm.h)
// the fastest of its candidates, timed on the first call's operands.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda_check.h"
#include "cuda_context.h"
#include "fp8.h"

namespace hgrn {

void* cuda_alloc(size_t bytes);  // allocator.cu: the caching allocator
void cuda_free(void* ptr);

namespace {

cudaDataType_t cuda_type(Fp8Format format) { return format == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

struct Fp8Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
};

// m, n, k, lda, ldb, ldc, our A's and B's formats, C's dtype, beta != 0, fast accumulation, the addend read from
// another buffer than the output.
using Fp8Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, bool, bool, bool>;

void set_scale_pointers(const Fp8Plan& p, const Fp8Matrix& a, const Fp8Matrix& b) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b.scale_inverse,
                                              sizeof b.scale_inverse));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.scale_inverse,
                                              sizeof a.scale_inverse));
}

// c_in: the addend of an out-of-place GEMM (else null), which timing runs read as the real ones will.
Fp8Plan make_plan(const std::string& what, int64_t m, int64_t n, int64_t k, const Fp8Matrix& a, int64_t lda,
                  const Fp8Matrix& b, int64_t ldb, bool accumulate, const void* c_in, int64_t ldc, DType c_dtype,
                  bool fast_accumulation) {
  Fp8Plan p;
  // The compute type cuBLASLt's FP8 kernels require; alpha, beta and the A/B scales are fp32.
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof transposed));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof plain));
  const int8_t fast = fast_accumulation ? 1 : 0;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  set_scale_pointers(p, a, b);  // the heuristic sees the descriptor as every call will use it
  // Column-major stored shapes: cuBLASLt's A is our B, k x n; its B is our A, k x m; C is n x m.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(b.format), k, n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(a.format), k, m, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF, n, m, ldc));
  cublasLtMatmulHeuristicResult_t results[8] = {};
  const int found = cublaslt_algorithms(p.op, p.a, p.b, p.c, gemm_autotune_enabled() ? 8 : 1, results);
  HGRN_CHECK(found > 0, what, ": cuBLASLt has no FP8 algorithm for m ", m, " n ", n, " k ", k, " (",
             fp8_format_name(a.format), " x ", fp8_format_name(b.format), " -> ", dtype_name(c_dtype), ", accumulate ",
             accumulate, ", fast accumulation ", fast_accumulation, ")");
  p.algo = results[0].algo;
  if (found > 1) {
    void* scratch = cuda_alloc(static_cast<size_t>(m) * ldc * dtype_size(c_dtype));
    size_t workspace_bytes = 0;
    void* workspace = cublaslt_workspace(&workspace_bytes);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const void* addend = c_in ? c_in : scratch;
    p.algo = results[cublaslt_fastest(results, found, 2.0 * m * n * k, [&](const cublasLtMatmulAlgo_t& algo) {
                       return cublasLtMatmul(cublaslt_handle(), p.op, &alpha, b.codes, p.a, a.codes, p.b, &beta, addend,
                                             p.c, scratch, p.c, &algo, workspace, workspace_bytes,
                                             cuda_stream()) == CUBLAS_STATUS_SUCCESS;
                     })].algo;
    cuda_free(scratch);
  }
  return p;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Every constraint of cuBLASLt's FP8 kernels checked before any GPU call, so that a bad shape is a clear error and
// not a cuBLAS status; `what` names the caller's GEMM.
void check_fp8_gemm(const std::string& what, int64_t m, int64_t n, int64_t k, const Fp8Matrix& a, int64_t lda,
                    const Fp8Matrix& b, int64_t ldb, const void* c, const void* c_in, int64_t ldc, DType c_dtype) {
  const std::string problem = detail::concat(what, " (m ", m, ", n ", n, ", k ", k, "; A ", fp8_format_name(a.format),
                                             " [m, k] lda ", lda, ", B ", fp8_format_name(b.format), " [n, k] ldb ",
                                             ldb, ", C ", dtype_name(c_dtype), " [m, n] ldc ", ldc, ")");
  HGRN_CHECK(m > 0 && n > 0 && k > 0 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0, problem,
             ": cuBLASLt's FP8 GEMM needs m, n and k positive multiples of 16");
  HGRN_CHECK(lda >= k && ldb >= k && ldc >= n, problem, ": a leading dimension is smaller than its row");
  HGRN_CHECK(c_dtype == DType::F32 || c_dtype == DType::BF16, problem, ": the output must be fp32 or bf16");
  HGRN_CHECK(lda % 16 == 0 && ldb % 16 == 0 && (ldc * dtype_size(c_dtype)) % 16 == 0, problem,
             ": cuBLASLt's FP8 GEMM needs every row 16-byte aligned (lda and ldb multiples of 16, ldc of ",
             16 / dtype_size(c_dtype), ")");
  HGRN_CHECK(!(a.format == Fp8Format::E5M2 && b.format == Fp8Format::E5M2), problem,
             ": E5M2 x E5M2 is not supported (cuBLASLt has no such kernel); one operand must be E4M3");
  HGRN_CHECK(a.codes && b.codes && c && a.scale_inverse && b.scale_inverse, problem,
             ": null operand, output or scale pointer");
  HGRN_CHECK(aligned16(a.codes) && aligned16(b.codes) && aligned16(c) && aligned16(c_in), problem,
             ": the operands, the output and the addend must start 16-byte aligned");
  HGRN_CHECK(aligned16(a.scale_inverse) && aligned16(b.scale_inverse), problem,
             ": the scale pointers must be 16-byte aligned (cuBLASLt answers NOT_SUPPORTED otherwise)");
  const cudaDeviceProp& props = cuda_device_properties();
  HGRN_CHECK(props.major * 10 + props.minor >= 89, problem,
             ": FP8 tensor cores need compute capability 8.9 or newer (Ada, Hopper); ", props.name, " is sm_",
             props.major, props.minor);
}

void fp8_gemm(const std::string& what, int64_t m, int64_t n, int64_t k, const Fp8Matrix& a, int64_t lda,
              const Fp8Matrix& b, int64_t ldb, float beta, void* c, int64_t ldc, DType c_dtype,
              bool fast_accumulation, const void* c_in) {
  if (!c_in) c_in = c;
  check_fp8_gemm(what, m, n, k, a, lda, b, ldb, c, c_in, ldc, c_dtype);
  const bool apart = beta != 0.0f && c_in != c;
  static std::mutex mutex;
  static std::map<Fp8Key, Fp8Plan>* plans = new std::map<Fp8Key, Fp8Plan>();  // never destroyed, like the handle
  const Fp8Key key{m, n, k, lda, ldb, ldc, static_cast<int>(a.format), static_cast<int>(b.format),
                   static_cast<int>(c_dtype), beta != 0.0f, fast_accumulation, apart};
  // The scale pointers differ from call to call on one cached descriptor: set and enqueued under the lock.
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans->find(key);
  if (it == plans->end())
    it = plans
             ->emplace(key, make_plan(what, m, n, k, a, lda, b, ldb, beta != 0.0f, apart ? c_in : nullptr, ldc, c_dtype,
                                      fast_accumulation))
             .first;
  const Fp8Plan& plan = it->second;
  set_scale_pointers(plan, a, b);
  size_t workspace_bytes = 0;
  void* workspace = cublaslt_workspace(&workspace_bytes);
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), plan.op, &alpha, b.codes, plan.a, a.codes, plan.b, &beta, c_in,
                              plan.c, c, plan.c, &plan.algo, workspace, workspace_bytes, cuda_stream()));
}

}  // namespace

void cuda_fp8_gemm(int64_t m, int64_t n, int64_t k, const Fp8Matrix& a, int64_t lda, const Fp8Matrix& b, int64_t ldb,
                   float beta, void* c, int64_t ldc, DType c_dtype, bool fast_accumulation, const void* c_in) {
  fp8_gemm("cuda_fp8_gemm C = A·Bᵀ", m, n, k, a, lda, b, ldb, beta, c, ldc, c_dtype, fast_accumulation, c_in);
}

void cuda_fp8_linear_gemm(Fp8LinearGemm gemm, int64_t rows, int64_t in_features, int64_t out_features,
                          const Fp8Matrix& a, const Fp8Matrix& b, float beta, void* out, DType out_dtype,
                          bool fast_accumulation) {
  const std::string sizes =
      detail::concat(" with rows ", rows, ", in_features ", in_features, ", out_features ", out_features);
  int64_t m = 0, n = 0, k = 0;
  std::string what;
  switch (gemm) {
    case Fp8LinearGemm::Forward:
      m = rows, n = out_features, k = in_features;
      what = "fp8 linear forward Y[rows, out] = X[rows, in]·W[out, in]ᵀ" + sizes;
      break;
    case Fp8LinearGemm::InputGrad:
      m = rows, n = in_features, k = out_features;
      what = "fp8 linear input gradient dX[rows, in] = dY[rows, out]·(Wᵀ[in, out])ᵀ" + sizes;
      break;
    case Fp8LinearGemm::WeightGrad:
      m = out_features, n = in_features, k = rows;
      what = "fp8 linear weight gradient dW[out, in] = dYᵀ[out, rows]·(Xᵀ[in, rows])ᵀ" + sizes;
      break;
  }
  // Dense operands: each row holds exactly k codes, and the output rows n values.
  fp8_gemm(what, m, n, k, a, k, b, k, beta, out, n, out_dtype, fast_accumulation, nullptr);
}

}  // namespace hgrn
