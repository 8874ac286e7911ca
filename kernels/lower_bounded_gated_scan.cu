// lower_bounded_gated_scan.cu: HGRN1's recurrence fused with its gates on the GPU: per element, from î and f̂,
//   λ = e^g (the lower-bounded forget gate, gate_math::decay_gate), u = silu(î)·(1 − λ),  h_t = λ_t h_{t−1} + u_t,
// held to the CPU composition (hgrn2_forget_gate, input_gate_from_forget, swiglu, gated_scan). The chunked scan is
// gated_scan.cu's (64-step chunks; passes in parallel over (batch, chunk, channel), the carries sequential over
// chunks), with the gates computed where î and f̂ are loaded, so that neither g, k nor u is ever stored:
//   forward: summary (chunks 0 .. NT−2: each chunk's scan from zero h_end^(k) and its decay product P^(k) = Π λ),
//            carry (H^(k+1) = P^(k) H^(k) + h_end^(k), kept for the backward), output (the scan again from H^(k),
//            writing o and the final state).
//   backward: summary (chunks 1 .. NT−1: the reverse scan from zero, u^(k) = λ_s dh_s at the first row s, and P^(k)),
//            carry (β^(k−1) = u^(k) + P^(k) β^(k)), grads (per chunk, the reverse scan from β^(k) writing dî and df̂ and
//            the chunk's share of dγ, with h_{t−1} read from o rather than recomputed).
// The gradients need no logarithm: as k = 1 − λ, the step's whole derivative in λ is dL/dλ_t = (h_{t−1} − a_t)·dh_t
// (a = silu(î)), and λ's derivatives in f̂ and γ are products of sigmoids (decay_gate). dî = silu'(î)·k·dh_t.
// Resets (reset_masks): at a reset step h_{t−1} is taken as 0: its decay λ_t is 0 in the scan (so the chunk's decay
// product, and with it the carry across the chunk, is 0 too) and in dL/dλ_t = (0 − a_t)·dh_t, and no gradient flows
// back past it. The kernels are built twice (kResets), so that without resets they are the code they were without.
// Determinism: no atomics; every value is computed by one thread in a fixed order, and γ's gradient is summed per
// (batch, chunk) by one thread, then over those in a fixed order (chunk_sums.cuh).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>

#include "chunk_sums.cuh"
#include "chunked_scan.cuh"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "hgrn2_gate_math.cuh"
#include "lower_bounded_gated_scan.h"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

using gate_math::decay_gate;
using gate_math::DecayGate;

constexpr int kChunk = static_cast<int>(kLowerBoundedScanCudaChunk);
constexpr int kBatch = 8;       // rows whose loads a streaming kernel issues before using them
constexpr int kGradBatch = 4;   // rows whose loads the gradient kernel issues before using them (5 streams)
constexpr int kWide = 4;        // channels a thread of the streaming kernels takes where alignment allows
constexpr int kSumLanes = 8;    // add_chunk_sums' lanes for γ's gradient

struct Geometry : chunked_scan::Dims {
  int64_t i_stride, f_stride;  // row strides of î and f̂ (elements)
};

using chunked_scan::aligned_for;
using chunked_scan::carry_blocks;
using chunked_scan::chunk_grid;
using chunked_scan::kCarryBatch;
using chunked_scan::kThreads;
using chunked_scan::load_v;
using chunked_scan::restarts;
using chunked_scan::store_v;
using chunked_scan::thread_channel;
using chunked_scan::write_v;

// The channels' γ (0 for the unbounded gate).
template <int V>
__device__ __forceinline__ void load_gamma(const float* gamma_row, int c, float (&gamma)[V]) {
  if (gamma_row) {
    load_v<V>(gamma_row + c, gamma);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) gamma[v] = 0.f;
  }
}

// One element's step inputs: the decay λ and the input u = silu(î)·k. Both forward passes take them from here, so
// that they compute the same bits.
struct Step {
  float decay, input;
};
template <typename Act>
__device__ __forceinline__ Step step_of(float i_hat, float f_hat, float gamma) {
  const DecayGate gate = decay_gate(f_hat, gamma);
  const float a = i_hat * stable_sigmoid<Act>(i_hat);
  return {gate.lambda, a * gate.k};
}

