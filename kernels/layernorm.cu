// layernorm.cu: LayerNorm forward and backward (layernorm.h). A block per row (grid-striding over rows): the row's
// statistics are block sums in a fixed order (row_sums.cuh), the mean first and then the variance about it, as the
// CPU reference. The weight and bias gradients are column sums over rows (column_sums.cuh, then chunk_sums.cuh).
#include <algorithm>

#include "column_sums.cuh"
#include "core/tensor.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "layernorm.h"
#include "row_sums.cuh"

namespace hgrn {

namespace {

template <typename T>
__global__ void layernorm_forward_kernel(const T* x, const float* w, const float* b, T* y, float* mean, float* rstd,
                                         long long rows, int width, float eps) {
  __shared__ float warp_sums[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * width;
    float sum = 0.f;
    for (int c = threadIdx.x; c < width; c += blockDim.x) sum += load_f(xr[c]);
    const float mu = block_sum(sum, warp_sums) / (float)width;
    float sum_sq = 0.f;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      const float d = load_f(xr[c]) - mu;
      sum_sq += d * d;
    }
    const float s = 1.f / sqrtf(block_sum(sum_sq, warp_sums) / (float)width + eps);
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = s;
    }
    T* yr = y + row * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x)
      yr[c] = store_f<T>((load_f(xr[c]) - mu) * s * (w ? w[c] : 1.f) + (b ? b[c] : 0.f));
  }
}

// dx (+)= rstd · (u − mean(u) − x̂ · mean(u ⊙ x̂)) per row, u = dy ⊙ w.
template <typename T>
__global__ void layernorm_backward_dx_kernel(const T* x, const float* w, const float* mean, const float* rstd,
                                             const T* dy, T* dx, bool add, long long rows, int width) {
  __shared__ float warp_sums[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = row * width;
    const float mu = mean[row], s = rstd[row];
    float sum_u = 0.f, sum_ux = 0.f;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      const float u = load_f(dy[base + c]) * (w ? w[c] : 1.f);
      sum_u += u;
      sum_ux += u * (load_f(x[base + c]) - mu) * s;
    }
    const float mean_u = block_sum(sum_u, warp_sums) / (float)width;
    const float mean_ux = block_sum(sum_ux, warp_sums) / (float)width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      const float u = load_f(dy[base + c]) * (w ? w[c] : 1.f);
      const float g = s * (u - mean_u - (load_f(x[base + c]) - mu) * s * mean_ux);
      dx[base + c] = store_f<T>(add ? load_f(dx[base + c]) + g : g);
    }
  }
}

// The weight gradient's term for column_sums.cuh: dy ⊙ x̂ at (row, column).
template <typename T>
struct WeightGradTerm {
  const T* x;
  const float* mean;
  const float* rstd;
  const T* dy;
  int width;
  __device__ float operator()(long long r, int c) const {
    return load_f(dy[r * width + c]) * (load_f(x[r * width + c]) - mean[r]) * rstd[r];
  }
};

}  // namespace

void cuda_layernorm_forward(const void* x, const float* weight, const float* bias, void* y, float* mean, float* rstd,
                            int64_t rows, int64_t width, double eps, DType dtype) {
  check_row_width(width, "layernorm");
  if (rows == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "layernorm", [&] {
    layernorm_forward_kernel<act_t><<<row_blocks(rows), row_block_threads(width), 0, cuda_stream()>>>(
        static_cast<const act_t*>(x), weight, bias, static_cast<act_t*>(y), mean, rstd, rows,
        static_cast<int>(width), static_cast<float>(eps));
    CUDA_CHECK_LAUNCH("layernorm_forward");
  });
}

void cuda_layernorm_backward(const void* x, const float* weight, const float* mean, const float* rstd, const void* dy,
                             void* dx, bool add, float* dweight, float* dbias, int64_t rows, int64_t width,
                             DType dtype) {
  check_row_width(width, "layernorm backward");
  if (rows == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "layernorm backward", [&] {
    const act_t* xt = static_cast<const act_t*>(x);
    const act_t* dyt = static_cast<const act_t*>(dy);
    if (dx) {
      layernorm_backward_dx_kernel<act_t><<<row_blocks(rows), row_block_threads(width), 0, cuda_stream()>>>(
          xt, weight, mean, rstd, dyt, static_cast<act_t*>(dx), add, rows, static_cast<int>(width));
      CUDA_CHECK_LAUNCH("layernorm_backward_dx");
    }
    if (!dweight && !dbias) return;
    // One scratch for both sums: freed at the end of this scope but reused only by work queued after these kernels.
    Tensor partial = Tensor::empty({column_sum_chunks(rows), width}, DType::F32, Device::CUDA);
    float* partial_data = static_cast<float*>(partial.raw_data());
    if (dweight)
      add_column_sums(WeightGradTerm<act_t>{xt, mean, rstd, dyt, static_cast<int>(width)}, partial_data, dweight,
                      rows, width, "layernorm_dweight");
    if (dbias)
      add_column_sums(ElementTerm<act_t>{dyt, static_cast<int>(width)}, partial_data, dbias, rows, width,
                      "layernorm_dbias");
  });
}

}  // namespace hgrn
