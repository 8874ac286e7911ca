// hgrn2_gates.cu: the HGRN2 gates on the GPU (hgrn2_gates.h): the lower bound γ, the lower-bounded log forget gate
// and the input gate, forward and backward. The formulas and the branch choices are the CPU reference's
// (src/ops/hgrn2_gates.cpp explains them), written for fp32 arithmetic; min/max are spelled as std::min/std::max
// evaluate them so that a NaN input propagates exactly as on the CPU instead of being swallowed by fminf/fmaxf.
// γ's gradient is a sum over all rows: every block of kRowsPerChunk rows writes its own partial sums, then one
// pass adds the partials in chunk order, so the bits never depend on scheduling (no atomics).
#include "hgrn2_gates.h"

#include <cuda_bf16.h>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"

namespace hgrn {

namespace {

constexpr int kThreads = 256;
// The backward's tile: kCols consecutive channels (one warp, coalesced) by kLanes row lanes, each block covering
// kRowsPerChunk rows. The chunk size fixes the reduction order, so it must not depend on the device.
constexpr int kCols = 32;
constexpr int kLanes = 8;
constexpr long long kRowsPerChunk = 128;

__device__ __forceinline__ float std_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float std_max(float a, float b) { return a < b ? b : a; }

// log(exp(a) + exp(b)) for a, b ≤ 0, either possibly −inf.
__device__ __forceinline__ float log_add_exp(float a, float b) {
  const float hi = std_max(a, b), lo = std_min(a, b);
  if (hi == -INFINITY) return hi;
  return hi + log1pf(expf(lo - hi));
}

// ---- lower bound (tiny: one thread per channel, looping over the layers) ------------------------------------

__global__ void lower_bound_forward_kernel(const float* lower_bounds, float* probs, float* gamma, long long layers,
                                           long long width) {
  const long long d = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (d >= width) return;
  float max_value = lower_bounds[d];
  for (long long l = 1; l < layers; ++l) max_value = std_max(max_value, lower_bounds[l * width + d]);
  float total = 0.f;
  for (long long l = 0; l < layers; ++l) {
    const float e = expf(lower_bounds[l * width + d] - max_value);
    probs[l * width + d] = e;
    total += e;
  }
  // (e_1 + … + e_ℓ) / S, as on the CPU: γ_0 = 0 exactly and no cancellation against P_0.
  float partial = 0.f;
  gamma[d] = 0.f;
  for (long long l = 1; l < layers; ++l) {
    partial += probs[l * width + d];
    gamma[l * width + d] = partial / total;
  }
  for (long long l = 0; l < layers; ++l) probs[l * width + d] /= total;
}

// dP_j = Σ_{ℓ ≥ j} dγ_ℓ (j ≥ 1), dP_0 = 0; dΓ_j += P_j (dP_j − Σ_m P_m dP_m). The suffix sums are formed twice
// in the same order (identical values) rather than kept in a per-thread array of unknown length.
__global__ void lower_bound_backward_kernel(const float* probs, const float* dgamma, float* dlower_bounds,
                                            long long layers, long long width) {
  const long long d = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (d >= width) return;
  float suffix = 0.f, weighted = 0.f;
  for (long long l = layers - 1; l >= 1; --l) {
    suffix += dgamma[l * width + d];
    weighted += probs[l * width + d] * suffix;
  }
  suffix = 0.f;
  for (long long l = layers - 1; l >= 1; --l) {
    suffix += dgamma[l * width + d];
    dlower_bounds[l * width + d] += probs[l * width + d] * (suffix - weighted);
  }
  dlower_bounds[d] += probs[d] * (0.f - weighted);
}

// ---- forget gate ----------------------------------------------------------------------------------------------

// g for one element; bounded is false for layer 0 and for a model without lower bounds.
__device__ __forceinline__ float forget_gate_value(float x, bool bounded, float gamma) {
  const float tail = expf(-fabsf(x));
  if (!bounded || gamma == 0.f) return std_min(x, 0.f) - log1pf(tail);
  const float sigmoid_neg = x >= 0.f ? tail / (1.f + tail) : 1.f / (1.f + tail);  // σ(−f̂), relative precision
  const float u = (1.f - gamma) * sigmoid_neg;                                      // 1 − λ
  const float log_gamma = logf(gamma);
  if (u < 0.5f) return std_max(log1pf(-u), log_gamma);
  const float log_sig = std_min(x, 0.f) - log1pf(tail);
  return log_add_exp(log_gamma, log1pf(-gamma) + log_sig);
}

template <typename T>
__global__ void forget_gate_forward_kernel(const T* f_hat, const float* gamma_row, float* g, long long n,
                                           long long width) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    g[i] = forget_gate_value(load_f(f_hat[i]), gamma_row != nullptr, gamma_row ? gamma_row[i % width] : 0.f);
}

// Block (kCols, kLanes) covers channels [blockIdx.y kCols, +kCols) of rows [blockIdx.x kRowsPerChunk, +kRowsPerChunk).
// partials (null when γ's gradient is not wanted) gets the block's per-channel sum, lanes added in lane order.
template <typename T>
__global__ void forget_gate_backward_kernel(const T* f_hat, const float* gamma_row, const float* g, const float* dg,
                                            T* df_hat, float* partials, long long rows, long long width) {
  __shared__ float lane_sums[kLanes][kCols];
  const long long c = (long long)blockIdx.y * kCols + threadIdx.x;
  const long long r_begin = (long long)blockIdx.x * kRowsPerChunk;
  const long long r_end = min(rows, r_begin + kRowsPerChunk);
  float acc = 0.f;
  if (c < width) {
    const float log_one_minus_gamma = gamma_row ? log1pf(-gamma_row[c]) : 0.f;
    for (long long r = r_begin + threadIdx.y; r < r_end; r += kLanes) {
      const long long i = r * width + c;
      const float x = load_f(f_hat[i]);
      // log σ(x) and log σ(−x) share the one transcendental tail, and exp is only taken of −|x|.
      const float tail = log1pf(expf(-fabsf(x)));
      const float ls_x = std_min(x, 0.f) - tail, ls_minus_x = std_min(-x, 0.f) - tail;
      const float d = dg[i];
      if (!gamma_row) {
        if (df_hat) df_hat[i] = store_f<T>(load_f(df_hat[i]) + d * expf(ls_minus_x));
        continue;
      }
      const float gi = g[i];
      if (df_hat) df_hat[i] = store_f<T>(load_f(df_hat[i]) + d * expf(log_one_minus_gamma + ls_x - gi + ls_minus_x));
      acc += d * expf(ls_minus_x - gi);
    }
  }
  if (!partials) return;  // the same for every thread of the block, so no thread misses the barrier below
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
    float s = 0.f;
    for (int lane = 0; lane < kLanes; ++lane) s += lane_sums[lane][threadIdx.x];
    partials[blockIdx.x * width + c] = s;
  }
}