// ---------------------------------------------------------------------------------------------------------------------
// Forward.

struct ForwardParams {
  Geometry d;
  const void* i_hat;
  const void* f_hat;
  const float* gamma_row;
  const float* initial_state;  // null: zero
  void* output;
  float* final_state;   // null: not written
  float* chunk_states;  // summary: h_end^(k); carry: H^(k+1), slot k
  float* decays;        // P^(k), slot k
  const uint64_t* reset_masks;  // null: no resets
};

// Chunk k = blockIdx.y (< NT − 1, so whole): the scan from zero and the product of the decays.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) forward_summary_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int64_t row = static_cast<int64_t>(b) * d.T + static_cast<int64_t>(k) * kChunk;
  const Act* ip = static_cast<const Act*>(p.i_hat) + row * d.i_stride + c;
  const Act* fp = static_cast<const Act*>(p.f_hat) + row * d.f_stride + c;
  float gamma[V];
  load_gamma<V>(p.gamma_row, c, gamma);
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float h[V] = {}, product[V];
#pragma unroll
  for (int v = 0; v < V; ++v) product[v] = 1.f;
  for (int i0 = 0; i0 < kChunk; i0 += kBatch) {
    float iv[kBatch][V], fv[kBatch][V];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      load_v<V>(ip + (i0 + i) * d.i_stride, iv[i]);
      load_v<V>(fp + (i0 + i) * d.f_stride, fv[i]);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const Step s = step_of<Act>(iv[i][v], fv[i][v], gamma[v]);
        const float decay = restarts(resets, i0 + i) ? 0.f : s.decay;
        h[v] = decay * h[v] + s.input;
        product[v] *= decay;
      }
  }
  store_v<V>(p.chunk_states + d.slot(b, k, c), h);
  store_v<V>(p.decays + d.slot(b, k, c), product);
}

// Per (batch, channel), chunks in order: H^(k+1) = P^(k) H^(k) + h_end^(k), over h_end^(k) in place.
__global__ void __launch_bounds__(kThreads) forward_carry_kernel(const ForwardParams p) {
  chunked_scan::carry_forward<false>(p.d, p.initial_state, p.chunk_states, p.decays);
}

// Chunk k = first_chunk + blockIdx.y: the scan from the state entering it, writing o; the last chunk writes the final
// state. kWhole: every chunk of the launch is whole (see launch_chunks).
template <typename Act, int V, bool kResets, bool kWhole>
__global__ void __launch_bounds__(kThreads) forward_output_kernel(const ForwardParams p, int first_chunk) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = first_chunk + blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = kWhole ? kChunk : min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  float h[V] = {};
  if (k > 0)
    load_v<V>(p.chunk_states + d.slot(b, k - 1, c), h);
  else if (p.initial_state)
    load_v<V>(p.initial_state + static_cast<int64_t>(b) * d.C + c, h);
  float gamma[V];
  load_gamma<V>(p.gamma_row, c, gamma);
  const Act* ip = static_cast<const Act*>(p.i_hat) + row * d.i_stride + c;
  const Act* fp = static_cast<const Act*>(p.f_hat) + row * d.f_stride + c;
  Act* o = static_cast<Act*>(p.output) + row * d.C + c;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    float iv[kBatch][V], fv[kBatch][V];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(ip + (i0 + i) * d.i_stride, iv[i]);
        load_v<V>(fp + (i0 + i) * d.f_stride, fv[i]);
      }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const Step s = step_of<Act>(iv[i][v], fv[i][v], gamma[v]);
          h[v] = (restarts(resets, i0 + i) ? 0.f : s.decay) * h[v] + s.input;
        }
        store_v<V>(o + static_cast<int64_t>(i0 + i) * d.C, h);
      }
  }
  if (k == d.NT - 1 && p.final_state) store_v<V>(p.final_state + static_cast<int64_t>(b) * d.C + c, h);
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward.

