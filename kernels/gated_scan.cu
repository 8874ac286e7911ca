// gated_scan.cu: the gated linear recurrence h_t = e^{g_t} h_{t−1} + x_t (o_t = h_t) on the GPU as a chunked
// parallel scan, held to the CPU forms in src/ops/gated_scan.cpp.
//
// One thread per channel would leave a GPU mostly idle at HGRN1's shapes (B·C = 8192 sequences), so time is cut into
// 64-step chunks and every pass but the carries runs in parallel over (batch, chunk, channel), coalesced over
// channels (a thread takes 2 adjacent channels where alignment allows: one 4-byte bf16 pair and one 8-byte fp32 pair
// per row). Forward:
//   summary (chunks 0 .. NT−2): each chunk's scan from zero, h_end^(k), and its total log decay S^(k) = Σ g.
//   carry   (per batch and channel, sequential over chunks): the state entering chunk k + 1,
//           H^(k+1) = e^{S^(k)} H^(k) + h_end^(k), written over h_end^(k) and kept for the backward.
//   output  (every chunk): the scan again from H^(k), writing o (and the final state from the last chunk).
// Backward, the same in reverse: with dh_t = do_t + e^{g_{t+1}} dh_{t+1}, let β^(k) = e^{g_s} dh_s at the first row s
// of chunk k + 1 (β^(NT−1) = the final state's gradient):
//   summary (chunks 1 .. NT−1): each chunk's reverse scan from zero, u^(k) = e^{g_s} dh_s (s its first row), and S^(k).
//   carry   (per batch and channel, chunks in reverse): β^(k−1) = u^(k) + e^{S^(k)} β^(k), written over u^(k).
//   grads   (every chunk): h_{t−1} recomputed over the chunk from H^(k), then the reverse scan from β^(k) writing
//           dx_t = dh_t and dg_t = h_{t−1} e^{g_t} dh_t; chunk 0 ends with dL/dh_{−1} = e^{g_0} dh_0.
// h_{t−1} for dg is recomputed in fp32 from the kept chunk-entry states, not read from the bf16 output: as exact as
// the forward, and re-reading x (2 bytes a step) costs less than storing an fp32 copy of h (4 written, 4 read).
// Every chunk but the last is whole, so the summary passes never see a partial chunk.
// Resets (reset_masks): a reset step's decay is taken as 0 (h_t = x_t, dg_t = 0, nothing flows back past it), and a
// chunk holding one passes no carry on either way (chunked_scan.cuh). The kernels are built twice (kResets): without
// resets they compile to the code they were without them, registers and bits alike.
// Loads are issued kBatch rows at a time ahead of the dependent chain that uses them, so that each thread keeps many
// in flight (the chain itself is a few FMAs a row).
// Determinism: no atomics; every value is computed by one thread in a fixed order, so results are bitwise
// reproducible. All arithmetic is fp32 with expf (the decays compound over the carries).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>

#include "chunked_scan.cuh"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "gated_scan.h"

