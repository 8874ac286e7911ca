// cross_entropy.cu: the CUDA cross-entropy (cross_entropy.h).
// Forward: one block per row reads the row once; each thread keeps an online (max, sum of exp(x - max), first
// argmax) over its strided elements, in fp32 whatever the logits' dtype, so no fp32 copy of the logits is made; the
// block merges the threads' states in a fixed tree. Per-row losses land in an fp32 buffer that a single block sums
// in a fixed order (no atomics), so the loss is bitwise reproducible. The log-sum-exp per row is kept for the
// backward, which recomputes softmax from the logits instead of storing it. Both passes move 16 bytes per access
// where the rows allow it: element-wise bf16 loads left them at a quarter of the memory bandwidth. Where the gradient
// is wanted at once (the chunked head, linear_cross_entropy) and two rows fit in an SM's shared memory, one kernel does
// both: it keeps the row in shared memory as it reads it and writes softmax − onehot over it, reading the logits once.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cross_entropy.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "fp8_codes.cuh"

namespace hgrn {

namespace {

// Per-row status, summed into the counts by the reduction.
enum RowStatus : int32_t { kIgnored = 0, kWrong = 1, kCorrect = 2, kBadTarget = 3 };

constexpr int kReduceThreads = 1024;

template <typename F>
void with_target_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::I32: f(int32_t{}); break;
    case DType::I64: f(int64_t{}); break;
    default: throw Error(detail::concat("cross_entropy: targets must be int32 or int64, got ", dtype_name(dtype)));
  }
}

// (max, sum of exp(x - max), index of the first maximal x) over a set of logits; the empty set is (-inf, 0, INT_MAX).
struct SoftmaxState {
  float max;
  float sum;
  int index;
};

__device__ __forceinline__ SoftmaxState merge(const SoftmaxState& a, const SoftmaxState& b) {
  SoftmaxState r;
  r.max = fmaxf(a.max, b.max);
  // An empty side contributes nothing (and must not compute exp(-inf - -inf) = NaN).
  const float sa = a.max == -INFINITY ? 0.0f : a.sum * expf(a.max - r.max);
  const float sb = b.max == -INFINITY ? 0.0f : b.sum * expf(b.max - r.max);
  r.sum = sa + sb;
  r.index = (b.max > a.max || (b.max == a.max && b.index < a.index)) ? b.index : a.index;
  return r;
}

__device__ __forceinline__ SoftmaxState shfl_down(const SoftmaxState& s, int offset) {
  return {__shfl_down_sync(0xffffffffu, s.max, offset), __shfl_down_sync(0xffffffffu, s.sum, offset),
          __shfl_down_sync(0xffffffffu, s.index, offset)};
}

struct RowTotals {
  float loss;
  long long targets;
  long long correct;
  long long first_bad;  // LLONG_MAX: none
};

__device__ __forceinline__ RowTotals merge(const RowTotals& a, const RowTotals& b) {
  return {a.loss + b.loss, a.targets + b.targets, a.correct + b.correct,
          a.first_bad < b.first_bad ? a.first_bad : b.first_bad};
}

__device__ __forceinline__ RowTotals shfl_down(const RowTotals& t, int offset) {
  return {__shfl_down_sync(0xffffffffu, t.loss, offset), __shfl_down_sync(0xffffffffu, t.targets, offset),
          __shfl_down_sync(0xffffffffu, t.correct, offset), __shfl_down_sync(0xffffffffu, t.first_bad, offset)};
}

// The block's merged state, valid in thread 0. Every thread of the block must call it; blockDim.x a multiple of 32.
// The tree is fixed by the block size alone, so the result does not depend on scheduling.
template <typename S>
__device__ S block_merge(S v) {
  __shared__ S partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) v = merge(v, shfl_down(v, offset));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    // Lanes past the last warp repeat warp 0's value: merging it in twice is never needed, so they sit out below.
    v = partial[lane < warps ? lane : 0];
    for (int offset = 16; offset > 0; offset /= 2) {
      const S other = shfl_down(v, offset);
      if (lane + offset < warps) v = merge(v, other);
    }
  }
  return v;
}