struct BackwardParams {
  Geometry d;
  const void* i_hat;
  const void* f_hat;
  const float* gamma_row;
  const float* initial_state;
  const float* chunk_states;
  const void* output;    // the forward's o (contiguous)
  const void* d_output;  // null: zero (contiguous otherwise)
  const float* d_final_state;
  void* di;
  int64_t di_stride;
  void* df;
  int64_t df_stride;
  float* d_initial_state;
  bool accumulate_di, accumulate_df, accumulate_d_initial_state;
  float* partials;  // [B, NT, C] per-(batch, chunk) sums for γ's gradient; null: not wanted
  float* boundary;  // summary: u^(k) in slot k − 1; carry: β^(k−1) over it
  float* decays;    // P^(k) in slot k − 1
  const uint64_t* reset_masks;  // null: no resets
};

// Chunk k = first_chunk + blockIdx.y (>= 1; only the last may be partial): the reverse scan from zero, u^(k) = λ_s dh_s
// at its first row s, and the product of its decays.
template <typename Act, int V, bool kResets, bool kWhole>
__global__ void __launch_bounds__(kThreads) backward_summary_kernel(const BackwardParams p, int first_chunk) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = first_chunk + blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = kWhole ? kChunk : min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  float gamma[V];
  load_gamma<V>(p.gamma_row, c, gamma);
  const Act* fp = static_cast<const Act*>(p.f_hat) + row * d.f_stride + c;
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * d.C + c : nullptr;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float r[V] = {}, product[V];
#pragma unroll
  for (int v = 0; v < V; ++v) product[v] = 1.f;
  for (int i0 = (n - 1) / kBatch * kBatch; i0 >= 0; i0 -= kBatch) {  // batches of rows, last first
    float fv[kBatch][V], dov[kBatch][V] = {};
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(fp + (i0 + i) * d.f_stride, fv[i]);
        if (d_out) load_v<V>(d_out + static_cast<int64_t>(i0 + i) * d.C, dov[i]);
      }
#pragma unroll
    for (int i = kBatch - 1; i >= 0; --i)
      if (i0 + i < n)
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float decay = restarts(resets, i0 + i) ? 0.f : decay_gate(fv[i][v], gamma[v]).lambda;
          r[v] = decay * (dov[i][v] + r[v]);
          product[v] *= decay;
        }
  }
  store_v<V>(p.boundary + d.slot(b, k - 1, c), r);
  store_v<V>(p.decays + d.slot(b, k - 1, c), product);
}

// Per (batch, channel), chunks in reverse from β^(NT−1) = the final state's gradient: β^(k−1) = u^(k) + P^(k) β^(k),
// written over u^(k) (slot k − 1).
__global__ void __launch_bounds__(kThreads) backward_carry_kernel(const BackwardParams p) {
  chunked_scan::carry_backward<false>(p.d, p.d_final_state, p.boundary, p.decays);
}

