// gemm.cu: cuda_gemm (gemm.h) on cuBLASLt. Row-major C = op(A)·op(B) is computed as the column-major product
// Cᵀ = op(B)ᵀ·op(A)ᵀ, which needs no data movement: a row-major [r, c] matrix is a column-major [c, r] one.
// The algorithm for each distinct problem (shapes, strides, dtypes, beta) is chosen once by cuBLASLt's heuristic and
// cached: a training step repeats the same few dozen GEMMs, and the heuristic query costs more than a small GEMM.
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include "core/env_flag.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "gemm.h"

namespace hgrn {

void* cuda_alloc(size_t bytes);  // allocator.cu: the caching allocator
void cuda_free(void* ptr);

namespace {
cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: throw Error(std::string("cuda_gemm: no GPU GEMM for dtype ") + dtype_name(d) + " (fp32 or bf16)");
  }
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The last two: beta != 0, and the addend read from another buffer than the output (c_in != c), for which cuBLASLt
// runs other kernels than in place.
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, bool>;

bool autotune = false;

// The best time of `reps` runs of launch() on the compute stream, the first run only warming up (clocks, caches,
// cuBLASLt's own set-up). launch() returns false when it could not run; then the time is "never" (1e30 ms).
template <typename Launch>
float best_time_ms(int reps, Launch&& launch) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int rep = 0; rep < reps; ++rep) {
    CUDA_CHECK(cudaEventRecord(start, cuda_stream()));
    const bool ran = launch();
    CUDA_CHECK(cudaEventRecord(stop, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    if (!ran) {
      best = 1e30f;
      break;
    }
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && ms < best) best = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// HGRN_GEMM_LOG=1: one line per timed candidate (its tile and split-K configuration, time and rate), to see why a
// shape runs slower in a step than its best algorithm could.
void log_algo(const cublasLtMatmulAlgo_t& algo, int index, float ms, double flops) {
  int tile = 0, split_k = 0, stages = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
  std::fprintf(stderr, "  candidate %d: tile %d split-k %d stages %d: %.1f us, %.0f TFLOP/s\n", index, tile, split_k,
               stages, ms * 1e3, flops / (ms * 1e-3) / 1e12);
}

// c_in_ptr: the addend of an out-of-place GEMM (else null), which the timing runs read as theirs will.
Plan make_plan(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
               DType ab_dtype, DType c_dtype, bool accumulate, const void* a_ptr, const void* b_ptr,
               const void* c_in_ptr) {
  Plan p;
  const cudaDataType_t ab = cuda_type(ab_dtype), ct = cuda_type(c_dtype);
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major operands: first = B (op(B)ᵀ is [n, k]), second = A (op(A)ᵀ is [k, m]).
  cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  // Stored shapes (column-major rows x cols) of the first and second operand.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, trans_b ? k : n, trans_b ? n : k, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, trans_a ? m : k, trans_a ? k : m, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, ct, n, m, ldc));

  cublasLtMatmulHeuristicResult_t results[8] = {};
  const int found = cublaslt_algorithms(p.op, p.a, p.b, p.c, autotune ? 8 : 1, results);
  HGRN_CHECK(found > 0, "cuBLASLt has no algorithm for a ", m, "x", n, "x", k, " GEMM (", dtype_name(ab_dtype), " -> ",
             dtype_name(c_dtype), ", accumulate ", accumulate, ")");
  p.algo = results[0].algo;
  static const bool log = env_flag("HGRN_GEMM_LOG");
  if (log)
    std::fprintf(stderr, "gemm %s%s m %lld n %lld k %lld %s -> %s%s: %d candidate(s)\n", trans_a ? "T" : "N",
                 trans_b ? "T" : "N", static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                 dtype_name(ab_dtype), dtype_name(c_dtype),
                 c_in_ptr ? " (accumulate, addend apart)" : accumulate ? " (accumulate)" : "", found);
  if (found > 1) {
    void* scratch = cuda_alloc(static_cast<size_t>(m) * ldc * dtype_size(c_dtype));
    size_t workspace_bytes = 0;
    void* workspace = cublaslt_workspace(&workspace_bytes);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const void* addend = c_in_ptr ? c_in_ptr : scratch;  // an out-of-place addend is only read
    p.algo = results[cublaslt_fastest(results, found, 2.0 * m * n * k, [&](const cublasLtMatmulAlgo_t& algo) {
                       return cublasLtMatmul(cublaslt_handle(), p.op, &alpha, b_ptr, p.a, a_ptr, p.b, &beta, addend,
                                             p.c, scratch, p.c, &algo, workspace, workspace_bytes,
                                             cuda_stream()) == CUBLAS_STATUS_SUCCESS;
                     })].algo;
    cuda_free(scratch);
  }
  return p;
}
}  // namespace

void set_gemm_autotune(bool enabled) { autotune = enabled; }
bool gemm_autotune_enabled() { return autotune; }

int cublaslt_fastest(const cublasLtMatmulHeuristicResult_t* results, int found, double flops,
                     const std::function<bool(const cublasLtMatmulAlgo_t&)>& run) {
  static const bool log = env_flag("HGRN_GEMM_LOG");
  float best = 1e30f;
  int chosen = 0;
  for (int i = 0; i < found; ++i) {
    const float ms = best_time_ms(4, [&] { return run(results[i].algo); });
    if (log) log_algo(results[i].algo, i, ms, flops);
    if (ms < best) {
      best = ms;
      chosen = i;
    }
  }
  if (log) std::fprintf(stderr, "  chose candidate %d\n", chosen);
  return chosen;
}

void cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
               const void* b, int64_t ldb, DType ab_dtype, float beta, void* c, int64_t ldc, DType c_dtype,
               const void* c_in) {
  if (m == 0 || n == 0) return;
  if (!c_in) c_in = c;
  if (k == 0) {  // cuBLASLt rejects k = 0; the product is empty, so C = beta·c_in
    HGRN_CHECK(beta == 0.0f || beta == 1.0f, "cuda_gemm: k = 0 with beta ", beta);
    if (beta == 1.0f && c_in != c)
      CUDA_CHECK(cudaMemcpy2DAsync(c, ldc * dtype_size(c_dtype), c_in, ldc * dtype_size(c_dtype),
                                   n * dtype_size(c_dtype), m, cudaMemcpyDeviceToDevice, cuda_stream()));
    if (beta == 0.0f)
      for (int64_t r = 0; r < m; ++r)
        CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(c) + r * ldc * dtype_size(c_dtype), 0, n * dtype_size(c_dtype),
                                   cuda_stream()));
    return;
  }
  static std::mutex mutex;
  static std::map<Key, Plan>* plans = new std::map<Key, Plan>();  // never destroyed, like the handle it uses
  const bool apart = beta != 0.0f && c_in != c;
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, static_cast<int>(ab_dtype), static_cast<int>(c_dtype),
                beta != 0.0f, apart};
  const Plan* plan;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans->find(key);
    if (it == plans->end())
      it = plans
               ->emplace(key, make_plan(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab_dtype, c_dtype, beta != 0.0f, a, b,
                                        apart ? c_in : nullptr))
               .first;
    plan = &it->second;
  }
  size_t workspace_bytes = 0;
  void* workspace = cublaslt_workspace(&workspace_bytes);
  CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), plan->op, &alpha, b, plan->a, a, plan->b, &beta, c_in, plan->c, c,
                              plan->c, &plan->algo, workspace, workspace_bytes, cuda_stream()));
}

}  // namespace hgrn

