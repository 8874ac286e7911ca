// small_batch_gemv.cu: y (+)= x·Wᵀ for at most 8 rows of x (small_batch_gemv.h), bound by reading W once.
// Each block first stages x's rows in shared memory as fp32 (gated, or times the norm's weights, on the way:
// GemvInput; the norm's rstd scales each column's sum, so that one barrier ends the staging); then each warp computes
// output columns j, j + (the grid's warps), … for every row of x: its lanes stream W's row j in 16-byte packs (lane l
// takes packs l, l + 32, …, several loads in flight), multiply them into one fp32 sum per row of x, and a warp
// shuffle tree adds the lanes' sums. Lane r writes row r's. The grid is about half the blocks the GPU holds at once,
// so that every block is resident while the kernel before it ends, and asks L2 for the next column's row as it starts
// each one; one row of large weights (kSmallBatchGemvWideBytes) takes blocks of 32 warps, one an SM, whose loads in
// flight matter more than that overlap.
// Each launch is a programmatic dependent of the kernel before it (dependent_launch.cuh): a warp loads its first W
// packs into registers and asks L2 for the rest of its first two rows, and each thread copies the norm's weights of
// its packs into shared memory (cp.async), before it waits for that kernel, so that decoding's chain of small kernels
// overlaps each one's weight reads with the one before and the norm's staging makes one trip to memory, not two.
// Weights are read before the wait because no kernel that may still run then writes them: the optimizer's and the
// casts' kernels never allow dependents early.
#include <algorithm>
#include <cstdint>

#include "cp_async.cuh"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "row_sums.cuh"
#include "sigmoid.cuh"
#include "small_batch_gemv.h"