// Chunk k = first_chunk + blockIdx.y: the reverse scan from β^(k), rows in batches of kGradBatch, last first, writing
// dî and df̂ and summing the chunk's share of γ's gradient; chunk 0 ends with the initial state's. h_{t−1} is the
// forward's output o_{t−1} (the model keeps o for its norm), or the exact chunk-entry state at the chunk's first row.
template <typename Act, int V, bool kResets, bool kWhole>
__global__ void __launch_bounds__(kThreads) backward_grads_kernel(const BackwardParams p, int first_chunk) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = first_chunk + blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = kWhole ? kChunk : min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  const int64_t state_at = static_cast<int64_t>(b) * d.C + c;
  float entry[V] = {};  // the state entering the chunk
  if (k > 0)
    load_v<V>(p.chunk_states + d.slot(b, k - 1, c), entry);
  else if (p.initial_state)
    load_v<V>(p.initial_state + state_at, entry);
  float gamma[V];
  load_gamma<V>(p.gamma_row, c, gamma);
  float r[V] = {}, dgamma[V] = {};
  if (k < d.NT - 1)
    load_v<V>(p.boundary + d.slot(b, k, c), r);
  else if (p.d_final_state)
    load_v<V>(p.d_final_state + state_at, r);
  const Act* ip = static_cast<const Act*>(p.i_hat) + row * d.i_stride + c;
  const Act* fp = static_cast<const Act*>(p.f_hat) + row * d.f_stride + c;
  const Act* op = static_cast<const Act*>(p.output) + row * d.C + c;
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * d.C + c : nullptr;
  Act* di = p.di ? static_cast<Act*>(p.di) + row * p.di_stride + c : nullptr;
  Act* df = p.df ? static_cast<Act*>(p.df) + row * p.df_stride + c : nullptr;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  for (int i0 = (n - 1) / kGradBatch * kGradBatch; i0 >= 0; i0 -= kGradBatch) {
    float iv[kGradBatch][V], fv[kGradBatch][V], prev[kGradBatch][V], dh[kGradBatch][V] = {};
#pragma unroll
    for (int i = 0; i < kGradBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(ip + (i0 + i) * d.i_stride, iv[i]);
        load_v<V>(fp + (i0 + i) * d.f_stride, fv[i]);
        if (d_out) load_v<V>(d_out + static_cast<int64_t>(i0 + i) * d.C, dh[i]);
        if (restarts(resets, i0 + i)) {  // the state before a reset is 0
#pragma unroll
          for (int v = 0; v < V; ++v) prev[i][v] = 0.f;
        } else if (i0 + i > 0) {
          load_v<V>(op + static_cast<int64_t>(i0 + i - 1) * d.C, prev[i]);
        } else {
#pragma unroll
          for (int v = 0; v < V; ++v) prev[i][v] = entry[v];
        }
      }
#pragma unroll
    for (int i = kGradBatch - 1; i >= 0; --i)
      if (i0 + i < n) {
        float div[V], dfv[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const DecayGate gate = decay_gate(fv[i][v], gamma[v]);
          const float sig = stable_sigmoid<Act>(iv[i][v]);
          const float g = dh[i][v] + r[v];
          r[v] = (restarts(resets, i0 + i) ? 0.f : gate.lambda) * g;
          div[v] = silu_backward_value(iv[i][v], sig, gate.k * g);
          const float d_lambda = (prev[i][v] - iv[i][v] * sig) * g;  // (h_{t−1} − silu(î_t)) dh_t
          dfv[v] = d_lambda * ((1.f - gamma[v]) * gate.sigmoid_x * gate.sigmoid_minus_x);
          dgamma[v] += d_lambda * gate.sigmoid_minus_x;
        }
        if (di) write_v<V>(di + (i0 + i) * p.di_stride, div, p.accumulate_di);
        if (df) write_v<V>(df + (i0 + i) * p.df_stride, dfv, p.accumulate_df);
      }
  }
  if (k == 0 && p.d_initial_state) write_v<V>(p.d_initial_state + state_at, r, p.accumulate_d_initial_state);
  if (p.partials) store_v<V>(p.partials + (static_cast<int64_t>(b) * d.NT + k) * d.C + c, dgamma);
}

// ---------------------------------------------------------------------------------------------------------------------
// Host side.

Geometry make_geometry(const LowerBoundedScanCudaShape& s, int64_t i_stride, int64_t f_stride) {
  Geometry d;
  static_cast<chunked_scan::Dims&>(d) = chunked_scan::make_dims(s.batch, s.time, s.channels, kChunk, "lower_bounded_gated_scan");
  d.i_stride = i_stride ? i_stride : s.channels;
  d.f_stride = f_stride ? f_stride : s.channels;
  HGRN_CHECK(d.i_stride >= d.C && d.f_stride >= d.C, "lower_bounded_gated_scan CUDA: a row stride (î ", d.i_stride,
             ", f̂ ", d.f_stride, ") is narrower than C = ", d.C);
  return d;
}

