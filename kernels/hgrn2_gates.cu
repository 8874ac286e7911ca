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
#include "hgrn2_gate_math.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

using namespace gate_math;

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
          const ForgetGateGrad fg = forget_gate_grad<T>(x[c], gamma[c], log_gamma[c], log_one_minus_gamma[c]);
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
