// complex_gated_scan.cu: the complex gated linear recurrence h_t = w_t h_{t−1} + x_t, w_t = e^{g_t} e^{iθ}, on the GPU
// as a chunked parallel scan, held to the CPU forms in src/ops/complex_gated_scan.cpp. It is gated_scan.cu's design
// with complex states and decays (chunked_scan.cuh: geometry, vector accesses, launch shapes):
// every pass but the carries runs in parallel over (batch, chunk, channel), coalesced over channels, in 64-step
// chunks. A chunk's decay is the product of its steps' factors, P^(k) = e^{S^(k)} e^{i n θ} (S^(k) = Σ g over its n
// steps). Forward:
//   summary (chunks 0 .. NT−2): each chunk's scan from zero, h_end^(k), and P^(k).
//   carry   (per batch and channel, sequential over chunks): the state entering chunk k + 1,
//           H^(k+1) = P^(k) H^(k) + h_end^(k), written over h_end^(k) and kept for the backward.
//   output  (every chunk): the scan again from H^(k), writing [Re h, Im h] (and the final state from the last chunk).
// Backward, with δ_t = dL/dRe h_t + i·dL/dIm h_t = do_t + conj(w_{t+1}) δ_{t+1} (multiplying by w has the adjoint
// multiplying by conj(w)), and β^(k) the gradient of chunk k's last state from outside it (β^(NT−1) = the final
// state's gradient):
//   summary (chunks 1 .. NT−1): each chunk's reverse scan from zero, u^(k) = conj(w_s) δ_s at its first row s, and
//           P^(k).
//   carry   (per batch and channel, chunks in reverse): β^(k−1) = u^(k) + conj(P^(k)) β^(k), written over u^(k).
//   grads   (every chunk): p_t = w_t h_{t−1} recomputed over the chunk from H^(k), then the reverse scan from β^(k)
//           writing dx_t = δ_t, dg_t = Re(conj(δ_t) p_t) and the chunk's share of dθ, Σ_t Re(conj(δ_t) i p_t), into
//           its row of a [B·NT, C] scratch; chunk 0 ends with dL/dh_{−1} = conj(w_0) δ_0. dθ is then the sum of the
//           rows in row order (chunk_sums.cuh).
// Resets (reset_masks): a reset step's factor w_t is taken as 0 (h_t = x_t, p_t = 0, nothing flows back past it), and
// so is the decay P^(k) of a chunk holding one. The kernels are built twice (kResets), so that without resets they are
// the code they were without.
// Complex per-chunk buffers hold the real parts of all slots, then the imaginary parts (Geometry::part apart).
// Determinism: no atomics; every value is computed by one thread, or summed, in a fixed order. All arithmetic is fp32
// with expf and sincosf.
#include <cuda_bf16.h>

#include <cstdint>

#include "chunk_sums.cuh"
#include "chunked_scan.cuh"
#include "complex_gated_scan.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"

