// gemm.cu: cuda_gemm (gemm.h) on cuBLASLt. Row-major C = op(A)·op(B) is computed as the column-major product
// Cᵀ = op(B)ᵀ·op(A)ᵀ, which needs no data movement: a row-major [r, c] matrix is a column-major [c, r] one.
// The algorithm for each distinct problem (shapes, strides, dtypes, beta) is chosen once and cached: a training step
// repeats the same few dozen GEMMs, and the heuristic query costs more than a small GEMM. With autotuning, the choice
// is made in two rounds: the candidates are timed alone (make_plan), then the close ones again in place, inside the
// step (InPlaceTrial), where clocks, power and caches are the step's own.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

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

// The second round of autotuning. Timed alone (best of 3), the candidates of a shape often lie within a few percent of
// each other, and which one wins moved from process to process; in the step the same picks differed by up to ~2.7 ms
// of GEMM time in a ~190 ms hgrn2-385m step (session 28, H200). So the candidates within kInPlaceMargin of the best
// lone time take turns at the shape's real calls, each between two events, until every one has kInPlaceSamples
// samples whose events have completed (checked without waiting; after kInPlaceMaxRounds rounds, waited for); the
// lowest in-place time wins. Every candidate computes the same product, so only the summation order (and speed) of
// those first calls differs: the autotuned, non-deterministic mode already allows that.
constexpr float kInPlaceMargin = 1.10f;
constexpr int kInPlaceCandidates = 4, kInPlaceSamples = 2, kInPlaceMaxRounds = 16;
std::mutex plans_mutex;  // cuda_gemm's plans and their trials
int g_trials_started = 0, g_trials_settled = 0;  // for the tests (gemm_in_place_trials)

struct InPlaceTrial {
  std::vector<cublasLtMatmulAlgo_t> algos;                       // in the lone timing's order, best first
  std::vector<std::vector<std::pair<cudaEvent_t, cudaEvent_t>>> samples;  // per candidate: start, stop
  int calls = 0;
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};  // the choice; while trial is set, the lone timing's best
  std::unique_ptr<InPlaceTrial> trial;  // non-null while the candidates are being timed in place
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

// Times one algorithm (best of 3 runs after one warm-up) into a scratch output; the addend is the scratch itself, or
// for an out-of-place GEMM the caller's c_in (only read).
float time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, const void* c_in,
                void* c_scratch, float beta) {
  size_t workspace_bytes = 0;
  void* workspace = cublaslt_workspace(&workspace_bytes);
  const float alpha = 1.0f;
  const void* addend = c_in ? c_in : c_scratch;
  return best_time_ms(4, [&] {
    return cublasLtMatmul(cublaslt_handle(), p.op, &alpha, b, p.a, a, p.b, &beta, addend, p.c, c_scratch, p.c, &algo,
                          workspace, workspace_bytes, cuda_stream()) == CUBLAS_STATUS_SUCCESS;
  });
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

  size_t workspace_bytes = 0;
  cublaslt_workspace(&workspace_bytes);
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), p.op, p.a, p.b, p.c, p.c, pref, autotune ? 8 : 1,
                                              results, &found));
  cublasLtMatmulPreferenceDestroy(pref);
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
    std::vector<float> lone(found);
    for (int i = 0; i < found; ++i) {
      lone[i] = time_algo(p, results[i].algo, a_ptr, b_ptr, c_in_ptr, scratch, accumulate ? 1.0f : 0.0f);
      if (log) log_algo(results[i].algo, i, lone[i], 2.0 * m * n * k);
    }
    cuda_free(scratch);
    std::vector<int> order(found);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return lone[x] < lone[y]; });
    p.algo = results[order[0]].algo;
    auto trial = std::make_unique<InPlaceTrial>();
    for (int i : order)
      if (static_cast<int>(trial->algos.size()) < kInPlaceCandidates && lone[i] < 1e29f &&
          lone[i] <= lone[order[0]] * kInPlaceMargin)
        trial->algos.push_back(results[i].algo);
    if (log)
      std::fprintf(stderr, "  alone, candidate %d was fastest; %zu within %.0f%% to time in place\n", order[0],
                   trial->algos.size(), (kInPlaceMargin - 1.0f) * 100.0f);
    if (trial->algos.size() > 1) {
      trial->samples.resize(trial->algos.size());
      p.trial = std::move(trial);
      ++g_trials_started;
    }
  }
  return p;
}

