// hgrn2_gates.cu: the HGRN2 gates on the GPU (hgrn2_gates.h): the lower bound γ, and a layer's gates q = silu(q̂),
// the lower-bounded log forget gate g and the input gate k in one pass each way (the standalone input gate, k from a
// given g, has its own small kernels), forward and backward. The formulas and the branch choices are the CPU reference's
// (src/ops/hgrn2_gates.cpp explains them), written for fp32 arithmetic; min/max are spelled as std::min/std::max
// evaluate them so that a NaN input propagates exactly as on the CPU instead of being swallowed by fminf/fmaxf.
// γ's gradient is a sum over all rows: every block of kRowsPerChunk rows writes its own partial sums, then one
// pass adds the partials in chunk order, so the bits never depend on scheduling (no atomics).
// The [rows, width] kernels take kVec consecutive channels per thread (16-byte fp32 / 8-byte bf16 accesses) when the
// width and pointers allow, else one; a thread keeps its channels for all its rows, so γ's logs are taken once per
// thread instead of per element and no element index is divided by the width.
#include "hgrn2_gates.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <initializer_list>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "chunk_sums.cuh"
#include "elementwise.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

constexpr int kThreads = 256;
// The backward's tile: kCols threads along the channels (one warp, coalesced), each V consecutive channels, by
// kLanes row lanes, each block covering kRowsPerChunk rows. The chunk size fixes the reduction order, so it must not
// depend on the device.
constexpr int kCols = 32;
constexpr int kLanes = 8;
constexpr long long kRowsPerChunk = 128;
constexpr int kVec = 4;
// The forward's block: kThreads threads over (rows, channel packs); each row lane walks about kForwardRows rows.
constexpr int kForwardRows = 16;

// kVec when width and every row stride are multiples of kVec and every (non-null) pointer is 16-byte aligned, else 1.
int vec_for(int64_t width, std::initializer_list<const void*> pointers, std::initializer_list<int64_t> strides = {}) {
  if (width % kVec != 0) return 1;
  for (int64_t s : strides)
    if (s % kVec != 0) return 1;
  for (const void* p : pointers)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  return kVec;
}

// Calls f(std::integral_constant<int, V>{}) for V = vec (kVec or 1).
template <typename F>
void with_vec(int vec, F&& f) {
  if (vec == kVec)
    f(std::integral_constant<int, kVec>{});
  else
    f(std::integral_constant<int, 1>{});
}

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

// σ(x), σ(−x) and e^−|x| from one exponential (never of a positive number), each to relative precision; 1 + e^−|x|
// lies in [1, 2], where the approximate division (2 ulp) is safe.
struct Sigmoids {
  float of_x, of_minus_x, tail;
};
__device__ __forceinline__ Sigmoids sigmoids(float x) {
  const float e = expf(-fabsf(x));
  const float r = __fdividef(1.f, 1.f + e);
  return x >= 0.f ? Sigmoids{r, e * r, e} : Sigmoids{e * r, r, e};
}

// Below this λ the gates take the CPU's log-space forms; at or above it 1/λ <= 2^100, so the direct products below
// neither overflow nor lose their relative precision (and λ is far above where fp32 turns subnormal).
constexpr float kSmallLambda = 0x1p-100f;

// The forget gate of one element: g = log λ and k = 1 − λ, λ = γ + (1 − γ)·σ(x); γ = 0 for an unbounded gate (layer 0,
// no lower bounds, or a bound that rounded to 0). log_gamma = logf(γ), log_one_minus_gamma = log1pf(−γ), the
// channel's, computed once by the caller. The CPU's branches (src/ops/hgrn2_gates.cpp), with cheaper forms where
// they are as accurate: k = u = (1 − γ)·σ(−x) directly (a product of two accurate factors; fla's k = 1 − λ) instead of
// −expm1(g), and for λ <= 1/2, g = log λ of the sum λ = γ + (1 − γ)·σ(x) of two non-negative terms (one rounding)
// instead of logaddexp, unless λ < kSmallLambda (σ(x) near underflow), where the log-space form keeps its precision.
// For λ > 1/2, log1p(−u) is log w + e/w with w = 1 − u rounded and e = (1 − u) − w its rounding error, exact by
// Fast2Sum (1 − w is exact by Sterbenz); the neglected (e/w)²/2 is below 2^-47. So both branches take one logf (of w or
// λ) on the same path: a warp's lanes take either branch, and with a log1pf on one and a logf on the other every warp
// ran both one after the other.
struct ForgetGate {
  float g, k;
};
__device__ __forceinline__ ForgetGate forget_gate(float x, float gamma, float log_gamma, float log_one_minus_gamma) {
  const Sigmoids s = sigmoids(x);
  if (gamma == 0.f) return {std_min(x, 0.f) - log1pf(s.tail), s.of_minus_x};
  const float u = (1.f - gamma) * s.of_minus_x;  // 1 − λ
  const bool near_one = u < 0.5f;                // λ > 1/2
  const float lambda = gamma + (1.f - gamma) * s.of_x;
  if (!near_one && lambda < kSmallLambda)
    return {log_add_exp(log_gamma, log_one_minus_gamma + (std_min(x, 0.f) - log1pf(s.tail))), u};
  const float w = near_one ? 1.f - u : lambda;
  const float e = near_one ? (1.f - w) - u : 0.f;
  const float g = logf(w) + __fdividef(e, w);  // w in [1/2, 1]: the approximate division is safe
  return {near_one ? std_max(g, log_gamma) : g, u};
}