namespace hgrn {

namespace {

constexpr int kChunk = static_cast<int>(kGatedScanCudaChunk);
constexpr int kBatch = 16;             // rows whose loads a per-chunk kernel issues before using them
constexpr int kOutputBatch = 8;        // the same for the output pass, whose stores hold more registers
constexpr int kThetaSumLanes = 16;     // add_chunk_sums' lanes for dθ

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

struct Geometry : chunked_scan::Dims {
  int64_t part;  // floats between the real and the imaginary parts of a complex per-chunk buffer: B·(NT − 1)·C
  // Offset of batch b, channel c in a [B, 2, C] state (the imaginary part C further).
  __device__ int64_t state_at(int b, int c) const { return static_cast<int64_t>(b) * 2 * C + c; }
};

// cos and sin of n·θ for the thread's V channels: e^{i n θ}.
template <int V>
struct Rotation {
  float cos_[V], sin_[V];
  __device__ Rotation(const float* theta, int c, float n) {
    float th[V];
    load_v<V>(theta + c, th);
#pragma unroll
    for (int v = 0; v < V; ++v) sincosf(n * th[v], &sin_[v], &cos_[v]);
  }
};

// (hr, hi) ← a e^{iθ} (hr, hi) + (xr, xi), with (c, s) = (cos θ, sin θ).
__device__ __forceinline__ void step_forward(float a, float c, float s, float xr, float xi, float& hr, float& hi) {
  const float r = a * (c * hr - s * hi) + xr;
  hi = a * (s * hr + c * hi) + xi;
  hr = r;
}

// (br, bi) ← conj(a e^{iθ}) (dr, di).
__device__ __forceinline__ void step_back(float a, float c, float s, float dr, float di, float& br, float& bi) {
  br = a * (c * dr + s * di);
  bi = a * (c * di - s * dr);
}

// ---------------------------------------------------------------------------------------------------------------------
// Forward.

struct ForwardParams {
  Geometry d;
  const void* x_re;
  const void* x_im;
  const float* g;
  const float* theta;
  const float* initial_state;  // null: zero
  void* output;
  float* final_state;   // null: not written
  float* chunk_states;  // summary: h_end^(k); carry: H^(k+1), slot k
  float* decays;        // P^(k), slot k
  const uint64_t* reset_masks;  // null: no resets
};

// Chunk k = blockIdx.y (< NT − 1, so whole): the scan from zero and the chunk's decay.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) forward_summary_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int64_t C = d.C, row = static_cast<int64_t>(b) * d.T + static_cast<int64_t>(k) * kChunk;
  const Act* xr = static_cast<const Act*>(p.x_re) + row * C + c;
  const Act* xi = static_cast<const Act*>(p.x_im) + row * C + c;
  const float* g = p.g + row * C + c;
  const Rotation<V> w(p.theta, c, 1.f);
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float hr[V] = {}, hi[V] = {}, total[V] = {};
  for (int i0 = 0; i0 < kChunk; i0 += kBatch) {
    float xrv[kBatch][V], xiv[kBatch][V], gv[kBatch][V];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      load_v<V>(xr + (i0 + i) * C, xrv[i]);
      load_v<V>(xi + (i0 + i) * C, xiv[i]);
      load_v<V>(g + (i0 + i) * C, gv[i]);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) {
        step_forward(restarts(resets, i0 + i) ? 0.f : expf(gv[i][v]), w.cos_[v], w.sin_[v], xrv[i][v], xiv[i][v],
                     hr[v], hi[v]);
        total[v] += gv[i][v];
      }
  }
  const int64_t slot = d.slot(b, k, c);
  store_v<V>(p.chunk_states + slot, hr);
  store_v<V>(p.chunk_states + d.part + slot, hi);
  const Rotation<V> whole(p.theta, c, static_cast<float>(kChunk));
  float pr[V], pi[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const float e = resets ? 0.f : expf(total[v]);  // a chunk holding a reset passes no carry on
    pr[v] = e * whole.cos_[v];
    pi[v] = e * whole.sin_[v];
  }
  store_v<V>(p.decays + slot, pr);
  store_v<V>(p.decays + d.part + slot, pi);
}

// Per (batch, channel), chunks in order: H^(k+1) = P^(k) H^(k) + h_end^(k), over h_end^(k) in place.
__global__ void __launch_bounds__(kThreads) forward_carry_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(d.B) * d.C) return;
  const int b = static_cast<int>(idx / d.C), c = static_cast<int>(idx % d.C);
  const int64_t at = d.state_at(b, c);
  float hr = p.initial_state ? p.initial_state[at] : 0.f, hi = p.initial_state ? p.initial_state[at + d.C] : 0.f;
  float* sr = p.chunk_states + d.slot(b, 0, c);
  float* si = sr + d.part;
  const float* pr = p.decays + d.slot(b, 0, c);
  const float* pi = pr + d.part;
  const int n = d.NT - 1;
  for (int k0 = 0; k0 < n; k0 += kCarryBatch) {
    float s_r[kCarryBatch], s_i[kCarryBatch], e_r[kCarryBatch], e_i[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (k0 + j < n) {
        const int64_t o = static_cast<int64_t>(k0 + j) * d.C;
        s_r[j] = sr[o], s_i[j] = si[o], e_r[j] = pr[o], e_i[j] = pi[o];
      }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (k0 + j < n) {
        const int64_t o = static_cast<int64_t>(k0 + j) * d.C;
        const float r = e_r[j] * hr - e_i[j] * hi + s_r[j];
        hi = e_r[j] * hi + e_i[j] * hr + s_i[j];
        hr = r;
        sr[o] = hr;
        si[o] = hi;
      }
  }
}