namespace hgrn {

double measure_bf16_gemm_tflops() {
  const int64_t n = 8192;
  void *a = nullptr, *c = nullptr;
  CUDA_CHECK(cudaMallocAsync(&a, n * n * 2, cuda_stream()));  // A serves as both operands; values do not matter
  CUDA_CHECK(cudaMallocAsync(&c, n * n * 4, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(a, 0, n * n * 2, cuda_stream()));
  const double best_ms = best_time_ms(6, [&] {
    cuda_gemm(false, true, n, n, n, 1.0f, a, n, a, n, DType::BF16, 0.0f, c, n, DType::F32);
    return true;
  });
  CUDA_CHECK(cudaFreeAsync(a, cuda_stream()));
  CUDA_CHECK(cudaFreeAsync(c, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  return 2.0 * n * n * n / (best_ms * 1e-3) / 1e12;
}

double measure_device_copy_gbps() {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMallocAsync(&src, bytes, cuda_stream()));
  CUDA_CHECK(cudaMallocAsync(&dst, bytes, cuda_stream()));
  CUDA_CHECK(cudaMemsetAsync(src, 0, bytes, cuda_stream()));
  const double best_ms = best_time_ms(6, [&] {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
    return true;
  });
  CUDA_CHECK(cudaFreeAsync(src, cuda_stream()));
  CUDA_CHECK(cudaFreeAsync(dst, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
}

}  // namespace hgrn