// VEC consecutive elements moved as one 16-byte access (VEC 1: element by element, for rows that are not aligned).
// Adds a pack of VEC consecutive logits (the first at index `base`) to a thread's online softmax state. The pack's
// maximum is found first, so the running sum is rescaled at most once a pack rather than at every new maximum, with
// one branch a pack: per element a compare-and-branch, an exponential and a rescale had made the forward issue-bound
// (86% of cycles under ncu). The state's index stays the first maximal logit: a pack only takes over on a strictly
// greater maximum, and then at its first element equal to it. The online softmax's e^x (x <= 0) is act_exp: for bf16
// logits the accurate expf took the issue slots too (153 us per 2560 x 50304 chunk, against ~64 us to read it).
template <typename act_t, int VEC>
__device__ __forceinline__ void add_pack(SoftmaxState& s, const Pack<act_t, VEC>& p, long long base) {
  float x[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) x[k] = load_f(p.v[k]);
  float pack_max = x[0];
#pragma unroll
  for (int k = 1; k < VEC; ++k) pack_max = fmaxf(pack_max, x[k]);
  if (pack_max > s.max) {
    int first = VEC - 1;
#pragma unroll
    for (int k = VEC - 1; k >= 0; --k)
      if (x[k] == pack_max) first = k;
    // An empty state (max -inf, sum 0) stays 0: e^-inf = 0.
    s.sum *= act_exp<act_t>(s.max - pack_max);
    s.max = pack_max;
    s.index = static_cast<int>(base + first);
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) s.sum += act_exp<act_t>(x[k] - s.max);
}

// Thread 0, with the block's merged state of row r: the row's loss, log-sum-exp, target and status; returns lse.
template <typename act_t>
__device__ __forceinline__ float finish_row(const SoftmaxState& s, float target_logit, long long r, long long t,
                                            float* row_loss, float* log_sum_exp, int32_t* row_target,
                                            int32_t* row_status) {
  const float lse = s.max + logf(s.sum);
  row_loss[r] = lse - target_logit;
  log_sum_exp[r] = lse;
  row_target[r] = static_cast<int32_t>(t);
  row_status[r] = s.index == t ? kCorrect : kWrong;
  return lse;
}

// Rows that do not count (ignored, or a bad target): zero loss and log-sum-exp, no target.
__device__ __forceinline__ void skip_row(long long r, bool bad, float* row_loss, float* log_sum_exp,
                                         int32_t* row_target, int32_t* row_status) {
  row_loss[r] = 0.0f;
  log_sum_exp[r] = 0.0f;
  row_target[r] = -1;
  row_status[r] = bad ? kBadTarget : kIgnored;
}

// One element of the gradient: old + scale·(softmax − onehot), as the CPU forms it ((dloss / count)·p). The backward
// and the one-pass kernel (old 0, scale 1) share it, so their bits agree. The exponential is act_exp: for bf16
// gradients the accurate expf made the kernels issue-bound.
template <typename act_t>
__device__ __forceinline__ float softmax_gradient(float x, float lse, bool is_target, float scale, float old) {
  const float g = old + scale * act_exp<act_t>(x - lse);
  return is_target ? g - scale : g;
}

// A row that does not count, overwritten: zeros, in packs.
template <typename act_t, int VEC>
__device__ __forceinline__ void zero_row(act_t* x, long long vocab) {
  Pack<act_t, VEC> zero;
#pragma unroll
  for (int k = 0; k < VEC; ++k) zero.v[k] = store_f<act_t>(0.0f);
  for (long long base = threadIdx.x * VEC; base < vocab; base += static_cast<long long>(blockDim.x) * VEC)
    *reinterpret_cast<Pack<act_t, VEC>*>(x + base) = zero;
}

// Visits this thread's packs of a row (indices threadIdx.x·VEC, then a block's width on) in increasing order, four
// 16-byte loads issued before the first is used, rather than one load in flight per thread.
template <typename act_t, int VEC, typename F>
__device__ __forceinline__ void for_each_row_pack(const act_t* x, long long vocab, F&& f) {
  constexpr int kUnroll = 4;
  const long long stride = static_cast<long long>(blockDim.x) * VEC;
  for (long long base0 = threadIdx.x * VEC; base0 < vocab; base0 += kUnroll * stride) {
    Pack<act_t, VEC> p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base0 + u * stride < vocab) p[u] = *reinterpret_cast<const Pack<act_t, VEC>*>(x + base0 + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base0 + u * stride < vocab) f(p[u], base0 + u * stride);
  }
}