// Chunk k = blockIdx.y: the scan from the state entering it, writing [Re h, Im h]; the last chunk writes the final
// state.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) forward_output_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t C = d.C, row = static_cast<int64_t>(b) * d.T + t0;
  float hr[V] = {}, hi[V] = {};
  if (k > 0) {
    load_v<V>(p.chunk_states + d.slot(b, k - 1, c), hr);
    load_v<V>(p.chunk_states + d.part + d.slot(b, k - 1, c), hi);
  } else if (p.initial_state) {
    load_v<V>(p.initial_state + d.state_at(b, c), hr);
    load_v<V>(p.initial_state + d.state_at(b, c) + C, hi);
  }
  const Act* xr = static_cast<const Act*>(p.x_re) + row * C + c;
  const Act* xi = static_cast<const Act*>(p.x_im) + row * C + c;
  const float* g = p.g + row * C + c;
  Act* o = static_cast<Act*>(p.output) + row * 2 * C + c;
  const Rotation<V> w(p.theta, c, 1.f);
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  for (int i0 = 0; i0 < n; i0 += kOutputBatch) {
    float xrv[kOutputBatch][V], xiv[kOutputBatch][V], gv[kOutputBatch][V];
#pragma unroll
    for (int i = 0; i < kOutputBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(xr + (i0 + i) * C, xrv[i]);
        load_v<V>(xi + (i0 + i) * C, xiv[i]);
        load_v<V>(g + (i0 + i) * C, gv[i]);
      }
#pragma unroll
    for (int i = 0; i < kOutputBatch; ++i)
      if (i0 + i < n) {
#pragma unroll
        for (int v = 0; v < V; ++v)
          step_forward(restarts(resets, i0 + i) ? 0.f : expf(gv[i][v]), w.cos_[v], w.sin_[v], xrv[i][v], xiv[i][v],
                       hr[v], hi[v]);
        store_v<V>(o + (i0 + i) * 2 * C, hr);
        store_v<V>(o + (i0 + i) * 2 * C + C, hi);
      }
  }
  if (k == d.NT - 1 && p.final_state) {
    store_v<V>(p.final_state + d.state_at(b, c), hr);
    store_v<V>(p.final_state + d.state_at(b, c) + C, hi);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward.

struct BackwardParams {
  Geometry d;
  const void* x_re;
  const void* x_im;
  const float* g;
  const float* theta;
  const float* initial_state;
  const float* chunk_states;
  const void* d_output;  // null: zero
  const float* d_final_state;
  void* dx_re;
  void* dx_im;
  float* dg;
  float* theta_rows;  // [B·NT, C]: each chunk's share of dθ
  float* d_initial_state;
  bool accumulate_dx_re, accumulate_dx_im, accumulate_dg, accumulate_d_initial_state;
  float* boundary;  // summary: u^(k) in slot k − 1; carry: β^(k−1) over it
  float* decays;    // P^(k) in slot k − 1
  const uint64_t* reset_masks;  // null: no resets
};

// Chunk k = blockIdx.y + 1 (>= 1; only the last may be partial): the reverse scan from zero, u^(k) = conj(w_s) δ_s at
// its first row s, and its decay.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) backward_summary_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y + 1, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t C = d.C, row = static_cast<int64_t>(b) * d.T + t0;
  const float* g = p.g + row * C + c;
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * 2 * C + c : nullptr;
  const Rotation<V> w(p.theta, c, 1.f);
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float rr[V] = {}, ri[V] = {}, total[V] = {};
  for (int i0 = (n - 1) / kBatch * kBatch; i0 >= 0; i0 -= kBatch) {  // batches of rows, last first
    float gv[kBatch][V], dor[kBatch][V] = {}, doi[kBatch][V] = {};
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(g + (i0 + i) * C, gv[i]);
        if (d_out) {
          load_v<V>(d_out + (i0 + i) * 2 * C, dor[i]);
          load_v<V>(d_out + (i0 + i) * 2 * C + C, doi[i]);
        }
      }
#pragma unroll
    for (int i = kBatch - 1; i >= 0; --i)
      if (i0 + i < n)
#pragma unroll
        for (int v = 0; v < V; ++v) {
          step_back(restarts(resets, i0 + i) ? 0.f : expf(gv[i][v]), w.cos_[v], w.sin_[v], dor[i][v] + rr[v],
                    doi[i][v] + ri[v], rr[v], ri[v]);
          total[v] += gv[i][v];
        }
  }
  const int64_t slot = d.slot(b, k - 1, c);
  store_v<V>(p.boundary + slot, rr);
  store_v<V>(p.boundary + d.part + slot, ri);
  const Rotation<V> whole(p.theta, c, static_cast<float>(n));
  float pr[V], pi[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const float e = resets ? 0.f : expf(total[v]);
    pr[v] = e * whole.cos_[v];
    pi[v] = e * whole.sin_[v];
  }
  store_v<V>(p.decays + slot, pr);
  store_v<V>(p.decays + d.part + slot, pi);
}

