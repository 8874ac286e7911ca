// embedding.cu: the CUDA embedding (embedding.h). Forward: a row gather from the fp32 table into fp32/bf16
// activations. Backward without float atomics: the forward radix-sorts (id, position) pairs once (the ids are fixed
// for the step) and marks where each distinct id's run starts; the backward gives one thread to each
// (distinct id, column) and adds that id's dy rows in position order onto the existing gradient, which is the order
// the CPU uses, so the result is bitwise reproducible and, for fp32 dy, bitwise equal to the CPU's; ids with more
// than kLongRun positions excepted (summed per chunk of positions in parallel, then the chunks in order).
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "embedding.h"

namespace hgrn {

namespace {

template <typename F>
void with_id_type(DType dtype, const char* name, F&& f) {
  switch (dtype) {
    case DType::I32: f(int32_t{}); break;
    case DType::I64: f(int64_t{}); break;
    default: throw Error(detail::concat(name, ": ids must be int32 or int64, got ", dtype_name(dtype)));
  }
}

// The smallest invalid position wins (atomicMin on integers is order-independent), so the error names the first
// bad id whatever the thread schedule.
template <typename I>
__global__ void check_ids_kernel(const I* ids, long long n, long long vocab, unsigned long long* first_bad) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long id = static_cast<long long>(ids[i]);
    if (id < 0 || id >= vocab) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// One block per row (n can exceed the 65535 limit of grid.y, not of grid.x); threads stride over the columns.
template <typename I, typename act_t>
__global__ void embedding_forward_kernel(const float* weight, const I* ids, act_t* y, long long width) {
  // Launched in plain order, it lets a programmatic dependent start at once: one that keeps dependent_launch.cuh's
  // rule reads nothing this kernel writes before it waits (decoding's first GEMV loads its weights meanwhile).
  allow_dependent_launch();
  const long long r = blockIdx.x;
  const float* src = weight + static_cast<long long>(ids[r]) * width;
  act_t* dst = y + r * width;
  for (long long c = threadIdx.x; c < width; c += blockDim.x) dst[c] = store_f<act_t>(src[c]);
}

// Sort input: ids as unsigned keys (valid ids are non-negative, so unsigned order is id order and only the low
// bits need sorting) and positions 0..n-1 as values; the radix sort is stable, so equal ids keep position order.
template <typename I>
__global__ void sort_input_kernel(const I* ids, unsigned* keys, int32_t* positions, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    keys[i] = static_cast<unsigned>(ids[i]);
    positions[i] = static_cast<int32_t>(i);
  }
}

struct IsSegmentStart {
  const unsigned* sorted_ids;
  __device__ __forceinline__ bool operator()(int32_t i) const { return i == 0 || sorted_ids[i] != sorted_ids[i - 1]; }
};

// A run of one id longer than kLongRun sorted positions (a frequent token: MQAR's filler, a space in byte-level
// text) would be a long chain of dependent additions for one thread. Such runs are summed instead in the fixed
// chunks of kLongRun sorted positions they cover, in parallel, and the chunks' sums are then added in order onto the
// gradient: deterministic, a different rounding from the CPU's one-by-one order. Shorter runs keep that order.
constexpr long long kLongRun = 128;

template <typename act_t>
__device__ __forceinline__ float sum_rows(const act_t* dy, const int32_t* sorted_pos, long long begin, long long end,
                                          long long width, long long c, float acc) {
  long long j = begin;
  for (; j + 4 <= end; j += 4) {  // four loads in flight, added in order
    const float v0 = load_f(dy[sorted_pos[j] * width + c]);
    const float v1 = load_f(dy[sorted_pos[j + 1] * width + c]);
    const float v2 = load_f(dy[sorted_pos[j + 2] * width + c]);
    const float v3 = load_f(dy[sorted_pos[j + 3] * width + c]);
    acc += v0;
    acc += v1;
    acc += v2;
    acc += v3;
  }
  for (; j < end; ++j) acc += load_f(dy[sorted_pos[j] * width + c]);
  return acc;
}

// grid.x: distinct ids (launched for the most there can be; the extra blocks leave at once), grid.y: column tiles.
// Each short run's rows are added in position order onto the existing gradient.
template <typename act_t>
__global__ void embedding_backward_kernel(const act_t* dy, const int32_t* sorted_ids, const int32_t* sorted_pos,
                                          const int32_t* segment_start, const int32_t* num_segments, float* dweight,
                                          long long n, long long width) {
  const int segments = *num_segments;
  const int s = blockIdx.x;
  if (s >= segments) return;
  const long long c = blockIdx.y * (long long)blockDim.x + threadIdx.x;
  if (c >= width) return;
  const long long begin = segment_start[s];
  const long long end = s + 1 < segments ? segment_start[s + 1] : n;
  if (end - begin > kLongRun) return;  // the long-run kernels' work
  float* dst = dweight + static_cast<long long>(sorted_ids[begin]) * width + c;
  *dst = sum_rows(dy, sorted_pos, begin, end, width, c, *dst);
}

// The run holding sorted index j, clipped to [lo, hi): its first index and its end.
__device__ __forceinline__ long long run_begin(const int32_t* ids, long long j, long long lo) {
  while (j > lo && ids[j - 1] == ids[j]) --j;
  return j;
}
__device__ __forceinline__ long long run_end(const int32_t* ids, long long j, long long hi) {
  const int32_t id = ids[j];
  while (j < hi && ids[j] == id) ++j;
  return j;
}
// Whether the run holding sorted index j is longer than kLongRun (both scans stop once that is decided).
__device__ __forceinline__ bool in_long_run(const int32_t* ids, long long j, long long n) {
  const long long lo = max(0LL, j - kLongRun - 1), hi = min(n, j + kLongRun + 1);
  return run_end(ids, j, hi) - run_begin(ids, j, lo) > kLongRun;
}

// grid.x: chunks of kLongRun sorted positions, grid.y: column tiles. A chunk meets at most two long runs (neither
// fits inside it): the one holding its first position (partial slot 0) and, if another, the one holding its last
// (slot 1). partials [2, chunks, width] get each one's sum over the chunk, from zero.
template <typename act_t>
__global__ void embedding_long_run_chunks_kernel(const act_t* dy, const int32_t* sorted_ids,
                                                 const int32_t* sorted_pos, float* partials, long long n,
                                                 long long width) {
  const long long c = blockIdx.y * (long long)blockDim.x + threadIdx.x;
  if (c >= width) return;
  const long long chunks = gridDim.x, k = blockIdx.x;
  const long long begin = k * kLongRun, end = min(n, begin + kLongRun);
  if (in_long_run(sorted_ids, begin, n))
    partials[k * width + c] = sum_rows(dy, sorted_pos, begin, run_end(sorted_ids, begin, end), width, c, 0.0f);
  const long long last = end - 1;
  if (sorted_ids[last] != sorted_ids[begin] && in_long_run(sorted_ids, last, n))
    partials[(chunks + k) * width + c] =
        sum_rows(dy, sorted_pos, run_begin(sorted_ids, last, begin), end, width, c, 0.0f);
}

// For each long run, by the chunk where it starts: its chunks' sums, in order, onto the gradient.
__global__ void embedding_long_run_sums_kernel(const int32_t* sorted_ids, float* dweight, const float* partials,
                                               long long n, long long width) {
  const long long c = blockIdx.y * (long long)blockDim.x + threadIdx.x;
  if (c >= width) return;
  const long long chunks = gridDim.x, k = blockIdx.x;
  const long long begin = k * kLongRun, end = min(n, begin + kLongRun);
  const long long start = run_begin(sorted_ids, end - 1, begin);  // a long run starting here holds the last position
  const bool starts_here = start > begin || begin == 0 || sorted_ids[begin - 1] != sorted_ids[begin];
  if (!starts_here || !in_long_run(sorted_ids, start, n)) return;
  const int32_t id = sorted_ids[start];
  float* dst = dweight + static_cast<long long>(id) * width + c;
  float acc = *dst + partials[(start == begin ? k : chunks + k) * width + c];
  for (long long next = k + 1; next < chunks && sorted_ids[next * kLongRun] == id; ++next)
    acc += partials[next * width + c];
  *dst = acc;
}

int key_bits(int64_t vocab) {  // bits that hold ids 0..vocab-1
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Workspace layout: keys_in [n] unsigned | positions_in [n] int32 | cub temp storage.
size_t cub_temp_bytes(int64_t n, int64_t vocab) {
  size_t sort_bytes = 0, select_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const unsigned*>(nullptr),
                                             static_cast<unsigned*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), n, 0, key_bits(vocab), cuda_stream()));
  CUDA_CHECK(cub::DeviceSelect::If(nullptr, select_bytes, static_cast<const int32_t*>(nullptr),
                                   static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n,
                                   IsSegmentStart{nullptr}, cuda_stream()));
  return std::max(sort_bytes, select_bytes);
}

}  // namespace