__global__ void add_chunk_partials_kernel(const float* partials, float* dgamma_row, long long chunks, long long width) {
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < width; c += (long long)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (long long k = 0; k < chunks; ++k) s += partials[k * width + c];
    dgamma_row[c] += s;
  }
}

// ---- input gate -------------------------------------------------------------------------------------------------

template <typename G, typename K>
__global__ void input_gate_forward_kernel(const G* g, K* k, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    k[i] = store_f<K>(-expm1f(load_f(g[i])));
}

template <typename G, typename K>
__global__ void input_gate_backward_kernel(const G* g, const K* dk, G* dg, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dg[i] = store_f<G>(load_f(dg[i]) - expf(load_f(g[i])) * load_f(dk[i]));
}

long long row_chunks(int64_t rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

}  // namespace

void cuda_lower_bound_forward(const float* lower_bounds, float* probs, float* gamma, int64_t layers, int64_t width) {
  if (width == 0) return;
  lower_bound_forward_kernel<<<grid_for(width, kThreads), kThreads, 0, cuda_stream()>>>(lower_bounds, probs, gamma,
                                                                                        layers, width);
  CUDA_CHECK_LAUNCH("lower_bound_forward");
}

void cuda_lower_bound_backward(const float* probs, const float* dgamma, float* dlower_bounds, int64_t layers,
                               int64_t width) {
  if (width == 0) return;
  lower_bound_backward_kernel<<<grid_for(width, kThreads), kThreads, 0, cuda_stream()>>>(probs, dgamma,
                                                                                         dlower_bounds, layers, width);
  CUDA_CHECK_LAUNCH("lower_bound_backward");
}

