// column_sums.cuh: the first pass of hgrn's deterministic column reductions (a parameter's gradient summed over rows:
// a norm's weight and bias, a bias): partial[chunk, c] = Σ term(r, c) over the rows r of each chunk of
// kColumnChunkRows rows; chunk_sums.cuh's add_chunk_sums then adds the chunks in order. Block (x, y) takes
// kColumnSumColumns columns of chunk y (grid-striding over chunks); each of its kColumnSumGroups thread rows sums
// every kColumnSumGroups-th row of the chunk (a warp reads 32 adjacent columns of one row: coalesced), then thread
// row 0 adds the groups in group order. No atomics: the bits depend only on the shape.
#pragma once
#include <algorithm>
#include <cstdint>

#include "chunk_sums.cuh"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"

namespace hgrn {

constexpr int kColumnChunkRows = 256;
constexpr int kColumnSumColumns = 32;
constexpr int kColumnSumGroups = 8;
constexpr int kColumnSumFinalLanes = 16;  // add_chunk_sums' lanes

inline int64_t column_sum_chunks(int64_t rows) { return (rows + kColumnChunkRows - 1) / kColumnChunkRows; }

// Term: a copyable functor, __device__ float operator()(long long row, int column) const.
template <typename Term>
__global__ void column_chunk_sums_kernel(const Term term, float* partial, long long rows, int width,
                                         long long chunks) {
  __shared__ float group_sums[kColumnSumGroups][kColumnSumColumns + 1];
  const int c = blockIdx.x * kColumnSumColumns + threadIdx.x;
  for (long long chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const long long r1 = (chunk + 1) * kColumnChunkRows < rows ? (chunk + 1) * kColumnChunkRows : rows;
    float acc = 0.f;
    if (c < width)
      for (long long r = chunk * kColumnChunkRows + threadIdx.y; r < r1; r += kColumnSumGroups) acc += term(r, c);
    group_sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < width) {
      float total = 0.f;
      for (int g = 0; g < kColumnSumGroups; ++g) total += group_sums[g][threadIdx.x];
      partial[chunk * width + c] = total;
    }
    __syncthreads();  // group_sums is rewritten by the next chunk
  }
}

// The term that sums an act-dtype [rows, width] tensor itself (a bias's gradient: Σ_rows dy).
template <typename T>
struct ElementTerm {
  const T* values;
  int width;
  __device__ float operator()(long long r, int c) const { return load_f(values[r * width + c]); }
};

// Queues the first pass into partial [column_sum_chunks(rows), width]. `name` goes into the launch-failure message.
template <typename Term>
void column_chunk_sums(const Term& term, float* partial, int64_t rows, int64_t width, const char* name) {
  const int64_t chunks = column_sum_chunks(rows);
  const dim3 grid(static_cast<unsigned>((width + kColumnSumColumns - 1) / kColumnSumColumns),
                  static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  column_chunk_sums_kernel<Term><<<grid, dim3(kColumnSumColumns, kColumnSumGroups), 0, cuda_stream()>>>(
      term, partial, rows, static_cast<int>(width), chunks);
  CUDA_CHECK_LAUNCH(name);
}

// Both passes: dst[c] += Σ_rows term(r, c) (accumulate false: dst[c] = that sum), through an fp32 scratch `partial` of
// column_sum_chunks(rows)·width floats (the caller's, so that memory goes through hgrn's allocator).
template <typename Term>
void add_column_sums(const Term& term, float* partial, float* dst, int64_t rows, int64_t width, const char* name,
                     bool accumulate = true) {
  column_chunk_sums(term, partial, rows, width, name);
  add_chunk_sums<kColumnSumFinalLanes>(partial, dst, column_sum_chunks(rows), width, name, accumulate);
}

}  // namespace hgrn