template <typename act_t, int VEC, typename T>
__global__ void cross_entropy_forward_kernel(const act_t* logits, const T* targets, long long vocab,
                                             long long ignore_index, float* row_loss, float* log_sum_exp,
                                             int32_t* row_target, int32_t* row_status) {
  const long long r = blockIdx.x;
  const long long t = static_cast<long long>(targets[r]);
  const bool ignored = t == ignore_index, bad = !ignored && (t < 0 || t >= vocab);
  if (ignored || bad) {  // the same for every thread of the block: they all leave together
    if (threadIdx.x == 0) skip_row(r, bad, row_loss, log_sum_exp, row_target, row_status);
    return;
  }
  const act_t* x = logits + r * vocab;
  SoftmaxState s{-INFINITY, 0.0f, INT_MAX};
  // Each thread visits its indices in increasing order, so a strict > keeps its first maximal logit.
  for_each_row_pack<act_t, VEC>(x, vocab,
                                              [&](const Pack<act_t, VEC>& p, long long base) { add_pack(s, p, base); });
  s = block_merge(s);
  if (threadIdx.x == 0) finish_row<act_t>(s, load_f(x[t]), r, t, row_loss, log_sum_exp, row_target, row_status);
}

// The forward and the unscaled gradient of one row in one pass over the logits: the row is read once (loads ahead,
// as the forward kernel), kept in shared memory (vocab elements, dynamic) while the block merges its softmax state,
// then softmax − onehot is written over it in the logits' place, so the logits cross DRAM once each way instead of
// three times in the two kernels. Per row the forward kernel's results bit for bit (the same threads visit the same
// packs in the same order, the same merge tree), and the gradient the backward's at scale 1
// (cross_entropy_backward_cuda with dloss 1, one target). Measured on an H200 at 2560 x 50304 bf16 (hgrn2-385m's
// head chunks): 206 us against 257-265 us for the two kernels; staging the row by cp.async instead took 213 us, with
// 1024 threads 220 us, and a second read of the row from L2 instead of shared memory 280 us (the resident blocks'
// rows do not stay in L2).
//
// kCodes: the gradient as FP8 codes (Fp8CodesOut, [rows, vocab]) with its amax folded, in place of writing it over the
// logits (which are left as they are): the codes of the act-dtype gradient the kernel would have stored.
template <typename act_t, int VEC, typename T, bool kCodes>
__global__ void cross_entropy_fused_kernel(act_t* logits, const T* targets, long long vocab, long long ignore_index,
                                           float* row_loss, float* log_sum_exp, int32_t* row_target,
                                           int32_t* row_status, Fp8CodesOut codes_out) {
  extern __shared__ __align__(16) unsigned char row_bytes[];
  auto* row = reinterpret_cast<Pack<act_t, VEC>*>(row_bytes);
  __shared__ float row_lse;
  const long long r = blockIdx.x;
  const long long t = static_cast<long long>(targets[r]);
  const bool ignored = t == ignore_index, bad = !ignored && (t < 0 || t >= vocab);
  act_t* x = logits + r * vocab;
  const long long stride = static_cast<long long>(blockDim.x) * VEC;
  if (ignored || bad) {  // as the backward: a row that does not count gets a zero gradient
    if (threadIdx.x == 0) skip_row(r, bad, row_loss, log_sum_exp, row_target, row_status);
    if constexpr (kCodes) {
      const Pack<uint8_t, VEC> zero{};  // code 0 is +0 in both formats
      for (long long base = threadIdx.x * VEC; base < vocab; base += stride)
        *reinterpret_cast<Pack<uint8_t, VEC>*>(codes_out.codes + r * vocab + base) = zero;
    } else {
      zero_row<act_t, VEC>(x, vocab);
    }
    return;
  }
  SoftmaxState s{-INFINITY, 0.0f, INT_MAX};
  for_each_row_pack<act_t, VEC>(x, vocab, [&](const Pack<act_t, VEC>& p, long long base) {
    row[base / VEC] = p;  // each thread later rereads only its own packs
    add_pack(s, p, base);
  });
  s = block_merge(s);  // its barrier also orders every thread's packs before thread 0 reads the target's
  if (threadIdx.x == 0)
    row_lse = finish_row<act_t>(s, load_f(row[t / VEC].v[t % VEC]), r, t, row_loss, log_sum_exp, row_target,
                                row_status);
  __syncthreads();
  const float lse = row_lse;
  DeviceCodesOut out{};
  if constexpr (kCodes) out = device_codes_out(codes_out);
  float local_amax = 0.0f;
  for (long long base = threadIdx.x * VEC; base < vocab; base += stride) {
    const Pack<act_t, VEC> p = row[base / VEC];
    float g[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] = softmax_gradient<act_t>(load_f(p.v[k]), lse, base + k == t, 1.0f, 0.0f);
    if constexpr (kCodes)
      store_codes<act_t, VEC>(out, r * vocab + base, g, local_amax);
    else
      store_pack<VEC>(x + base, 0, g);
  }
  if constexpr (kCodes) {
    if (out.amax) fold_block_amax(local_amax, out.amax);  // every thread of a counted row gets here
  }
}