namespace hgrn {

namespace {

constexpr int kChunk = static_cast<int>(kGatedScanCudaChunk);
constexpr int kBatch = 16;      // rows whose loads a per-chunk kernel issues before using them

struct Geometry : chunked_scan::Dims {
  int64_t x_stride, g_stride;  // row strides of x and g (elements)
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

// ---------------------------------------------------------------------------------------------------------------------
// Forward.

struct ForwardParams {
  Geometry d;
  const void* x;
  const float* g;
  const float* initial_state;  // null: zero
  void* output;
  float* final_state;   // null: not written
  float* chunk_states;  // summary: h_end^(k); carry: H^(k+1), slot k
  float* decays;        // S^(k), slot k
  const uint64_t* reset_masks;  // null: no resets
};

// Chunk k = blockIdx.y (< NT − 1, so whole): the scan from zero and the total log decay.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) forward_summary_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int64_t row = static_cast<int64_t>(b) * d.T + static_cast<int64_t>(k) * kChunk;
  const Act* x = static_cast<const Act*>(p.x) + row * d.x_stride + c;
  const float* g = p.g + row * d.g_stride + c;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float h[V] = {}, total[V] = {};
  for (int i0 = 0; i0 < kChunk; i0 += kBatch) {
    float xv[kBatch][V], gv[kBatch][V];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      load_v<V>(x + (i0 + i) * d.x_stride, xv[i]);
      load_v<V>(g + (i0 + i) * d.g_stride, gv[i]);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) {
        h[v] = (restarts(resets, i0 + i) ? 0.f : expf(gv[i][v])) * h[v] + xv[i][v];
        total[v] += gv[i][v];
      }
  }
  store_v<V>(p.chunk_states + d.slot(b, k, c), h);
  store_v<V>(p.decays + d.slot(b, k, c), total);
}

// Per (batch, channel), chunks in order: H^(k+1) = e^{S^(k)} H^(k) + h_end^(k), over h_end^(k) in place.
template <bool kResets>
__global__ void __launch_bounds__(kThreads) forward_carry_kernel(const ForwardParams p) {
  chunked_scan::carry_forward<true>(p.d, p.initial_state, p.chunk_states, p.decays, kResets ? p.reset_masks : nullptr);
}

// Chunk k = blockIdx.y: the scan from the state entering it, writing o; the last chunk writes the final state.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) forward_output_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  float h[V] = {};
  if (k > 0)
    load_v<V>(p.chunk_states + d.slot(b, k - 1, c), h);
  else if (p.initial_state)
    load_v<V>(p.initial_state + static_cast<int64_t>(b) * d.C + c, h);
  const Act* x = static_cast<const Act*>(p.x) + row * d.x_stride + c;
  const float* g = p.g + row * d.g_stride + c;
  Act* o = static_cast<Act*>(p.output) + row * d.C + c;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    float xv[kBatch][V], gv[kBatch][V];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(x + (i0 + i) * d.x_stride, xv[i]);
        load_v<V>(g + (i0 + i) * d.g_stride, gv[i]);
      }
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
#pragma unroll
        for (int v = 0; v < V; ++v) h[v] = (restarts(resets, i0 + i) ? 0.f : expf(gv[i][v])) * h[v] + xv[i][v];
        store_v<V>(o + static_cast<int64_t>(i0 + i) * d.C, h);
      }
  }
  if (k == d.NT - 1 && p.final_state) store_v<V>(p.final_state + static_cast<int64_t>(b) * d.C + c, h);
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward.

struct BackwardParams {
  Geometry d;
  const void* x;
  const float* g;
  const float* initial_state;
  const float* chunk_states;
  const void* d_output;  // null: zero (contiguous otherwise)
  const float* d_final_state;
  void* dx;
  int64_t dx_stride;
  float* dg;
  int64_t dg_stride;
  float* d_initial_state;
  bool accumulate_dx, accumulate_dg, accumulate_d_initial_state;
  float* boundary;  // summary: u^(k) in slot k − 1; carry: β^(k−1) over it
  float* decays;    // S^(k) in slot k − 1
  const uint64_t* reset_masks;  // null: no resets
};

// Chunk k = blockIdx.y + 1 (>= 1; only the last may be partial): the reverse scan from zero, u^(k) = e^{g_s} dh_s at
// its first row s, and its total log decay.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) backward_summary_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y + 1, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  const float* g = p.g + row * d.g_stride + c;
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * d.C + c : nullptr;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float r[V] = {}, total[V] = {};
  for (int i0 = (n - 1) / kBatch * kBatch; i0 >= 0; i0 -= kBatch) {  // batches of rows, last first
    float gv[kBatch][V], dov[kBatch][V] = {};
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (i0 + i < n) {
        load_v<V>(g + (i0 + i) * d.g_stride, gv[i]);
        if (d_out) load_v<V>(d_out + static_cast<int64_t>(i0 + i) * d.C, dov[i]);
      }
#pragma unroll
    for (int i = kBatch - 1; i >= 0; --i)
      if (i0 + i < n)
#pragma unroll
        for (int v = 0; v < V; ++v) {
          r[v] = (restarts(resets, i0 + i) ? 0.f : expf(gv[i][v])) * (dov[i][v] + r[v]);
          total[v] += gv[i][v];
        }
  }
  store_v<V>(p.boundary + d.slot(b, k - 1, c), r);
  store_v<V>(p.decays + d.slot(b, k - 1, c), total);
}