// λ, ∂g/∂f̂ = (1 − γ)·σ(x)·σ(−x)/λ and ∂g/∂γ = σ(−x)/λ of one element (γ = 0: unbounded), with λ recomputed from f̂
// (g is not read back). For λ >= kSmallLambda as products with 1/λ, σ(x)/λ <= 1/(1 − γ) taken first so that nothing
// overflows on the way; below it the CPU's exponentials of sums of logs.
struct ForgetGateGrad {
  float lambda, dg_df, dg_dgamma;
};
// The λ < kSmallLambda branch, out of line: taken only where σ(x) nears underflow, and inlined its logs and
// exponentials took registers from the common path (fewer threads per SM in the backward).
__device__ __noinline__ ForgetGateGrad forget_gate_grad_small(float x, float gamma, float log_gamma,
                                                              float log_one_minus_gamma, float tail_exp) {
  const float g = forget_gate(x, gamma, log_gamma, log_one_minus_gamma).g;
  const float tail = log1pf(tail_exp);
  const float ls_x = std_min(x, 0.f) - tail, ls_minus_x = std_min(-x, 0.f) - tail;
  return {expf(g), expf(log_one_minus_gamma + ls_x - g + ls_minus_x), expf(ls_minus_x - g)};
}
__device__ __forceinline__ ForgetGateGrad forget_gate_grad(float x, float gamma, float log_gamma,
                                                          float log_one_minus_gamma) {
  const Sigmoids s = sigmoids(x);
  const float lambda = gamma + (1.f - gamma) * s.of_x;
  if (lambda >= kSmallLambda) {
    const float inv = __fdividef(1.f, lambda);
    return {lambda, (1.f - gamma) * (s.of_x * inv) * s.of_minus_x, s.of_minus_x * inv};
  }
  return forget_gate_grad_small(x, gamma, log_gamma, log_one_minus_gamma, s.tail);
}


// One pass over [rows, width] for a layer's gates: g = the log forget gate of f̂ (fp32), and where asked (non-null)
// k = 1 − exp(g) and q = silu(q̂), both in T, so that f̂ and q̂ are read once and g is never read back.
// Thread (x, y) of a block takes channel pack blockIdx.x·blockDim.x + x (V channels) of rows blockIdx.y·blockDim.y + y,
// then every gridDim.y·blockDim.y-th row. q̂ and f̂ rows lie q_stride and f_stride elements apart (the outputs'
// width apart).
template <typename T, int V>
__global__ void gates_forward_kernel(const T* __restrict__ q_hat, const T* __restrict__ f_hat,
                                     const float* __restrict__ gamma_row, T* __restrict__ q, float* __restrict__ g,
                                     T* __restrict__ k, long long rows, long long width, long long q_stride,
                                     long long f_stride) {
  const long long pk = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (pk * V >= width) return;
  float gamma[V], log_gamma[V], log_one_minus_gamma[V];
#pragma unroll
  for (int c = 0; c < V; ++c) gamma[c] = log_gamma[c] = log_one_minus_gamma[c] = 0.f;
  if (gamma_row) {
    load_pack<V>(gamma_row, pk, gamma);
#pragma unroll
    for (int c = 0; c < V; ++c) log_gamma[c] = logf(gamma[c]), log_one_minus_gamma[c] = log1pf(-gamma[c]);
  }
  const long long stride = (long long)gridDim.y * blockDim.y;
#pragma unroll 2
  for (long long r = blockIdx.y * (long long)blockDim.y + threadIdx.y; r < rows; r += stride) {
    const long long base = r * width;
    float x[V], kv[V];
    load_pack<V>(f_hat + r * f_stride, pk, x);
#pragma unroll
    for (int c = 0; c < V; ++c) {
      const ForgetGate fg = forget_gate(x[c], gamma[c], log_gamma[c], log_one_minus_gamma[c]);
      x[c] = fg.g;
      kv[c] = fg.k;
    }
    store_pack<V>(g + base, pk, x);
    if (k) store_pack<V>(k + base, pk, kv);
    if (q) {
      load_pack<V>(q_hat + r * q_stride, pk, x);
#pragma unroll
      for (int c = 0; c < V; ++c) x[c] *= stable_sigmoid<T>(x[c]);
      store_pack<V>(q + base, pk, x);
    }
  }
}