// One block: thread i sums rows i, i + blockDim, ... in order, then the fixed tree; thread 0 writes the mean.
__global__ void cross_entropy_reduce_kernel(const float* row_loss, const int32_t* row_status, long long rows,
                                            float* loss, long long* counts) {
  RowTotals acc{0.0f, 0, 0, LLONG_MAX};
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    const int32_t status = row_status[r];
    acc.loss += row_loss[r];
    acc.targets += status == kWrong || status == kCorrect;
    acc.correct += status == kCorrect;
    if (status == kBadTarget && r < acc.first_bad) acc.first_bad = r;
  }
  acc = block_merge(acc);
  if (threadIdx.x == 0) {
    loss[0] = acc.targets > 0 ? acc.loss / static_cast<float>(acc.targets) : 0.0f;
    counts[0] = acc.targets;
    counts[1] = acc.correct;
    counts[2] = acc.first_bad == LLONG_MAX ? -1 : acc.first_bad;
  }
}

template <typename act_t, int VEC>
__global__ void cross_entropy_backward_kernel(const act_t* logits, const float* log_sum_exp, const int32_t* row_target,
                                              const float* dloss, float num_targets, act_t* dlogits,
                                              long long vocab, bool accumulate) {
  const long long r = blockIdx.x;
  const long long t = row_target[r];
  act_t* dx = dlogits + r * vocab;
  if (t < 0) {  // an ignored row adds nothing; overwritten, it becomes zeros
    if (!accumulate) zero_row<act_t, VEC>(dx, vocab);
    return;
  }
  const float scale = dloss[0] / num_targets;  // as the CPU: (dloss / count) * p
  const float lse = log_sum_exp[r];
  const act_t* x = logits + r * vocab;  // may be dx itself (overwrite): each element is read before it is written
  for (long long base = threadIdx.x * VEC; base < vocab; base += blockDim.x * VEC) {
    const Pack<act_t, VEC> xp = *reinterpret_cast<const Pack<act_t, VEC>*>(x + base);
    Pack<act_t, VEC> dp;
    if (accumulate) dp = *reinterpret_cast<const Pack<act_t, VEC>*>(dx + base);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      dp.v[k] = store_f<act_t>(
          softmax_gradient<act_t>(load_f(xp.v[k]), lse, base + k == t, scale, accumulate ? load_f(dp.v[k]) : 0.0f));
    *reinterpret_cast<Pack<act_t, VEC>*>(dx + base) = dp;
  }
}