// Per (batch, channel), chunks in reverse from β^(NT−1) = the final state's gradient: β^(k−1) = u^(k) + e^{S^(k)} β^(k),
// written over u^(k) (slot k − 1).
template <bool kResets>
__global__ void __launch_bounds__(kThreads) backward_carry_kernel(const BackwardParams p) {
  chunked_scan::carry_backward<true>(p.d, p.d_final_state, p.boundary, p.decays, kResets ? p.reset_masks : nullptr);
}

// Chunk k = blockIdx.y: h_{t−1} and e^{g_t} over the chunk (in registers: the loops are unrolled), then the reverse
// scan from β^(k) writing dx and dg; chunk 0 ends with the initial state's gradient.
template <typename Act, int V, bool kResets>
__global__ void __launch_bounds__(kThreads) backward_grads_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  const int64_t state_at = static_cast<int64_t>(b) * d.C + c;
  float h[V] = {};
  if (k > 0)
    load_v<V>(p.chunk_states + d.slot(b, k - 1, c), h);
  else if (p.initial_state)
    load_v<V>(p.initial_state + state_at, h);
  const Act* x = static_cast<const Act*>(p.x) + row * d.x_stride + c;
  const float* g = p.g + row * d.g_stride + c;
  const uint64_t resets = kResets ? d.resets(p.reset_masks, b, k) : 0;  // kResets false: as without
  float decay[kChunk][V], h_prev[kChunk][V];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (i < n) {
      float xv[V], gv[V];
      load_v<V>(x + i * d.x_stride, xv);
      load_v<V>(g + i * d.g_stride, gv);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        decay[i][v] = restarts(resets, i) ? 0.f : expf(gv[v]);  // a reset: h_{t−1} is dropped, dg_t = 0
        h_prev[i][v] = h[v];
        h[v] = decay[i][v] * h[v] + xv[v];
      }
    }
  }
  float r[V] = {};
  if (k < d.NT - 1)
    load_v<V>(p.boundary + d.slot(b, k, c), r);
  else if (p.d_final_state)
    load_v<V>(p.d_final_state + state_at, r);
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * d.C + c : nullptr;
  Act* dx = p.dx ? static_cast<Act*>(p.dx) + row * p.dx_stride + c : nullptr;
  float* dg = p.dg ? p.dg + row * p.dg_stride + c : nullptr;
#pragma unroll
  for (int i = kChunk - 1; i >= 0; --i) {
    if (i < n) {
      float dh[V] = {};
      if (d_out) load_v<V>(d_out + static_cast<int64_t>(i) * d.C, dh);
      float dgv[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        dh[v] += r[v];
        r[v] = decay[i][v] * dh[v];
        dgv[v] = h_prev[i][v] * r[v];
      }
      if (dx) write_v<V>(dx + i * p.dx_stride, dh, p.accumulate_dx);
      if (dg) write_v<V>(dg + i * p.dg_stride, dgv, p.accumulate_dg);
    }
  }
  if (k == 0 && p.d_initial_state) write_v<V>(p.d_initial_state + state_at, r, p.accumulate_d_initial_state);
}

// ---------------------------------------------------------------------------------------------------------------------
// Host side.

Geometry make_geometry(const GatedScanCudaShape& s, int64_t x_stride, int64_t g_stride) {
  Geometry d;
  static_cast<chunked_scan::Dims&>(d) = chunked_scan::make_dims(s.batch, s.time, s.channels, kChunk, "gated_scan");
  d.x_stride = x_stride ? x_stride : s.channels;
  d.g_stride = g_stride ? g_stride : s.channels;
  HGRN_CHECK(d.x_stride >= d.C && d.g_stride >= d.C, "gated_scan CUDA: a row stride (x ", d.x_stride, ", g ",
             d.g_stride, ") is narrower than C = ", d.C);
  return d;
}