// Per (batch, channel), chunks in reverse from β^(NT−1) = the final state's gradient:
// β^(k−1) = u^(k) + conj(P^(k)) β^(k), written over u^(k) (slot k − 1).
__global__ void __launch_bounds__(kThreads) backward_carry_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(d.B) * d.C) return;
  const int b = static_cast<int>(idx / d.C), c = static_cast<int>(idx % d.C);
  const int64_t at = d.state_at(b, c);
  float br = p.d_final_state ? p.d_final_state[at] : 0.f, bi = p.d_final_state ? p.d_final_state[at + d.C] : 0.f;
  float* ur = p.boundary + d.slot(b, 0, c);
  float* ui = ur + d.part;
  const float* pr = p.decays + d.slot(b, 0, c);
  const float* pi = pr + d.part;
  for (int j0 = d.NT - 2; j0 >= 0; j0 -= kCarryBatch) {  // slots j0, j0 − 1, ... (chunk k = slot + 1)
    float u_r[kCarryBatch], u_i[kCarryBatch], e_r[kCarryBatch], e_i[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (j0 - j >= 0) {
        const int64_t o = static_cast<int64_t>(j0 - j) * d.C;
        u_r[j] = ur[o], u_i[j] = ui[o], e_r[j] = pr[o], e_i[j] = pi[o];
      }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (j0 - j >= 0) {
        const int64_t o = static_cast<int64_t>(j0 - j) * d.C;
        const float r = u_r[j] + e_r[j] * br + e_i[j] * bi;
        bi = u_i[j] + e_r[j] * bi - e_i[j] * br;
        br = r;
        ur[o] = br;
        ui[o] = bi;
      }
  }
}

// Chunk k = blockIdx.y, one channel a thread: p_t = w_t h_{t−1} over the chunk (in registers: the loops are
// unrolled), then the reverse scan from β^(k) writing dx_re, dx_im, dg and the chunk's share of dθ; chunk 0 ends with
// the initial state's gradient.
template <typename Act, bool kResets>
__global__ void __launch_bounds__(kThreads) backward_grads_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<1>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t C = d.C, row = static_cast<int64_t>(b) * d.T + t0, at = d.state_at(b, c);
  float hr = 0.f, hi = 0.f;
  if (k > 0) {
    hr = p.chunk_states[d.slot(b, k - 1, c)];
    hi = p.chunk_states[d.part + d.slot(b, k - 1, c)];
  } else if (p.initial_state) {
    hr = p.initial_state[at];
    hi = p.initial_state[at + C];
  }
  const Act* xr = static_cast<const Act*>(p.x_re) + row * C + c;
  const Act* xi = static_cast<const Act*>(p.x_im) + row * C + c;
  const float* g = p.g + row * C + c;
  float sn, cs;
  sincosf(p.theta[c], &sn, &cs);
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float q_r[kChunk], q_i[kChunk];  // p_t = w_t h_{t−1}
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (i < n) {
      const float a = restarts(resets, i) ? 0.f : expf(g[i * C]);
      q_r[i] = a * (cs * hr - sn * hi);
      q_i[i] = a * (sn * hr + cs * hi);
      hr = q_r[i] + load_f(xr[i * C]);
      hi = q_i[i] + load_f(xi[i * C]);
    }
  }
  float rr = 0.f, ri = 0.f;
  if (k < d.NT - 1) {
    rr = p.boundary[d.slot(b, k, c)];
    ri = p.boundary[d.part + d.slot(b, k, c)];
  } else if (p.d_final_state) {
    rr = p.d_final_state[at];
    ri = p.d_final_state[at + C];
  }
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * 2 * C + c : nullptr;
  Act* dxr = p.dx_re ? static_cast<Act*>(p.dx_re) + row * C + c : nullptr;
  Act* dxi = p.dx_im ? static_cast<Act*>(p.dx_im) + row * C + c : nullptr;
  float* dg = p.dg ? p.dg + row * C + c : nullptr;
  float d_theta = 0.f;