// Calls f with std::integral_constant<int, VEC>: 16-byte accesses when every row starts 16-byte aligned (the
// vocab a multiple of the pack and the pointers aligned), else one element at a time.
template <typename act_t, typename F>
void with_pack_width(int64_t vocab, std::initializer_list<const void*> pointers, F&& f) {
  constexpr int kVec = 16 / sizeof(act_t);
  bool aligned = vocab % kVec == 0;
  for (const void* p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (aligned)
    f(std::integral_constant<int, kVec>{});
  else
    f(std::integral_constant<int, 1>{});
}

// Threads per row: enough to cover a small vocab in one sweep, at most 512 for the long rows of a real vocab.
int row_threads(int64_t vocab) {
  return static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(32, (vocab + 31) / 32 * 32)));
}

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// Scratch layout: row_loss [rows] fp32 | row_status [rows] int32.
size_t cross_entropy_scratch_bytes(int64_t rows) { return 2 * align_up(static_cast<size_t>(rows) * 4); }

void cross_entropy_forward_cuda(const void* logits, DType logits_dtype, const void* targets, DType targets_dtype,
                                int64_t rows, int64_t vocab, int64_t ignore_index, float* loss, float* log_sum_exp,
                                int32_t* row_target, int64_t* counts, void* scratch) {
  HGRN_CHECK(vocab > 0 && vocab < (int64_t{1} << 31), "cross_entropy: vocab size ", vocab, " out of range");
  HGRN_CHECK(rows < (int64_t{1} << 31), "cross_entropy: ", rows, " rows exceed the grid");
  char* ws = static_cast<char*>(scratch);
  auto* row_loss = reinterpret_cast<float*>(ws);
  auto* row_status = reinterpret_cast<int32_t*>(ws + align_up(static_cast<size_t>(rows) * 4));
  if (rows > 0) {
    with_target_type(targets_dtype, [&](auto tag) {
      using T = decltype(tag);
      HGRN_CUDA_DISPATCH_ACT(logits_dtype, "cross_entropy", [&] {
        with_pack_width<act_t>(vocab, {logits}, [&](auto vec) {
          cross_entropy_forward_kernel<act_t, vec.value, T>
              <<<static_cast<unsigned>(rows), row_threads(vocab), 0, cuda_stream()>>>(
                  static_cast<const act_t*>(logits), static_cast<const T*>(targets), vocab, ignore_index, row_loss,
                  log_sum_exp, row_target, row_status);
        });
      });
    });
    CUDA_CHECK_LAUNCH("cross_entropy_forward");
  }
  static_assert(sizeof(long long) == sizeof(int64_t), "counts are int64");
  cross_entropy_reduce_kernel<<<1, kReduceThreads, 0, cuda_stream()>>>(row_loss, row_status, rows, loss,
                                                                       reinterpret_cast<long long*>(counts));
  CUDA_CHECK_LAUNCH("cross_entropy_reduce");
}