namespace hgrn {

namespace {

// Warps a block (output columns at once, one a warp): kWarps, or kWideWarps for one row of large weights
// (kSmallBatchGemvWideBytes).
constexpr int kWarps = 8;
constexpr int kWideWarps = 32;
constexpr int kPacksInFlight = 4;  // W packs a lane loads before it uses them
// x's staged rows at most (fp32): 8 rows of 4096, or 1 row of 32768; more falls back to the GEMM.
constexpr int64_t kMaxStagedBytes = 128 * 1024;

// The shared memory a block may take for x: kMaxStagedBytes, or less where the device has less.
int64_t staged_bytes_limit() {
  return std::min<int64_t>(kMaxStagedBytes, static_cast<int64_t>(cuda_device_properties().sharedMemPerBlockOptin));
}

// The floats one staged row of x takes: its packs rounded up to a whole warp's, in the lane_slot layout.
__host__ __device__ int64_t staged_row_floats(int64_t k, int64_t pack) { return (k / pack + 31) / 32 * 32 * pack; }

// What the kernel stages from x (GemvInput): x itself, RMSNorm(x)·w, or silu(x)·up.
enum class Prologue { Plain, RmsNorm, Swiglu };

// The kernel's view of a GemvInput: strides resolved, pointers typed.
template <typename T>
struct StagedInput {
  const float* norm_weight;
  float eps;
  const T* up;
  long long x_stride, up_stride;
};

// norm_in_shared: the norm's weights go to shared memory after x's staged rows (launch_for_rows sizes it for them);
// otherwise (unaligned, or no room) the staging reads them through L2.
template <typename T, typename TOut, int Rows, Prologue kPrologue, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    small_batch_gemv_kernel(const T* x, const T* w, TOut* y, long long ldy, int n, int k, bool accumulate,
                            StagedInput<T> in, bool norm_in_shared) {
  constexpr int V = 16 / sizeof(T);  // values of a pack
  constexpr int kThreads = kWarps * 32;
  // row r's pack p at staged[r·row_float4s + lane_slot<V>(p / 32, q, p % 32)]; then, norm_in_shared, k norm weights
  extern __shared__ float4 staged[];
  const int packs = k / V;
  const int row_float4s = static_cast<int>(staged_row_floats(k, V) / 4);
  const int lane = threadIdx.x % 32;
  const long long grid_warps = static_cast<long long>(gridDim.x) * kWarps;
  const long long first = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;  // this warp's first column
  const int lane_packs = (packs - lane + 31) / 32;  // this lane's packs of a row: lane, lane + 32, …
  const auto prefetch_row = [&](long long j, int from) {
    if (j < n)
      for (int p = from; p < lane_packs; ++p) prefetch_l2(w + j * k + (static_cast<long long>(p) * 32 + lane) * V);
  };
  float wv[kPacksInFlight][V];
  if (first < n) {
#pragma unroll
    for (int u = 0; u < kPacksInFlight; ++u)
      if (u < lane_packs) load_pack<V>(w + first * k, static_cast<long long>(u) * 32 + lane, wv[u]);
  }
  prefetch_row(first, kPacksInFlight);
  prefetch_row(first + grid_warps, 0);
  // The norm's weights: each thread copies those of the packs it stages, so that its own wait shows them to it.
  const float* norm_weight = in.norm_weight;
  if constexpr (kPrologue == Prologue::RmsNorm) {
    if (norm_in_shared) {
      float* copy = reinterpret_cast<float*>(staged + Rows * row_float4s);
      for (int p = threadIdx.x; p < packs; p += kThreads)
#pragma unroll
        for (int q = 0; q < V / 4; ++q) cp_async_16(shared_address(copy + p * V + 4 * q), norm_weight + p * V + 4 * q);
      cp_async_commit();
      norm_weight = copy;
    } else {
      for (int c = threadIdx.x * 32; c < k; c += kThreads * 32) prefetch_l2(norm_weight + c);  // 128-byte lines
    }
  }
  wait_for_previous_kernel();
  allow_dependent_launch();

  // x's rows into shared memory: as they are, gated (silu(x)·up), or, for the norm, x·w with each warp's share of the
  // row's sum of squares; the norm's rstd then scales each column's sum (RmsNorm(x)·W = rstd·(x·w)·W), so that the
  // staging's one barrier is the block's only one.
  __shared__ float warp_sums[kSmallBatchGemvMaxRows][kWarps];
  if constexpr (kPrologue == Prologue::RmsNorm) {
    if (norm_in_shared) cp_async_wait<0>();
  }
  for (int r = 0; r < Rows; ++r) {
    float sum_sq = 0.f;
    for (int p = threadIdx.x; p < packs; p += kThreads) {
      float v[V];
      load_pack<V>(x + r * in.x_stride, p, v);
      if constexpr (kPrologue == Prologue::RmsNorm) {
#pragma unroll
        for (int q = 0; q < V; ++q) {
          sum_sq += v[q] * v[q];
          v[q] *= norm_weight[p * V + q];
        }
      } else if constexpr (kPrologue == Prologue::Swiglu) {
        // swiglu's output element silu(gate) · up, as stored.
        float u[V];
        load_pack<V>(in.up + r * in.up_stride, p, u);
#pragma unroll
        for (int q = 0; q < V; ++q) v[q] = load_f(store_f<T>(v[q] * stable_sigmoid<T>(v[q]) * u[q]));
      }
#pragma unroll
      for (int q = 0; q < V / 4; ++q)
        staged[r * row_float4s + lane_slot<V>(p / 32, q, p % 32)] =
            make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
    if constexpr (kPrologue == Prologue::RmsNorm) {
      sum_sq = warp_sum(sum_sq);
      if (lane == 0) warp_sums[r][threadIdx.x / 32] = sum_sq;
    }
  }
  __syncthreads();
  // Lane r's row's rstd: the warps' sums of squares added in warp order (the same bits in every warp).
  float rstd = 1.f;
  if constexpr (kPrologue == Prologue::RmsNorm) {
    if (lane < Rows) {
      float total = 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) total += warp_sums[lane][i];
      rstd = 1.f / sqrtf(total / (float)k + in.eps);
    }
  }

  for (long long j = first; j < n; j += grid_warps) {
    if (j != first) prefetch_row(j + grid_warps, 0);
    const T* wj = w + j * k;
    float sum[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) sum[r] = 0.f;
    for (int p0 = 0; p0 < lane_packs; p0 += kPacksInFlight) {
      if (j != first || p0 > 0) {  // the first column's first packs came before the wait
#pragma unroll
        for (int u = 0; u < kPacksInFlight; ++u)
          if (p0 + u < lane_packs) load_pack<V>(wj, static_cast<long long>(p0 + u) * 32 + lane, wv[u]);
      }
#pragma unroll
      for (int u = 0; u < kPacksInFlight; ++u) {
        if (p0 + u >= lane_packs) continue;
#pragma unroll
        for (int r = 0; r < Rows; ++r)
#pragma unroll
          for (int q = 0; q < V / 4; ++q) {
            const float4 xv = staged[r * row_float4s + lane_slot<V>(p0 + u, q, lane)];
            sum[r] = fmaf(wv[u][4 * q], xv.x, sum[r]);
            sum[r] = fmaf(wv[u][4 * q + 1], xv.y, sum[r]);
            sum[r] = fmaf(wv[u][4 * q + 2], xv.z, sum[r]);
            sum[r] = fmaf(wv[u][4 * q + 3], xv.w, sum[r]);
          }
      }
    }
    float mine = 0.f;  // lane r's: row r's total
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      const float total = warp_sum(sum[r]);
      if (lane == r) mine = total;
    }
    if (lane < Rows) {
      TOut* out = y + lane * ldy + j;
      const float product = kPrologue == Prologue::RmsNorm ? mine * rstd : mine;
      *out = store_f<TOut>(accumulate ? load_f(*out) + product : product);
    }
  }
}

// One launch of the kernel: half the blocks the GPU holds at once (the other half: the kernel before, still ending),
// at most one per kWarps columns. At kWideWarps a block fills an SM's registers, so the grid is one block an SM.
template <typename T, typename TOut, Prologue kPrologue, int Rows, int kWarps>
void launch_kernel(const T* x, const T* w, TOut* y, long long ldy, int n, int k, bool accumulate,
                   const StagedInput<T>& in, size_t smem, bool norm_in_shared) {
  constexpr auto kernel = small_batch_gemv_kernel<T, TOut, Rows, kPrologue, kWarps>;
  if (smem > 48 * 1024) allow_dynamic_smem<kernel>(static_cast<size_t>(staged_bytes_limit()));  // default: 48 KB
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, smem));
  const int64_t half_resident =
      std::max<int64_t>(1, per_sm / 2) * static_cast<int64_t>(cuda_device_properties().multiProcessorCount);
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((static_cast<int64_t>(n) + kWarps - 1) / kWarps, half_resident));
  launch_as_dependent(kernel, dim3(blocks), dim3(kWarps * 32), smem, x, w, y, ldy, n, k, accumulate, in,
                      norm_in_shared);
}