#pragma unroll
  for (int i = kChunk - 1; i >= 0; --i) {
    if (i < n) {
      float dr[1] = {rr}, di[1] = {ri};  // δ_t
      if (d_out) {
        dr[0] += load_f(d_out[i * 2 * C]);
        di[0] += load_f(d_out[i * 2 * C + C]);
      }
      float dgv[1] = {dr[0] * q_r[i] + di[0] * q_i[i]};
      d_theta += di[0] * q_r[i] - dr[0] * q_i[i];
      step_back(restarts(resets, i) ? 0.f : expf(g[i * C]), cs, sn, dr[0], di[0], rr, ri);
      if (dxr) write_v<1>(dxr + i * C, dr, p.accumulate_dx_re);
      if (dxi) write_v<1>(dxi + i * C, di, p.accumulate_dx_im);  // after dx_re: adds onto it where they alias
      if (dg) write_v<1>(dg + i * C, dgv, p.accumulate_dg);
    }
  }
  if (k == 0 && p.d_initial_state) {
    float r[1] = {rr}, im[1] = {ri};
    write_v<1>(p.d_initial_state + at, r, p.accumulate_d_initial_state);
    write_v<1>(p.d_initial_state + at + C, im, p.accumulate_d_initial_state);
  }
  if (p.theta_rows) p.theta_rows[(static_cast<int64_t>(b) * d.NT + k) * C + c] = d_theta;
}

// ---------------------------------------------------------------------------------------------------------------------
// Host side.

Geometry make_geometry(const GatedScanCudaShape& s) {
  Geometry d;
  static_cast<chunked_scan::Dims&>(d) =
      chunked_scan::make_dims(s.batch, s.time, s.channels, kChunk, "complex_gated_scan");
  d.part = gated_scan_cuda_chunk_elements(s);
  return d;
}

template <typename Act, bool kResets>
void forward_impl(const Geometry& d, const ComplexScanCudaForwardArgs& a) {
  const ForwardParams p{d, a.x_re, a.x_im, a.g, a.theta, a.initial_state, a.output, a.final_state, a.chunk_states,
                        a.scratch, a.reset_masks};
  const size_t act = sizeof(Act), f32 = sizeof(float);
  // States and per-chunk buffers hold their imaginary parts C and part floats on: both even when C is.
  const bool pairs = aligned_for(2, d.C, {{a.x_re, d.C, act},
                                         {a.x_im, d.C, act},
                                         {a.g, d.C, f32},
                                         {a.theta, d.C, f32},
                                         {a.output, 2 * d.C, act},
                                         {a.initial_state, d.C, f32},
                                         {a.final_state, d.C, f32},
                                         {a.chunk_states, d.C, f32},
                                         {a.scratch, d.C, f32}});
  cudaStream_t stream = cuda_stream();
  if (d.NT > 1) {
    if (pairs)
      forward_summary_kernel<Act, 2, kResets><<<chunk_grid(d, 2, d.NT - 1), kThreads, 0, stream>>>(p);
    else
      forward_summary_kernel<Act, 1, kResets><<<chunk_grid(d, 1, d.NT - 1), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("complex_gated_scan_forward_summary");
    forward_carry_kernel<<<carry_blocks(d), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("complex_gated_scan_forward_carry");
  }
  if (pairs)
    forward_output_kernel<Act, 2, kResets><<<chunk_grid(d, 2, d.NT), kThreads, 0, stream>>>(p);
  else
    forward_output_kernel<Act, 1, kResets><<<chunk_grid(d, 1, d.NT), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("complex_gated_scan_forward_output");
}