int64_t embedding_check_ids_cuda(const void* ids, DType ids_dtype, int64_t n, int64_t vocab, void* scratch,
                                 int64_t* bad_id) {
  if (n == 0) return -1;
  auto* first_bad = static_cast<unsigned long long*>(scratch);
  CUDA_CHECK(cudaMemsetAsync(first_bad, 0xFF, sizeof(unsigned long long), cuda_stream()));  // "none": all ones
  with_id_type(ids_dtype, "embedding", [&](auto tag) {
    using I = decltype(tag);
    check_ids_kernel<I><<<grid_for(n, 256), 256, 0, cuda_stream()>>>(static_cast<const I*>(ids), n, vocab,
                                                                      first_bad);
  });
  CUDA_CHECK_LAUNCH("embedding_check_ids");
  unsigned long long host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, first_bad, sizeof host, cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  if (host == ~0ULL) return -1;
  const int64_t position = static_cast<int64_t>(host);
  with_id_type(ids_dtype, "embedding", [&](auto tag) {  // the error path only: fetch the offending id itself
    using I = decltype(tag);
    I value{};
    CUDA_CHECK(cudaMemcpyAsync(&value, static_cast<const I*>(ids) + position, sizeof value, cudaMemcpyDeviceToHost,
                               cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    *bad_id = static_cast<int64_t>(value);
  });
  return position;
}

void embedding_forward_cuda(const float* weight, const void* ids, DType ids_dtype, void* y, DType y_dtype, int64_t n,
                            int64_t width) {
  if (n == 0 || width == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(256, (width + 31) / 32 * 32));
  with_id_type(ids_dtype, "embedding", [&](auto tag) {
    using I = decltype(tag);
    HGRN_CUDA_DISPATCH_ACT(y_dtype, "embedding", [&] {
      embedding_forward_kernel<I, act_t><<<static_cast<unsigned>(n), threads, 0, cuda_stream()>>>(
          weight, static_cast<const I*>(ids), static_cast<act_t*>(y), width);
    });
  });
  CUDA_CHECK_LAUNCH("embedding_forward");
}

size_t embedding_sort_workspace_bytes(int64_t n, int64_t vocab) {
  if (n == 0) return 0;
  return 2 * align_up(static_cast<size_t>(n) * 4) + align_up(cub_temp_bytes(n, vocab));
}

void embedding_sort_cuda(const void* ids, DType ids_dtype, int64_t n, int64_t vocab, int32_t* sorted_ids,
                         int32_t* sorted_pos, int32_t* segment_start, int32_t* num_segments, void* workspace,
                         size_t workspace_bytes) {
  HGRN_CHECK(n < (int64_t{1} << 31) && vocab < (int64_t{1} << 31), "embedding: ", n, " ids or vocab size ", vocab,
             " do not fit the int32 sort");
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(num_segments, 0, sizeof(int32_t), cuda_stream()));
    return;
  }
  HGRN_CHECK(workspace_bytes >= embedding_sort_workspace_bytes(n, vocab), "embedding: sort workspace too small");
  char* ws = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<unsigned*>(ws);
  auto* positions_in = reinterpret_cast<int32_t*>(ws + align_up(static_cast<size_t>(n) * 4));
  void* temp = ws + 2 * align_up(static_cast<size_t>(n) * 4);
  const size_t temp_bytes = workspace_bytes - 2 * align_up(static_cast<size_t>(n) * 4);
  auto* keys_out = reinterpret_cast<unsigned*>(sorted_ids);

  with_id_type(ids_dtype, "embedding", [&](auto tag) {
    using I = decltype(tag);
    sort_input_kernel<I><<<grid_for(n, 256), 256, 0, cuda_stream()>>>(static_cast<const I*>(ids), keys_in,
                                                                       positions_in, n);
  });
  CUDA_CHECK_LAUNCH("embedding_sort_input");
  size_t sort_bytes = temp_bytes, select_bytes = temp_bytes;  // cub takes the size by reference
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys_in, keys_out, positions_in, sorted_pos, n, 0,
                                             key_bits(vocab), cuda_stream()));
  // positions_in is still 0..n-1 (the sort does not write its inputs): here it enumerates sorted indices.
  CUDA_CHECK(cub::DeviceSelect::If(temp, select_bytes, static_cast<const int32_t*>(positions_in), segment_start,
                                   num_segments, n, IsSegmentStart{keys_out}, cuda_stream()));
}