// The kernel for `rows` rows (Rows is a template argument: each warp's sums stay in registers).
// smem: x's staged rows; norm_in_shared adds k floats for the norm's weights.
template <typename T, typename TOut, Prologue kPrologue, int Rows = 1>
void launch_for_rows(int rows, const T* x, const T* w, TOut* y, long long ldy, int n, int k, bool accumulate,
                     const StagedInput<T>& in, size_t smem, bool norm_in_shared) {
  if constexpr (Rows < kSmallBatchGemvMaxRows) {
    if (rows != Rows)
      return launch_for_rows<T, TOut, kPrologue, Rows + 1>(rows, x, w, y, ldy, n, k, accumulate, in, smem,
                                                           norm_in_shared);
  }
  if (norm_in_shared) smem += static_cast<size_t>(k) * sizeof(float);
  if constexpr (Rows == 1) {
    if (static_cast<int64_t>(n) * k * static_cast<int64_t>(sizeof(T)) >= kSmallBatchGemvWideBytes)
      return launch_kernel<T, TOut, kPrologue, Rows, kWideWarps>(x, w, y, ldy, n, k, accumulate, in, smem,
                                                                 norm_in_shared);
  }
  launch_kernel<T, TOut, kPrologue, Rows, kWarps>(x, w, y, ldy, n, k, accumulate, in, smem, norm_in_shared);
}