bool cross_entropy_forward_gradient_cuda(void* logits, DType logits_dtype, const void* targets, DType targets_dtype,
                                         int64_t rows, int64_t vocab, int64_t ignore_index, float* loss,
                                         float* log_sum_exp, int32_t* row_target, int64_t* counts, void* scratch,
                                         const Fp8CodesOut* gradient_codes) {
  HGRN_CHECK(!gradient_codes || (gradient_codes->codes && gradient_codes->scale &&
                                 reinterpret_cast<uintptr_t>(gradient_codes->codes) % 16 == 0),
             "cross_entropy: the gradient's FP8 codes need a 16-byte aligned buffer and a scale");
  // The row lives in shared memory. Where two rows do not fit on an SM (fp32 logits of a 50k vocabulary) the blocks
  // would run one to an SM, too little in flight; unaligned rows would move element by element. Both keep the two
  // kernels.
  const size_t row_bytes = static_cast<size_t>(vocab) * dtype_size(logits_dtype);
  const auto& props = cuda_device_properties();
  const bool packed = vocab % (16 / static_cast<int64_t>(dtype_size(logits_dtype))) == 0 &&
                      reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  constexpr size_t kStaticShared = 1024;  // block_merge's partials and the row's lse, rounded up
  if (!packed || rows <= 0 || vocab >= (int64_t{1} << 31) || rows >= (int64_t{1} << 31) ||
      2 * (row_bytes + kStaticShared + props.reservedSharedMemPerBlock) > props.sharedMemPerMultiprocessor)
    return false;
  char* ws = static_cast<char*>(scratch);
  auto* row_loss = reinterpret_cast<float*>(ws);
  auto* row_status = reinterpret_cast<int32_t*>(ws + align_up(static_cast<size_t>(rows) * 4));
  with_target_type(targets_dtype, [&](auto tag) {
    using T = decltype(tag);
    HGRN_CUDA_DISPATCH_ACT(logits_dtype, "cross_entropy", [&] {
      constexpr int kVec = 16 / sizeof(act_t);
      with_flag(gradient_codes != nullptr, [&](auto to_codes) {
        const auto kernel = cross_entropy_fused_kernel<act_t, kVec, T, decltype(to_codes)::value>;
        CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(row_bytes)));
        kernel<<<static_cast<unsigned>(rows), row_threads(vocab), row_bytes, cuda_stream()>>>(
            static_cast<act_t*>(logits), static_cast<const T*>(targets), vocab, ignore_index, row_loss, log_sum_exp,
            row_target, row_status, gradient_codes ? *gradient_codes : Fp8CodesOut{});
      });
    });
  });
  CUDA_CHECK_LAUNCH("cross_entropy_fused");
  cross_entropy_reduce_kernel<<<1, kReduceThreads, 0, cuda_stream()>>>(row_loss, row_status, rows, loss,
                                                                       reinterpret_cast<long long*>(counts));
  CUDA_CHECK_LAUNCH("cross_entropy_reduce");
  return true;
}

std::vector<CrossEntropyCounts> cross_entropy_counts_to_host(const int64_t* counts, int64_t chunks, const void* targets,
                                                            DType targets_dtype, int64_t chunk_rows,
                                                            const float* losses, float* host_losses) {
  std::vector<int64_t> host(static_cast<size_t>(chunks) * kCrossEntropyCountSlots);
  if (chunks > 0) {
    CUDA_CHECK(cudaMemcpyAsync(host.data(), counts, host.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                               cuda_stream()));
    if (losses)
      CUDA_CHECK(cudaMemcpyAsync(host_losses, losses, static_cast<size_t>(chunks) * sizeof(float),
                                 cudaMemcpyDeviceToHost, cuda_stream()));
  }
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  std::vector<CrossEntropyCounts> result(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < chunks; ++i) {
    CrossEntropyCounts& r = result[static_cast<size_t>(i)];
    r.num_targets = host[i * kCrossEntropyCountSlots];
    r.num_correct = host[i * kCrossEntropyCountSlots + 1];
    r.bad_row = host[i * kCrossEntropyCountSlots + 2];
    if (r.bad_row < 0) continue;
    with_target_type(targets_dtype, [&](auto tag) {  // the error path only: fetch the offending target itself
      using T = decltype(tag);
      T value{};
      CUDA_CHECK(cudaMemcpyAsync(&value, static_cast<const T*>(targets) + i * chunk_rows + r.bad_row, sizeof value,
                                 cudaMemcpyDeviceToHost, cuda_stream()));
      CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
      r.bad_target = static_cast<int64_t>(value);
    });
  }
  return result;
}

void cross_entropy_backward_cuda(const void* logits, DType logits_dtype, const float* log_sum_exp,
                                 const int32_t* row_target, const float* dloss, int64_t num_targets, void* dlogits,
                                 int64_t rows, int64_t vocab, bool accumulate) {
  if (rows == 0 || num_targets == 0) return;
  HGRN_CUDA_DISPATCH_ACT(logits_dtype, "cross_entropy backward", [&] {
    with_pack_width<act_t>(vocab, {logits, dlogits}, [&](auto vec) {
      cross_entropy_backward_kernel<act_t, vec.value>
          <<<static_cast<unsigned>(rows), row_threads(vocab), 0, cuda_stream()>>>(
              static_cast<const act_t*>(logits), log_sum_exp, row_target, dloss, static_cast<float>(num_targets),
              static_cast<act_t*>(dlogits), vocab, accumulate);
    });
  });
  CUDA_CHECK_LAUNCH("cross_entropy_backward");
}

}  // namespace hgrn