// The backward of gates_forward_kernel (cuda_hgrn2_gates_backward documents the arguments).
template <typename T>
struct GatesBackwardParams {
  const T *q_hat, *f_hat;
  const float *gamma_row, *dg;
  const T *dq, *dk;
  T *dq_hat, *df_hat;
  bool add_dq, add_df;
  float* partials;
  long long rows, width;
  long long q_hat_stride, f_hat_stride, dq_hat_stride, df_hat_stride;  // row strides (the others: width)
};

// Block (kCols, kLanes) covers channels [blockIdx.y kCols V, +kCols V) of rows [blockIdx.x kRowsPerChunk,
// +kRowsPerChunk). g's whole gradient, dg − λ·dk (λ = exp(g); a null part counts as zero), goes through the forget
// gate into df_hat and (partials non-null) into the block's per-channel sum for γ, lanes added in lane order; dq_hat
// gets silu's backward of dq. df_hat is stored before dq_hat is read, by the same thread, so the two may alias.
// Capped at 64 registers, 4 blocks per SM (it needs no more with the small-λ branch out of line): with 80 it fit 3 and
// waited on memory.
template <typename T, int V>
__global__ void __launch_bounds__(kCols * kLanes, 4) gates_backward_kernel(const GatesBackwardParams<T> p) {
  __shared__ float lane_sums[kLanes][kCols * V];
  const long long pk = (long long)blockIdx.y * kCols + threadIdx.x;  // this thread's channel pack
  const long long r_begin = (long long)blockIdx.x * kRowsPerChunk;
  const long long r_end = min(p.rows, r_begin + kRowsPerChunk);
  const bool forget = p.df_hat || p.partials;
  float acc[V];
#pragma unroll
  for (int c = 0; c < V; ++c) acc[c] = 0.f;
  if (pk * V < p.width) {
    float gamma[V], log_gamma[V], log_one_minus_gamma[V];
#pragma unroll
    for (int c = 0; c < V; ++c) gamma[c] = log_gamma[c] = log_one_minus_gamma[c] = 0.f;
    if (p.gamma_row) {
      load_pack<V>(p.gamma_row, pk, gamma);
#pragma unroll
      for (int c = 0; c < V; ++c) log_gamma[c] = logf(gamma[c]), log_one_minus_gamma[c] = log1pf(-gamma[c]);
    }
    for (long long r = r_begin + threadIdx.y; r < r_end; r += kLanes) {
      const long long base = r * p.width;
      if (forget) {
        float x[V], d[V], dk[V], df[V];
        load_pack<V>(p.f_hat + r * p.f_hat_stride, pk, x);
        if (p.dg) load_pack<V>(p.dg + base, pk, d);
        if (p.dk) load_pack<V>(p.dk + base, pk, dk);
        if (p.df_hat && p.add_df) load_pack<V>(p.df_hat + r * p.df_hat_stride, pk, df);
#pragma unroll
        for (int c = 0; c < V; ++c) {
          const ForgetGateGrad fg = forget_gate_grad(x[c], gamma[c], log_gamma[c], log_one_minus_gamma[c]);
          float total = p.dg ? d[c] : 0.f;
          if (p.dk) total -= fg.lambda * dk[c];
          const float v = total * fg.dg_df;
          if (p.gamma_row) acc[c] += total * fg.dg_dgamma;
          df[c] = p.add_df ? df[c] + v : v;
        }
        if (p.df_hat) store_pack<V>(p.df_hat + r * p.df_hat_stride, pk, df);
      }
      if (p.dq_hat) {
        float x[V], d[V], dx[V];
        load_pack<V>(p.q_hat + r * p.q_hat_stride, pk, x);
        load_pack<V>(p.dq + base, pk, d);
        if (p.add_dq) load_pack<V>(p.dq_hat + r * p.dq_hat_stride, pk, dx);
#pragma unroll
        for (int c = 0; c < V; ++c) {
          const float v = silu_backward_value(x[c], stable_sigmoid<T>(x[c]), d[c]);
          dx[c] = p.add_dq ? dx[c] + v : v;
        }
        store_pack<V>(p.dq_hat + r * p.dq_hat_stride, pk, dx);
      }
    }
  }
  if (!p.partials) return;  // the same for every thread of the block, so no thread misses the barrier below
#pragma unroll
  for (int c = 0; c < V; ++c) lane_sums[threadIdx.y][threadIdx.x * V + c] = acc[c];
  __syncthreads();
  if (threadIdx.y == 0 && pk * V < p.width) {
#pragma unroll
    for (int c = 0; c < V; ++c) {
      float s = 0.f;
      for (int lane = 0; lane < kLanes; ++lane) s += lane_sums[lane][threadIdx.x * V + c];
      p.partials[blockIdx.x * p.width + pk * V + c] = s;
    }
  }
}