size_t embedding_backward_workspace_bytes(int64_t n, int64_t width) {
  const int64_t chunks = (n + kLongRun - 1) / kLongRun;
  return static_cast<size_t>(2 * chunks * width) * sizeof(float);
}

void embedding_backward_cuda(const void* dy, DType dy_dtype, const int32_t* sorted_ids, const int32_t* sorted_pos,
                             const int32_t* segment_start, const int32_t* num_segments, float* dweight, int64_t n,
                             int64_t vocab, int64_t width, void* workspace, size_t workspace_bytes) {
  if (n == 0 || width == 0) return;
  HGRN_CHECK(workspace_bytes >= embedding_backward_workspace_bytes(n, width),
             "embedding backward: workspace too small");
  const int threads = static_cast<int>(std::min<int64_t>(256, (width + 31) / 32 * 32));
  const unsigned column_tiles = static_cast<unsigned>((width + threads - 1) / threads);
  HGRN_CHECK(column_tiles <= 65535, "embedding backward: width ", width, " is too large");
  const dim3 runs_grid(static_cast<unsigned>(std::min(n, vocab)), column_tiles);
  const dim3 chunks_grid(static_cast<unsigned>((n + kLongRun - 1) / kLongRun), column_tiles);
  auto* partials = static_cast<float*>(workspace);
  HGRN_CUDA_DISPATCH_ACT(dy_dtype, "embedding backward", [&] {
    const auto* dy_act = static_cast<const act_t*>(dy);
    embedding_backward_kernel<act_t><<<runs_grid, threads, 0, cuda_stream()>>>(
        dy_act, sorted_ids, sorted_pos, segment_start, num_segments, dweight, n, width);
    CUDA_CHECK_LAUNCH("embedding_backward");
    embedding_long_run_chunks_kernel<act_t><<<chunks_grid, threads, 0, cuda_stream()>>>(dy_act, sorted_ids,
                                                                                         sorted_pos, partials, n,
                                                                                         width);
    CUDA_CHECK_LAUNCH("embedding_long_run_chunks");
  });
  embedding_long_run_sums_kernel<<<chunks_grid, threads, 0, cuda_stream()>>>(sorted_ids, dweight, partials, n, width);
  CUDA_CHECK_LAUNCH("embedding_long_run_sums");
}

}  // namespace hgrn