size_t staged_bytes(int64_t rows, int64_t k, DType dtype) {
  return static_cast<size_t>(rows * staged_row_floats(k, 16 / static_cast<int64_t>(dtype_size(dtype))) *
                             static_cast<int64_t>(sizeof(float)));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool small_batch_gemv_applies(int64_t rows, int64_t n, int64_t k, const void* x, const void* w, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16) return false;
  if (rows < 1 || rows > kSmallBatchGemvMaxRows || n < 1 || n > 0x7fffffff || k < 1 || k > 0x7fffffff) return false;
  if (k % (16 / static_cast<int64_t>(dtype_size(dtype))) != 0 || !aligned16(x) || !aligned16(w)) return false;
  return static_cast<int64_t>(staged_bytes(rows, k, dtype)) <= staged_bytes_limit();
}

void cuda_small_batch_gemv(const void* x, const void* w, void* y, DType y_dtype, int64_t ldy, int64_t rows, int64_t n,
                           int64_t k, DType dtype, bool accumulate, const GemvInput* input) {
  HGRN_CHECK(y_dtype == dtype || (dtype == DType::BF16 && y_dtype == DType::F32), "small_batch_gemv: a ",
             dtype_name(dtype), " product into ", dtype_name(y_dtype), " (expected the input's dtype, or fp32)");
  HGRN_CHECK(small_batch_gemv_applies(rows, n, k, x, w, dtype) && ldy >= n, "small_batch_gemv: ", rows,
             " rows, n ", n, ", k ", k, ", ldy ", ldy, " in ", dtype_name(dtype),
             " (or unaligned operands) is not a shape it takes");
  const GemvInput plain;
  const GemvInput& in = input ? *input : plain;
  const int64_t pack = 16 / static_cast<int64_t>(dtype_size(dtype));
  const int64_t x_stride = in.x_stride ? in.x_stride : k, up_stride = in.up_stride ? in.up_stride : k;
  HGRN_CHECK(!(in.norm_weight && in.up) && x_stride >= k && up_stride >= k && x_stride % pack == 0 &&
                 up_stride % pack == 0 && (!in.up || aligned16(in.up)),
             "small_batch_gemv: an input that is both normalised and gated, or rows ", x_stride, " / ", up_stride,
             " apart that are not whole 16-byte packs");
  // The norm's weights (fp32, k a multiple of 4) go to shared memory where they are aligned and fit beside x's rows.
  const size_t staged = staged_bytes(rows, k, dtype);
  const bool norm_in_shared = in.norm_weight && aligned16(in.norm_weight) &&
                              static_cast<int64_t>(staged + k * sizeof(float)) <= staged_bytes_limit();
  HGRN_CUDA_DISPATCH_ACT(dtype, "small_batch_gemv", [&] {
    const StagedInput<act_t> staged_input{in.norm_weight, in.eps, static_cast<const act_t*>(in.up), x_stride,
                                          up_stride};
    const auto launch = [&](auto prologue) {
      const auto into = [&](auto* out) {
        launch_for_rows<act_t, std::remove_pointer_t<decltype(out)>, decltype(prologue)::value>(
            static_cast<int>(rows), static_cast<const act_t*>(x), static_cast<const act_t*>(w), out,
            static_cast<long long>(ldy), static_cast<int>(n), static_cast<int>(k), accumulate, staged_input, staged,
            norm_in_shared);
      };
      if (y_dtype == dtype)
        into(static_cast<act_t*>(y));
      else
        into(static_cast<float*>(y));
    };
    if (in.norm_weight)
      launch(std::integral_constant<Prologue, Prologue::RmsNorm>{});
    else if (in.up)
      launch(std::integral_constant<Prologue, Prologue::Swiglu>{});
    else
      launch(std::integral_constant<Prologue, Prologue::Plain>{});
  });
  CUDA_CHECK_LAUNCH("small_batch_gemv");
}

}  // namespace hgrn
