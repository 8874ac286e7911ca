// cpu_parallel.h: how the CPU ops split work over OpenMP threads: the size below which an op stays on one thread,
// and the loop over rows that also sums a per-column gradient (RMSNorm's weight, the forget gate's lower bound)
// with bits that do not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace hgrn {

// Below this many elements an op runs on one thread: forking a team costs more than the work.
inline constexpr int64_t kMinParallelElements = 1 << 15;

// Rows are processed in fixed blocks of this many by reduce_rows_in_fixed_blocks.
inline constexpr int64_t kRowsPerBlock = 64;

// Calls row_fn(r, partial) for every row r of a [rows, width] problem, in parallel over fixed blocks of
// kRowsPerBlock rows, each block by one thread in row order. `partial` is the block's own zeroed width-long
// accumulator, into which row_fn adds row r's contribution (nullptr when `sum` is null: nothing is summed). Then the
// block partials are added into sum[0, width) in block order. Blocks and both orders are fixed, so sum's bits do not
// depend on the thread count or timing.
template <typename T, typename RowFn>
void reduce_rows_in_fixed_blocks(int64_t rows, int64_t width, T* sum, const RowFn& row_fn) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<T> partials(sum ? static_cast<size_t>(blocks * width) : 0, T(0));
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t b = 0; b < blocks; ++b) {
    T* partial = sum ? partials.data() + b * width : nullptr;
    const int64_t r1 = std::min(rows, (b + 1) * kRowsPerBlock);
    for (int64_t r = b * kRowsPerBlock; r < r1; ++r) row_fn(r, partial);
  }
  if (sum)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t c = 0; c < width; ++c) sum[c] += partials[static_cast<size_t>(b * width + c)];
}

}  // namespace hgrn