template <typename Act, bool kResets>
void backward_impl(const Geometry& d, const ComplexScanCudaBackwardArgs& a) {
  const BackwardParams p{d,
                         a.x_re,
                         a.x_im,
                         a.g,
                         a.theta,
                         a.initial_state,
                         a.chunk_states,
                         a.d_output,
                         a.d_final_state,
                         a.dx_re,
                         a.dx_im,
                         a.dg,
                         a.d_theta ? a.theta_rows : nullptr,
                         a.d_initial_state,
                         a.accumulate_dx_re,
                         a.accumulate_dx_im,
                         a.accumulate_dg,
                         a.accumulate_d_initial_state,
                         a.scratch_a,
                         a.scratch_b,
                         a.reset_masks};
  cudaStream_t stream = cuda_stream();
  if (d.NT > 1) {
    const bool pairs = aligned_for(2, d.C, {{a.g, d.C, sizeof(float)},
                                           {a.theta, d.C, sizeof(float)},
                                           {a.d_output, 2 * d.C, sizeof(Act)},
                                           {a.scratch_a, d.C, sizeof(float)},
                                           {a.scratch_b, d.C, sizeof(float)}});
    if (pairs)
      backward_summary_kernel<Act, 2, kResets><<<chunk_grid(d, 2, d.NT - 1), kThreads, 0, stream>>>(p);
    else
      backward_summary_kernel<Act, 1, kResets><<<chunk_grid(d, 1, d.NT - 1), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("complex_gated_scan_backward_summary");
    backward_carry_kernel<<<carry_blocks(d), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("complex_gated_scan_backward_carry");
  }
  backward_grads_kernel<Act, kResets><<<chunk_grid(d, 1, d.NT), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("complex_gated_scan_backward_grads");
  if (a.d_theta)
    add_chunk_sums<kThetaSumLanes>(a.theta_rows, a.d_theta, static_cast<long long>(d.B) * d.NT, d.C,
                                   "complex_gated_scan_d_theta");
}

}  // namespace

int64_t complex_gated_scan_cuda_chunk_elements(const GatedScanCudaShape& s) {
  return 2 * gated_scan_cuda_chunk_elements(s);
}

int64_t complex_gated_scan_cuda_theta_rows(const GatedScanCudaShape& s) {
  return s.batch * ((s.time + kChunk - 1) / kChunk) * s.channels;
}

void complex_gated_scan_cuda_forward(const GatedScanCudaShape& shape, const ComplexScanCudaForwardArgs& args) {
  const Geometry d = make_geometry(shape);
  HGRN_CHECK(args.x_re && args.x_im && args.g && args.theta && args.output,
             "complex_gated_scan_cuda_forward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch),
             "complex_gated_scan_cuda_forward: the chunk-state and scratch buffers are required when T > ", kChunk);
  HGRN_CUDA_DISPATCH_ACT(args.act, "complex_gated_scan_cuda_forward", [&] {
    if (args.reset_masks)
      forward_impl<act_t, true>(d, args);
    else
      forward_impl<act_t, false>(d, args);
  });
}

void complex_gated_scan_cuda_backward(const GatedScanCudaShape& shape, const ComplexScanCudaBackwardArgs& args) {
  const Geometry d = make_geometry(shape);
  HGRN_CHECK(args.x_re && args.x_im && args.g && args.theta, "complex_gated_scan_cuda_backward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch_a && args.scratch_b),
             "complex_gated_scan_cuda_backward: the chunk-state and scratch buffers are required when T > ", kChunk);
  HGRN_CHECK(!args.d_theta || args.theta_rows, "complex_gated_scan_cuda_backward: d_theta needs its scratch rows");
  if (!args.dx_re && !args.dx_im && !args.dg && !args.d_theta && !args.d_initial_state) return;
  HGRN_CUDA_DISPATCH_ACT(args.act, "complex_gated_scan_cuda_backward", [&] {
    if (args.reset_masks)
      backward_impl<act_t, true>(d, args);
    else
      backward_impl<act_t, false>(d, args);
  });
}

}  // namespace hgrn