void cuda_forget_gate_forward(const void* f_hat, DType f_dtype, const float* gamma_row, float* g, int64_t rows,
                              int64_t width) {
  const long long n = rows * width;
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(f_dtype, "hgrn2_forget_gate", [&] {
    forget_gate_forward_kernel<act_t><<<grid_for(n, kThreads), kThreads, 0, cuda_stream()>>>(
        static_cast<const act_t*>(f_hat), gamma_row, g, n, width);
  });
  CUDA_CHECK_LAUNCH("forget_gate_forward");
}

int64_t cuda_forget_gate_backward_workspace(int64_t rows, int64_t width) { return row_chunks(rows) * width; }

void cuda_forget_gate_backward(const void* f_hat, DType f_dtype, const float* gamma_row, const float* g,
                               const float* dg, void* df_hat, float* dgamma_row, float* workspace, int64_t rows,
                               int64_t width) {
  if (rows * width == 0 || (!df_hat && !dgamma_row)) return;
  HGRN_CHECK(!dgamma_row || (gamma_row && workspace), "cuda_forget_gate_backward: dgamma_row needs gamma_row and a workspace");
  const long long chunks = row_chunks(rows), col_tiles = (width + kCols - 1) / kCols;
  HGRN_CHECK(col_tiles <= 65535 && chunks <= 0x7fffffffLL, "hgrn2_forget_gate backward: [", rows, ", ", width,
             "] exceeds the launch grid");
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(col_tiles)), block(kCols, kLanes);
  float* partials = dgamma_row ? workspace : nullptr;
  HGRN_CUDA_DISPATCH_ACT(f_dtype, "hgrn2_forget_gate backward", [&] {
    forget_gate_backward_kernel<act_t><<<grid, block, 0, cuda_stream()>>>(
        static_cast<const act_t*>(f_hat), gamma_row, g, dg, static_cast<act_t*>(df_hat), partials, rows, width);
  });
  CUDA_CHECK_LAUNCH("forget_gate_backward");
  if (!dgamma_row) return;
  add_chunk_partials_kernel<<<grid_for(width, kThreads), kThreads, 0, cuda_stream()>>>(partials, dgamma_row, chunks,
                                                                                       width);
  CUDA_CHECK_LAUNCH("forget_gate_dgamma_reduce");
}

void cuda_input_gate_forward(const void* g, DType g_dtype, void* k, DType k_dtype, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(g_dtype, "input_gate_from_forget", [&] {
    using G = act_t;
    HGRN_CUDA_DISPATCH_ACT(k_dtype, "input_gate_from_forget", [&] {
      input_gate_forward_kernel<G, act_t><<<grid_for(n, kThreads), kThreads, 0, cuda_stream()>>>(
          static_cast<const G*>(g), static_cast<act_t*>(k), n);
    });
  });
  CUDA_CHECK_LAUNCH("input_gate_forward");
}

void cuda_input_gate_backward(const void* g, DType g_dtype, const void* dk, DType k_dtype, void* dg, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(g_dtype, "input_gate_from_forget backward", [&] {
    using G = act_t;
    HGRN_CUDA_DISPATCH_ACT(k_dtype, "input_gate_from_forget backward", [&] {
      input_gate_backward_kernel<G, act_t><<<grid_for(n, kThreads), kThreads, 0, cuda_stream()>>>(
          static_cast<const G*>(g), static_cast<const act_t*>(dk), static_cast<G*>(dg), n);
    });
  });
  CUDA_CHECK_LAUNCH("input_gate_backward");
}

}  // namespace hgrn