// Launches kernel<V> for V = wide when `wide_ok`, else V = 1, over `chunks` chunks.
#define HGRN_LAUNCH_WIDE(KERNEL, ACT, WIDE, WIDE_OK, CHUNKS, PARAMS)                                        \
  do {                                                                                                    \
    if (WIDE_OK)                                                                                          \
      KERNEL<ACT, WIDE, kResets><<<chunk_grid(d, WIDE, CHUNKS), kThreads, 0, cuda_stream()>>>(PARAMS);              \
    else                                                                                                  \
      KERNEL<ACT, 1, kResets><<<chunk_grid(d, 1, CHUNKS), kThreads, 0, cuda_stream()>>>(PARAMS);                    \
    CUDA_CHECK_LAUNCH(#KERNEL);                                                                           \
  } while (0)

// Launches a per-chunk kernel over chunks first .. NT − 1: the whole ones with its kWhole build (a row loop of
// constant length: no per-row bounds, so the compiler keeps fewer values live), a partial last one with the other.
#define HGRN_LAUNCH_CHUNKS(KERNEL, ACT, WIDE, WIDE_OK, FIRST, PARAMS)                                              \
  do {                                                                                                          \
    const int first = (FIRST), partial = d.T % kChunk != 0 ? 1 : 0, whole = d.NT - first - partial;             \
    if (whole > 0) {                                                                                            \
      if (WIDE_OK)                                                                                              \
        KERNEL<ACT, WIDE, kResets, true><<<chunk_grid(d, WIDE, whole), kThreads, 0, cuda_stream()>>>(PARAMS, first); \
      else                                                                                                      \
        KERNEL<ACT, 1, kResets, true><<<chunk_grid(d, 1, whole), kThreads, 0, cuda_stream()>>>(PARAMS, first);       \
      CUDA_CHECK_LAUNCH(#KERNEL);                                                                               \
    }                                                                                                           \
    if (partial) {                                                                                              \
      if (WIDE_OK)                                                                                              \
        KERNEL<ACT, WIDE, kResets, false><<<chunk_grid(d, WIDE, 1), kThreads, 0, cuda_stream()>>>(PARAMS, d.NT - 1); \
      else                                                                                                      \
        KERNEL<ACT, 1, kResets, false><<<chunk_grid(d, 1, 1), kThreads, 0, cuda_stream()>>>(PARAMS, d.NT - 1);       \
      CUDA_CHECK_LAUNCH(#KERNEL);                                                                               \
    }                                                                                                           \
  } while (0)

template <typename Act, bool kResets>
void forward_impl(const Geometry& d, const LowerBoundedScanCudaForwardArgs& a) {
  const ForwardParams p{d,        a.i_hat,        a.f_hat,           a.gamma_row,  a.initial_state,
                        a.output, a.final_state, a.chunk_states, a.scratch,    a.reset_masks};
  const size_t act = sizeof(Act), f32 = sizeof(float);
  const bool wide = aligned_for(kWide, d.C,
                                {{a.i_hat, d.i_stride, act},
                                 {a.f_hat, d.f_stride, act},
                                 {a.gamma_row, 0, f32},
                                 {a.output, d.C, act},
                                 {a.initial_state, d.C, f32},
                                 {a.final_state, d.C, f32},
                                 {a.chunk_states, d.C, f32},
                                 {a.scratch, d.C, f32}});
  if (d.NT > 1) {
    HGRN_LAUNCH_WIDE(forward_summary_kernel, Act, kWide, wide, d.NT - 1, p);
    forward_carry_kernel<<<carry_blocks(d), kThreads, 0, cuda_stream()>>>(p);
    CUDA_CHECK_LAUNCH("lower_bounded_scan_forward_carry");
  }
  HGRN_LAUNCH_CHUNKS(forward_output_kernel, Act, kWide, wide, 0, p);
}

template <typename Act, bool kResets>
void backward_impl(const Geometry& d, const LowerBoundedScanCudaBackwardArgs& a) {
  BackwardParams p;
  p.d = d;
  p.i_hat = a.i_hat;
  p.f_hat = a.f_hat;
  p.gamma_row = a.gamma_row;
  p.initial_state = a.initial_state;
  p.chunk_states = a.chunk_states;
  p.output = a.output;
  p.d_output = a.d_output;
  p.d_final_state = a.d_final_state;
  p.di = a.di;
  p.di_stride = a.di_stride ? a.di_stride : d.C;
  p.df = a.df;
  p.df_stride = a.df_stride ? a.df_stride : d.C;
  p.d_initial_state = a.d_initial_state;
  p.accumulate_di = a.accumulate_di;
  p.accumulate_df = a.accumulate_df;
  p.accumulate_d_initial_state = a.accumulate_d_initial_state;
  p.partials = a.dgamma_row ? a.workspace : nullptr;
  p.boundary = a.scratch_a;
  p.decays = a.scratch_b;
  p.reset_masks = a.reset_masks;
  HGRN_CHECK(p.di_stride >= d.C && p.df_stride >= d.C, "lower_bounded_gated_scan CUDA: a gradient row stride (dî ",
             p.di_stride, ", df̂ ", p.df_stride, ") is narrower than C = ", d.C);
  const size_t act = sizeof(Act), f32 = sizeof(float);
  if (d.NT > 1) {
    const bool wide = aligned_for(kWide, d.C,
                                  {{a.f_hat, d.f_stride, act},
                                   {a.gamma_row, 0, f32},
                                   {a.d_output, d.C, act},
                                   {a.scratch_a, d.C, f32},
                                   {a.scratch_b, d.C, f32}});
    HGRN_LAUNCH_CHUNKS(backward_summary_kernel, Act, kWide, wide, 1, p);
    backward_carry_kernel<<<carry_blocks(d), kThreads, 0, cuda_stream()>>>(p);
    CUDA_CHECK_LAUNCH("lower_bounded_scan_backward_carry");
  }
  const bool wide = aligned_for(kWide, d.C,
                                {{a.i_hat, d.i_stride, act},
                                 {a.f_hat, d.f_stride, act},
                                 {a.gamma_row, 0, f32},
                                 {a.initial_state, d.C, f32},
                                 {a.chunk_states, d.C, f32},
                                 {a.output, d.C, act},
                                 {a.d_output, d.C, act},
                                 {a.d_final_state, d.C, f32},
                                 {a.di, p.di_stride, act},
                                 {a.df, p.df_stride, act},
                                 {a.d_initial_state, d.C, f32},
                                 {p.partials, d.C, f32},
                                 {a.scratch_a, d.C, f32}});
  HGRN_LAUNCH_CHUNKS(backward_grads_kernel, Act, kWide, wide, 0, p);
  if (p.partials)
    add_chunk_sums<kSumLanes>(p.partials, a.dgamma_row, static_cast<long long>(d.B) * d.NT, d.C,
                              "lower_bounded_scan_dgamma_reduce");
}

#undef HGRN_LAUNCH_WIDE
#undef HGRN_LAUNCH_CHUNKS

}  // namespace

int64_t lower_bounded_scan_cuda_chunk_elements(const LowerBoundedScanCudaShape& s) {
  return s.batch * ((s.time + kChunk - 1) / kChunk - 1) * s.channels;
}

int64_t lower_bounded_scan_cuda_dgamma_workspace(const LowerBoundedScanCudaShape& s) {
  return s.batch * ((s.time + kChunk - 1) / kChunk) * s.channels;
}

void lower_bounded_scan_cuda_forward(const LowerBoundedScanCudaShape& shape,
                                     const LowerBoundedScanCudaForwardArgs& args) {
  const Geometry d = make_geometry(shape, args.i_stride, args.f_stride);
  HGRN_CHECK(args.i_hat && args.f_hat && args.output, "lower_bounded_scan_cuda_forward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch),
             "lower_bounded_scan_cuda_forward: the chunk-state and scratch buffers are required when T > ", kChunk);
  HGRN_CUDA_DISPATCH_ACT(args.act, "lower_bounded_scan_cuda_forward", [&] {
    if (args.reset_masks)
      forward_impl<act_t, true>(d, args);
    else
      forward_impl<act_t, false>(d, args);
  });
}

void lower_bounded_scan_cuda_backward(const LowerBoundedScanCudaShape& shape,
                                      const LowerBoundedScanCudaBackwardArgs& args) {
  const Geometry d = make_geometry(shape, args.i_stride, args.f_stride);
  HGRN_CHECK(args.i_hat && args.f_hat && args.output, "lower_bounded_scan_cuda_backward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch_a && args.scratch_b),
             "lower_bounded_scan_cuda_backward: the chunk-state and scratch buffers are required when T > ", kChunk);
  HGRN_CHECK(!args.dgamma_row || (args.gamma_row && args.workspace),
             "lower_bounded_scan_cuda_backward: dgamma_row needs gamma_row and a workspace");
  if (!args.di && !args.df && !args.d_initial_state && !args.dgamma_row) return;
  HGRN_CUDA_DISPATCH_ACT(args.act, "lower_bounded_scan_cuda_backward", [&] {
    if (args.reset_masks)
      backward_impl<act_t, true>(d, args);
    else
      backward_impl<act_t, false>(d, args);
  });
}

}  // namespace hgrn
