// rmsnorm.cu: RMSNorm and add + RMSNorm forward and backward (rmsnorm.h), llm.c-style.
// Forward and the input gradient take one block per row: a row (width <= a few thousand) fits a block's loop, and
// its two statistics (Σx², Σ dy·w·x̂) are block reductions. The weight gradient Σ_rows dy ⊙ x̂ is a column sum over
// all rows; instead of atomics it is summed in fixed chunks of rows into an fp32 scratch [chunks, width] and then
// over the chunks in order, so its bits depend only on the shape, not on scheduling or the GPU model.
#include <algorithm>

#include "core/tensor.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "rmsnorm.h"

namespace hgrn {

namespace {
// The sum of v over the block, the same value in every thread. blockDim.x must be a multiple of 32. The order is
// fixed (a shuffle tree in each warp, then the warp totals in warp order), so the bits repeat run to run.
// warp_sums is __shared__ float[32]; the leading barrier lets a loop call this again without a race on it.
__device__ float block_sum(float v, float* warp_sums) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < (int)blockDim.x / 32; ++w) total += warp_sums[w];
  return total;
}

// A row per block (grid-striding over rows). delta non-null: add_rmsnorm, the row normalised is the rounded x + delta,
// which this thread stored to `sum` and reads back (its own writes: no barrier needed).
template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* delta, T* sum, const float* w, T* y, float* rstd,
                                       long long rows, int width, float eps) {
  __shared__ float warp_sums[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = row * width;
    const T* xr = x + base;
    float sum_sq = 0.f;
    if (delta) {
      for (int c = threadIdx.x; c < width; c += blockDim.x) {
        const T s = store_f<T>(load_f(xr[c]) + load_f(delta[base + c]));
        sum[base + c] = s;
        const float v = load_f(s);
        sum_sq += v * v;
      }
      xr = sum + base;
    } else {
      for (int c = threadIdx.x; c < width; c += blockDim.x) {
        const float v = load_f(xr[c]);
        sum_sq += v * v;
      }
    }
    const float s = 1.f / sqrtf(block_sum(sum_sq, warp_sums) / (float)width + eps);
    if (threadIdx.x == 0) rstd[row] = s;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      float v = load_f(xr[c]) * s;
      if (w) v *= w[c];
      y[base + c] = store_f<T>(v);
    }
  }
}

// g = s · (dy ⊙ w − x̂ · mean(dy ⊙ w ⊙ x̂)) + dsum per row, accumulated into dx0 and dx1 (either may be null; they may
// alias, as when add_rmsnorm's residual and delta are one tensor: each element's two updates come from one thread).
template <typename T>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const float* w, const float* rstd, const T* dy,
                                           const T* dsum, T* dx0, T* dx1, long long rows, int width) {
  __shared__ float warp_sums[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = row * width;
    const float s = rstd[row];
    float mean_dot = 0.f;
    if (dy) {
      float dot = 0.f;
      for (int c = threadIdx.x; c < width; c += blockDim.x)
        dot += load_f(dy[base + c]) * (w ? w[c] : 1.f) * load_f(x[base + c]) * s;
      mean_dot = block_sum(dot, warp_sums) / (float)width;
    }
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      float g = 0.f;
      if (dy) g = s * (load_f(dy[base + c]) * (w ? w[c] : 1.f) - load_f(x[base + c]) * s * mean_dot);
      if (dsum) g += load_f(dsum[base + c]);
      if (dx0) dx0[base + c] = store_f<T>(load_f(dx0[base + c]) + g);
      if (dx1) dx1[base + c] = store_f<T>(load_f(dx1[base + c]) + g);
    }
  }
}

// The weight gradient's first pass: block (x, y) sums dy ⊙ x̂ over rows [y·kDwChunkRows, (y+1)·kDwChunkRows) for 32
// columns. Each of the kDwGroups thread rows takes every kDwGroups-th row of the chunk (a warp reads 32 adjacent
// columns of one row: coalesced), then thread row 0 adds the groups' sums in group order.
constexpr int kDwChunkRows = 256;
constexpr int kDwColumns = 32;
constexpr int kDwGroups = 8;
constexpr unsigned kMaxGridY = 65535;