// ---- input gate -------------------------------------------------------------------------------------------------

template <typename G, typename K, int V>
__global__ void input_gate_forward_kernel(const G* __restrict__ g, K* __restrict__ k, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float v[V];
    load_pack<V>(g, i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = -expm1f(v[j]);  // relative precision near g = 0
    store_pack<V>(k, i, v);
  }
}

// add_dg: dg += −exp(g) dk, else dg = 0 − exp(g) dk (the bits of adding to a zero fill, signed zeros included).
template <typename G, typename K, int V>
__global__ void input_gate_backward_kernel(const G* __restrict__ g, const K* __restrict__ dk, G* __restrict__ dg,
                                           bool add_dg, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float gv[V], dkv[V], acc[V];
    load_pack<V>(g, i, gv);
    load_pack<V>(dk, i, dkv);
    if (add_dg) load_pack<V>(dg, i, acc);
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = (add_dg ? acc[j] : 0.f) - expf(gv[j]) * dkv[j];
    store_pack<V>(dg, i, acc);
  }
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

void cuda_hgrn2_gates_forward(const void* q_hat, const void* f_hat, DType dtype, const float* gamma_row, void* q,
                              float* g, void* k, int64_t rows, int64_t width, int64_t q_hat_stride,
                              int64_t f_hat_stride) {
  HGRN_CHECK(!q == !q_hat, "cuda_hgrn2_gates_forward: q and q_hat come together");
  if (rows * width == 0) return;
  if (!q_hat_stride) q_hat_stride = width;
  if (!f_hat_stride) f_hat_stride = width;
  with_vec(vec_for(width, {q_hat, f_hat, gamma_row, q, g, k}, {q_hat_stride, f_hat_stride}), [&](auto vec) {
    constexpr int V = decltype(vec)::value;
    const long long packs = width / V;
    const int tx = static_cast<int>(std::min<long long>(kThreads, (packs + 31) / 32 * 32)), ty = kThreads / tx;
    const long long row_blocks = (rows + (long long)ty * kForwardRows - 1) / ((long long)ty * kForwardRows);
    const long long col_blocks = (packs + tx - 1) / tx;
    HGRN_CHECK(col_blocks <= 0x7fffffffLL, "hgrn2 gates: width ", width, " exceeds the launch grid");
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(std::min<long long>(row_blocks, 65535)));
    HGRN_CUDA_DISPATCH_ACT(dtype, "hgrn2 gates", [&] {
      gates_forward_kernel<act_t, V><<<grid, dim3(tx, ty), 0, cuda_stream()>>>(
          static_cast<const act_t*>(q_hat), static_cast<const act_t*>(f_hat), gamma_row, static_cast<act_t*>(q), g,
          static_cast<act_t*>(k), rows, width, q_hat_stride, f_hat_stride);
    });
  });
  CUDA_CHECK_LAUNCH("hgrn2_gates_forward");
}

int64_t cuda_hgrn2_gates_backward_workspace(int64_t rows, int64_t width) { return row_chunks(rows) * width; }