// Ends the trial: each candidate's best in-place time, the lowest wins. Every sample's events have completed.
void settle_trial(Plan& p) {
  InPlaceTrial& t = *p.trial;
  static const bool log = env_flag("HGRN_GEMM_LOG");
  int chosen = 0;
  float best = 1e30f;
  for (size_t i = 0; i < t.samples.size(); ++i) {
    float fastest = 1e30f;
    for (auto& [start, stop] : t.samples[i]) {
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      fastest = std::min(fastest, ms);
      CUDA_CHECK(cudaEventDestroy(start));
      CUDA_CHECK(cudaEventDestroy(stop));
    }
    if (log)
      std::fprintf(stderr, "gemm in place: close candidate %zu: %.1f us (best of %zu calls)\n", i, fastest * 1e3,
                   t.samples[i].size());
    if (fastest < best) {
      best = fastest;
      chosen = static_cast<int>(i);
    }
  }
  p.algo = t.algos[chosen];
  p.trial.reset();
  ++g_trials_settled;
}

// One call of a shape under trial. Once every candidate has kInPlaceSamples samples and the newest has completed
// (asked without waiting: the host usually runs ahead of the GPU until the step's next synchronisation; after
// kInPlaceMaxRounds rounds it waits), the trial ends and the call is left to the caller (false). Otherwise the next
// candidate in turn runs the call between two events (true).
bool run_trial_call(Plan& p, const void* alpha, const void* a, const void* b, const void* beta, const void* c_in,
                    void* c, void* workspace, size_t workspace_bytes) {
  InPlaceTrial& t = *p.trial;
  const int n = static_cast<int>(t.algos.size());
  if (t.calls >= kInPlaceSamples * n) {
    const cudaEvent_t newest = t.samples[(t.calls - 1) % n].back().second;
    if (t.calls >= kInPlaceMaxRounds * n) {
      CUDA_CHECK(cudaEventSynchronize(newest));
      settle_trial(p);
      return false;
    }
    const cudaError_t state = cudaEventQuery(newest);  // one stream: the newest done means all are
    if (state != cudaErrorNotReady) {
      CUDA_CHECK(state);
      settle_trial(p);
      return false;
    }
  }
  const int i = t.calls % n;
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, cuda_stream()));
  CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), p.op, alpha, b, p.a, a, p.b, beta, c_in, p.c, c, p.c, &t.algos[i],
                              workspace, workspace_bytes, cuda_stream()));
  CUDA_CHECK(cudaEventRecord(stop, cuda_stream()));
  t.samples[i].emplace_back(start, stop);
  ++t.calls;
  return true;
}
}  // namespace

void set_gemm_autotune(bool enabled) { autotune = enabled; }

GemmTrials gemm_in_place_trials() {
  std::lock_guard<std::mutex> lock(plans_mutex);
  return {g_trials_started, g_trials_settled};
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
  static std::map<Key, Plan>* plans = new std::map<Key, Plan>();  // never destroyed, like the handle it uses
  const bool apart = beta != 0.0f && c_in != c;
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, static_cast<int>(ab_dtype), static_cast<int>(c_dtype),
                beta != 0.0f, apart};
  size_t workspace_bytes = 0;
  void* workspace = cublaslt_workspace(&workspace_bytes);
  const Plan* plan;
  {
    std::lock_guard<std::mutex> lock(plans_mutex);
    auto it = plans->find(key);
    if (it == plans->end())
      it = plans
               ->emplace(key, make_plan(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab_dtype, c_dtype, beta != 0.0f, a, b,
                                        apart ? c_in : nullptr))
               .first;
    // Under the lock: a trial's bookkeeping changes with every call.
    if (it->second.trial && run_trial_call(it->second, &alpha, a, b, &beta, c_in, c, workspace, workspace_bytes))
      return;
    plan = &it->second;
  }
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