template <typename Act, bool kResets>
void forward_impl(const Geometry& d, const GatedScanCudaForwardArgs& a) {
  const ForwardParams p{d, a.x, a.g, a.initial_state, a.output, a.final_state, a.chunk_states, a.scratch,
                        a.reset_masks};
  const size_t act = sizeof(Act), f32 = sizeof(float);
  const bool pairs = aligned_for(2, d.C, {{a.x, d.x_stride, act},
                                         {a.g, d.g_stride, f32},
                                         {a.output, d.C, act},
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
    CUDA_CHECK_LAUNCH("gated_scan_forward_summary");
    forward_carry_kernel<kResets><<<carry_blocks(d), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_forward_carry");
  }
  if (pairs)
    forward_output_kernel<Act, 2, kResets><<<chunk_grid(d, 2, d.NT), kThreads, 0, stream>>>(p);
  else
    forward_output_kernel<Act, 1, kResets><<<chunk_grid(d, 1, d.NT), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("gated_scan_forward_output");
}

template <typename Act, bool kResets>
void backward_impl(const Geometry& d, const GatedScanCudaBackwardArgs& a) {
  BackwardParams p{d,
                   a.x,
                   a.g,
                   a.initial_state,
                   a.chunk_states,
                   a.d_output,
                   a.d_final_state,
                   a.dx,
                   a.dx_stride ? a.dx_stride : d.C,
                   a.dg,
                   a.dg_stride ? a.dg_stride : d.C,
                   a.d_initial_state,
                   a.accumulate_dx,
                   a.accumulate_dg,
                   a.accumulate_d_initial_state,
                   a.scratch_a,
                   a.scratch_b,
                   a.reset_masks};
  HGRN_CHECK(p.dx_stride >= d.C && p.dg_stride >= d.C, "gated_scan CUDA: a gradient row stride (dx ", p.dx_stride,
             ", dg ", p.dg_stride, ") is narrower than C = ", d.C);
  cudaStream_t stream = cuda_stream();
  if (d.NT > 1) {
    const bool pairs = aligned_for(2, d.C, {{a.g, d.g_stride, sizeof(float)},
                                           {a.d_output, d.C, sizeof(Act)},
                                           {a.scratch_a, d.C, sizeof(float)},
                                           {a.scratch_b, d.C, sizeof(float)}});
    if (pairs)
      backward_summary_kernel<Act, 2, kResets><<<chunk_grid(d, 2, d.NT - 1), kThreads, 0, stream>>>(p);
    else
      backward_summary_kernel<Act, 1, kResets><<<chunk_grid(d, 1, d.NT - 1), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_backward_summary");
    backward_carry_kernel<kResets><<<carry_blocks(d), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_backward_carry");
  }
  // One channel a thread: the chunk's h_{t−1} and e^{g_t} stay in registers (2·64 floats a channel).
  backward_grads_kernel<Act, 1, kResets><<<chunk_grid(d, 1, d.NT), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("gated_scan_backward_grads");
}

}  // namespace

int64_t gated_scan_cuda_chunk_elements(const GatedScanCudaShape& s) {
  return s.batch * ((s.time + kChunk - 1) / kChunk - 1) * s.channels;
}

void gated_scan_cuda_forward(const GatedScanCudaShape& shape, const GatedScanCudaForwardArgs& args) {
  const Geometry d = make_geometry(shape, args.x_stride, args.g_stride);
  HGRN_CHECK(args.x && args.g && args.output, "gated_scan_cuda_forward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch),
             "gated_scan_cuda_forward: the chunk-state and scratch buffers are required when T > ", kChunk);
  HGRN_CUDA_DISPATCH_ACT(args.act, "gated_scan_cuda_forward", [&] {
    if (args.reset_masks)
      forward_impl<act_t, true>(d, args);
    else
      forward_impl<act_t, false>(d, args);
  });
}

void gated_scan_cuda_backward(const GatedScanCudaShape& shape, const GatedScanCudaBackwardArgs& args) {
  const Geometry d = make_geometry(shape, args.x_stride, args.g_stride);
  HGRN_CHECK(args.x && args.g, "gated_scan_cuda_backward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch_a && args.scratch_b),
             "gated_scan_cuda_backward: the chunk-state and scratch buffers are required when T > ", kChunk);
  if (!args.dx && !args.dg && !args.d_initial_state) return;
  HGRN_CUDA_DISPATCH_ACT(args.act, "gated_scan_cuda_backward", [&] {
    if (args.reset_masks)
      backward_impl<act_t, true>(d, args);
    else
      backward_impl<act_t, false>(d, args);
  });
}

}  // namespace hgrn