template <typename T>
__global__ void rmsnorm_dw_partial_kernel(const T* x, const float* rstd, const T* dy, float* partial, long long rows,
                                          int width, long long chunks) {
  __shared__ float group_sums[kDwGroups][kDwColumns + 1];
  const int c = blockIdx.x * kDwColumns + threadIdx.x;
  for (long long chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const long long r1 = (chunk + 1) * kDwChunkRows < rows ? (chunk + 1) * kDwChunkRows : rows;
    float acc = 0.f;
    if (c < width)
      for (long long r = chunk * kDwChunkRows + threadIdx.y; r < r1; r += kDwGroups)
        acc += load_f(dy[r * width + c]) * load_f(x[r * width + c]) * rstd[r];
    group_sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < width) {
      float total = 0.f;
      for (int g = 0; g < kDwGroups; ++g) total += group_sums[g][threadIdx.x];
      partial[chunk * width + c] = total;
    }
    __syncthreads();  // group_sums is rewritten by the next chunk
  }
}

// The second pass: dw[c] += Σ_chunks partial[chunk, c], chunks in order.
__global__ void rmsnorm_dw_finalize_kernel(const float* partial, float* dw, long long chunks, int width) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float total = 0.f;
  for (long long k = 0; k < chunks; ++k) total += partial[k * width + c];
  dw[c] += total;
}

// About 4 elements per thread, whole warps, at most 1024 threads.
int threads_for_width(int64_t width) {
  const int64_t warps = ((width + 3) / 4 + 31) / 32;
  return static_cast<int>(std::clamp<int64_t>(warps, 1, 32) * 32);
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20)); }

void check_width(int64_t width, const char* op) {
  HGRN_CHECK(width > 0 && width <= (int64_t{1} << 30), op, ": width ", width, " out of range");
}
}  // namespace

void cuda_rmsnorm_forward(const void* x, const void* delta, void* sum, const float* weight, void* y, float* rstd,
                          int64_t rows, int64_t width, double eps, DType dtype) {
  check_width(width, "rmsnorm");
  HGRN_CHECK(!delta || sum, "add_rmsnorm: no buffer for the sum");
  if (rows == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rmsnorm", [&] {
    rmsnorm_forward_kernel<act_t><<<row_blocks(rows), threads_for_width(width), 0, cuda_stream()>>>(
        static_cast<const act_t*>(x), static_cast<const act_t*>(delta), static_cast<act_t*>(sum), weight,
        static_cast<act_t*>(y), rstd, rows, static_cast<int>(width), static_cast<float>(eps));
    CUDA_CHECK_LAUNCH("rmsnorm_forward");
  });
}

void cuda_rmsnorm_backward(const void* x, const float* weight, const float* rstd, const void* dy, const void* dsum,
                           void* dx0, void* dx1, float* dweight, int64_t rows, int64_t width, DType dtype) {
  check_width(width, "rmsnorm backward");
  if (rows == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rmsnorm backward", [&] {
    const act_t* xt = static_cast<const act_t*>(x);
    const act_t* dyt = static_cast<const act_t*>(dy);
    if ((dx0 || dx1) && (dy || dsum)) {
      rmsnorm_backward_dx_kernel<act_t><<<row_blocks(rows), threads_for_width(width), 0, cuda_stream()>>>(
          xt, weight, rstd, dyt, static_cast<const act_t*>(dsum), static_cast<act_t*>(dx0), static_cast<act_t*>(dx1),
          rows, static_cast<int>(width));
      CUDA_CHECK_LAUNCH("rmsnorm_backward_dx");
    }
    if (dweight && dy) {
      const int64_t chunks = (rows + kDwChunkRows - 1) / kDwChunkRows;
      // Freed at the end of this scope but reused only by work queued after these kernels (one stream).
      Tensor partial = Tensor::empty({chunks, width}, DType::F32, Device::CUDA);
      float* partial_data = static_cast<float*>(partial.raw_data());
      const dim3 grid(static_cast<unsigned>((width + kDwColumns - 1) / kDwColumns),
                      static_cast<unsigned>(std::min<int64_t>(chunks, kMaxGridY)));
      rmsnorm_dw_partial_kernel<act_t><<<grid, dim3(kDwColumns, kDwGroups), 0, cuda_stream()>>>(
          xt, rstd, dyt, partial_data, rows, static_cast<int>(width), chunks);
      CUDA_CHECK_LAUNCH("rmsnorm_dw_partial");
      rmsnorm_dw_finalize_kernel<<<grid_for(width, 256), 256, 0, cuda_stream()>>>(partial_data, dweight, chunks,
                                                                                    static_cast<int>(width));
      CUDA_CHECK_LAUNCH("rmsnorm_dw_finalize");
    }
  });
}

}  // namespace hgrn