void cuda_hgrn2_gates_backward(const Hgrn2GatesBackwardArgs& a) {
  HGRN_CHECK(!a.dgamma_row || (a.gamma_row && a.workspace),
             "cuda_hgrn2_gates_backward: dgamma_row needs gamma_row and a workspace");
  HGRN_CHECK(!a.dq_hat || (a.q_hat && a.dq), "cuda_hgrn2_gates_backward: dq_hat needs q_hat and dq");
  const bool forget = (a.df_hat || a.dgamma_row) && (a.dg || a.dk);
  if (a.rows * a.width == 0 || (!forget && !a.dq_hat)) return;
  float* partials = forget && a.dgamma_row ? a.workspace : nullptr;
  const long long chunks = row_chunks(a.rows);
  const auto stride_or_width = [&](int64_t stride) { return stride ? stride : a.width; };
  const int64_t strides[4] = {stride_or_width(a.q_hat_stride), stride_or_width(a.f_hat_stride),
                              stride_or_width(a.dq_hat_stride), stride_or_width(a.df_hat_stride)};
  with_vec(vec_for(a.width, {a.q_hat, a.f_hat, a.gamma_row, a.dq, a.dg, a.dk, a.dq_hat, a.df_hat, partials},
                   {strides[0], strides[1], strides[2], strides[3]}),
           [&](auto vec) {
    constexpr int V = decltype(vec)::value;
    const long long col_tiles = (a.width / V + kCols - 1) / kCols;
    HGRN_CHECK(col_tiles <= 65535 && chunks <= 0x7fffffffLL, "hgrn2 gates backward: [", a.rows, ", ", a.width,
               "] exceeds the launch grid");
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(col_tiles)), block(kCols, kLanes);
    HGRN_CUDA_DISPATCH_ACT(a.dtype, "hgrn2 gates backward", [&] {
      GatesBackwardParams<act_t> p;
      p.q_hat = static_cast<const act_t*>(a.q_hat);
      p.f_hat = static_cast<const act_t*>(a.f_hat);
      p.gamma_row = a.gamma_row;
      p.dg = a.dg;
      p.dq = static_cast<const act_t*>(a.dq);
      p.dk = static_cast<const act_t*>(a.dk);
      p.dq_hat = static_cast<act_t*>(a.dq_hat);
      p.df_hat = forget ? static_cast<act_t*>(a.df_hat) : nullptr;
      p.add_dq = a.add_dq;
      p.add_df = a.add_df;
      p.partials = partials;
      p.rows = a.rows;
      p.width = a.width;
      p.q_hat_stride = strides[0];
      p.f_hat_stride = strides[1];
      p.dq_hat_stride = strides[2];
      p.df_hat_stride = strides[3];
      gates_backward_kernel<act_t, V><<<grid, block, 0, cuda_stream()>>>(p);
    });
  });
  CUDA_CHECK_LAUNCH("hgrn2_gates_backward");
  if (partials) add_chunk_sums<kLanes>(partials, a.dgamma_row, chunks, a.width, "hgrn2_gates_dgamma_reduce");
}

void cuda_input_gate_forward(const void* g, DType g_dtype, void* k, DType k_dtype, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(g_dtype, "input_gate_from_forget", [&] {
    using G = act_t;
    HGRN_CUDA_DISPATCH_ACT(k_dtype, "input_gate_from_forget", [&] {
      // Packs of kVec (float's 16 bytes) for both dtypes; the alignment check is the stricter fp32 one.
      launch_packed<float>(n, {g, k}, [&](auto vec, int64_t first, int64_t packs) {
        constexpr int V = decltype(vec)::value;
        input_gate_forward_kernel<G, act_t, V><<<grid_for(packs, kThreads), kThreads, 0, cuda_stream()>>>(
            static_cast<const G*>(g) + first, static_cast<act_t*>(k) + first, packs);
        CUDA_CHECK_LAUNCH("input_gate_forward");
      });
    });
  });
}

void cuda_input_gate_backward(const void* g, DType g_dtype, const void* dk, DType k_dtype, void* dg, bool add_dg,
                              int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(g_dtype, "input_gate_from_forget backward", [&] {
    using G = act_t;
    HGRN_CUDA_DISPATCH_ACT(k_dtype, "input_gate_from_forget backward", [&] {
      launch_packed<float>(n, {g, dk, dg}, [&](auto vec, int64_t first, int64_t packs) {
        constexpr int V = decltype(vec)::value;
        input_gate_backward_kernel<G, act_t, V><<<grid_for(packs, kThreads), kThreads, 0, cuda_stream()>>>(
            static_cast<const G*>(g) + first, static_cast<const act_t*>(dk) + first, static_cast<G*>(dg) + first,
            add_dg, packs);
        CUDA_CHECK_LAUNCH("input_gate_backward");
      });
    });
  });
}

}  // namespace hgrn
