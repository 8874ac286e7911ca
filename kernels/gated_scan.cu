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
// Loads are issued kBatch rows at a time ahead of the dependent chain that uses them, so that each thread keeps many
// in flight (the chain itself is a few FMAs a row).
// Determinism: no atomics; every value is computed by one thread in a fixed order, so results are bitwise
// reproducible. All arithmetic is fp32 with expf (the decays compound over the carries).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "gated_scan.h"

namespace hgrn {

namespace {

constexpr int kChunk = static_cast<int>(kGatedScanCudaChunk);
constexpr int kThreads = 128;
constexpr int kBatch = 16;      // rows whose loads a per-chunk kernel issues before using them
constexpr int kCarryBatch = 8;  // the same for the chunks of the carry passes

struct Geometry {
  int B, T, C, NT;
  int64_t x_stride, g_stride;  // row strides of x and g (elements)
  // Offset of chunk k's slot of a [B, NT − 1, C] per-chunk buffer, for batch b and channel c.
  __device__ int64_t slot(int b, int k, int c) const { return (static_cast<int64_t>(b) * (NT - 1) + k) * C + c; }
};

// The thread's first channel (it owns V adjacent ones); false past the last channel.
template <int V>
__device__ __forceinline__ bool thread_channel(const Geometry& d, int& c) {
  c = (blockIdx.x * kThreads + threadIdx.x) * V;
  return c < d.C;
}

template <int V, typename T>
__device__ __forceinline__ void load_v(const T* p, float (&out)[V]) {
  load_pack<V>(p, 0, out);
}
template <int V, typename T>
__device__ __forceinline__ void store_v(T* p, const float (&in)[V]) {
  store_pack<V>(p, 0, in);
}
// p (+)= in: adds to what is there when accumulate, else overwrites.
template <int V, typename T>
__device__ __forceinline__ void write_v(T* p, float (&in)[V], bool accumulate) {
  if (accumulate) {
    float old[V];
    load_v<V>(p, old);
#pragma unroll
    for (int v = 0; v < V; ++v) in[v] += old[v];
  }
  store_v<V>(p, in);
}

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
};

// Chunk k = blockIdx.y (< NT − 1, so whole): the scan from zero and the total log decay.
template <typename Act, int V>
__global__ void __launch_bounds__(kThreads) forward_summary_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y, b = blockIdx.z;
  const int64_t row = static_cast<int64_t>(b) * d.T + static_cast<int64_t>(k) * kChunk;
  const Act* x = static_cast<const Act*>(p.x) + row * d.x_stride + c;
  const float* g = p.g + row * d.g_stride + c;
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
        h[v] = expf(gv[i][v]) * h[v] + xv[i][v];
        total[v] += gv[i][v];
      }
  }
  store_v<V>(p.chunk_states + d.slot(b, k, c), h);
  store_v<V>(p.decays + d.slot(b, k, c), total);
}

// Per (batch, channel), chunks in order: H^(k+1) = e^{S^(k)} H^(k) + h_end^(k), over h_end^(k) in place.
__global__ void __launch_bounds__(kThreads) forward_carry_kernel(const ForwardParams p) {
  const Geometry& d = p.d;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(d.B) * d.C) return;
  const int b = static_cast<int>(idx / d.C), c = static_cast<int>(idx % d.C);
  float h = p.initial_state ? p.initial_state[idx] : 0.f;
  float* states = p.chunk_states + d.slot(b, 0, c);
  const float* decays = p.decays + d.slot(b, 0, c);
  const int n = d.NT - 1;
  for (int k0 = 0; k0 < n; k0 += kCarryBatch) {
    float s[kCarryBatch], e[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (k0 + j < n) {
        s[j] = states[static_cast<int64_t>(k0 + j) * d.C];
        e[j] = decays[static_cast<int64_t>(k0 + j) * d.C];
      }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (k0 + j < n) {
        h = expf(e[j]) * h + s[j];
        states[static_cast<int64_t>(k0 + j) * d.C] = h;
      }
  }
}

// Chunk k = blockIdx.y: the scan from the state entering it, writing o; the last chunk writes the final state.
template <typename Act, int V>
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
        for (int v = 0; v < V; ++v) h[v] = expf(gv[i][v]) * h[v] + xv[i][v];
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
};

// Chunk k = blockIdx.y + 1 (>= 1; only the last may be partial): the reverse scan from zero, u^(k) = e^{g_s} dh_s at
// its first row s, and its total log decay.
template <typename Act, int V>
__global__ void __launch_bounds__(kThreads) backward_summary_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  int c;
  if (!thread_channel<V>(d, c)) return;
  const int k = blockIdx.y + 1, b = blockIdx.z;
  const int t0 = k * kChunk, n = min(kChunk, d.T - t0);
  const int64_t row = static_cast<int64_t>(b) * d.T + t0;
  const float* g = p.g + row * d.g_stride + c;
  const Act* d_out = p.d_output ? static_cast<const Act*>(p.d_output) + row * d.C + c : nullptr;
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
          r[v] = expf(gv[i][v]) * (dov[i][v] + r[v]);
          total[v] += gv[i][v];
        }
  }
  store_v<V>(p.boundary + d.slot(b, k - 1, c), r);
  store_v<V>(p.decays + d.slot(b, k - 1, c), total);
}

// Per (batch, channel), chunks in reverse from β^(NT−1) = the final state's gradient: β^(k−1) = u^(k) + e^{S^(k)} β^(k),
// written over u^(k) (slot k − 1).
__global__ void __launch_bounds__(kThreads) backward_carry_kernel(const BackwardParams p) {
  const Geometry& d = p.d;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(d.B) * d.C) return;
  const int b = static_cast<int>(idx / d.C), c = static_cast<int>(idx % d.C);
  float beta = p.d_final_state ? p.d_final_state[idx] : 0.f;
  float* boundary = p.boundary + d.slot(b, 0, c);
  const float* decays = p.decays + d.slot(b, 0, c);
  for (int j0 = d.NT - 2; j0 >= 0; j0 -= kCarryBatch) {  // slots j0, j0 − 1, ... (chunk k = slot + 1)
    float u[kCarryBatch], e[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (j0 - j >= 0) {
        u[j] = boundary[static_cast<int64_t>(j0 - j) * d.C];
        e[j] = decays[static_cast<int64_t>(j0 - j) * d.C];
      }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (j0 - j >= 0) {
        beta = u[j] + expf(e[j]) * beta;
        boundary[static_cast<int64_t>(j0 - j) * d.C] = beta;
      }
  }
}

// Chunk k = blockIdx.y: h_{t−1} and e^{g_t} over the chunk (in registers: the loops are unrolled), then the reverse
// scan from β^(k) writing dx and dg; chunk 0 ends with the initial state's gradient.
template <typename Act, int V>
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
  float decay[kChunk][V], h_prev[kChunk][V];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (i < n) {
      float xv[V], gv[V];
      load_v<V>(x + i * d.x_stride, xv);
      load_v<V>(g + i * d.g_stride, gv);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        decay[i][v] = expf(gv[v]);
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
  HGRN_CHECK(s.batch > 0 && s.time > 0 && s.channels > 0, "gated_scan CUDA: empty shape");
  const int64_t chunks = (s.time + kChunk - 1) / kChunk;
  HGRN_CHECK(s.batch <= 65535 && chunks <= 65535 && s.channels <= 0x7fffffff / 2,
             "gated_scan CUDA: B ", s.batch, ", T ", s.time, " or C ", s.channels,
             " too large (at most 65535 sequences and 65535 chunks of ", kChunk, ")");
  Geometry d;
  d.B = static_cast<int>(s.batch);
  d.T = static_cast<int>(s.time);
  d.C = static_cast<int>(s.channels);
  d.NT = static_cast<int>(chunks);
  d.x_stride = x_stride ? x_stride : s.channels;
  d.g_stride = g_stride ? g_stride : s.channels;
  HGRN_CHECK(d.x_stride >= d.C && d.g_stride >= d.C, "gated_scan CUDA: a row stride (x ", d.x_stride, ", g ",
             d.g_stride, ") is narrower than C = ", d.C);
  return d;
}

// Whether every (pointer, row stride, element size) allows a thread two adjacent channels as one aligned access.
bool pairs_aligned(int64_t channels, std::initializer_list<std::tuple<const void*, int64_t, size_t>> operands) {
  if (channels % 2 != 0) return false;
  for (const auto& [pointer, stride, element] : operands)
    if (pointer && (reinterpret_cast<uintptr_t>(pointer) % (2 * element) != 0 || stride % 2 != 0)) return false;
  return true;
}

dim3 chunk_grid(const Geometry& d, int vector, int chunks) {
  return dim3(static_cast<unsigned>((d.C + kThreads * vector - 1) / (kThreads * vector)),
              static_cast<unsigned>(chunks), static_cast<unsigned>(d.B));
}
unsigned carry_blocks(const Geometry& d) {
  return static_cast<unsigned>((static_cast<int64_t>(d.B) * d.C + kThreads - 1) / kThreads);
}

template <typename Act>
void forward_impl(const Geometry& d, const GatedScanCudaForwardArgs& a) {
  const ForwardParams p{d, a.x, a.g, a.initial_state, a.output, a.final_state, a.chunk_states, a.scratch};
  const size_t act = sizeof(Act), f32 = sizeof(float);
  const bool pairs = pairs_aligned(d.C, {{a.x, d.x_stride, act},
                                         {a.g, d.g_stride, f32},
                                         {a.output, d.C, act},
                                         {a.initial_state, d.C, f32},
                                         {a.final_state, d.C, f32},
                                         {a.chunk_states, d.C, f32},
                                         {a.scratch, d.C, f32}});
  cudaStream_t stream = cuda_stream();
  if (d.NT > 1) {
    if (pairs)
      forward_summary_kernel<Act, 2><<<chunk_grid(d, 2, d.NT - 1), kThreads, 0, stream>>>(p);
    else
      forward_summary_kernel<Act, 1><<<chunk_grid(d, 1, d.NT - 1), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_forward_summary");
    forward_carry_kernel<<<carry_blocks(d), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_forward_carry");
  }
  if (pairs)
    forward_output_kernel<Act, 2><<<chunk_grid(d, 2, d.NT), kThreads, 0, stream>>>(p);
  else
    forward_output_kernel<Act, 1><<<chunk_grid(d, 1, d.NT), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH("gated_scan_forward_output");
}

template <typename Act>
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
                   a.scratch_b};
  HGRN_CHECK(p.dx_stride >= d.C && p.dg_stride >= d.C, "gated_scan CUDA: a gradient row stride (dx ", p.dx_stride,
             ", dg ", p.dg_stride, ") is narrower than C = ", d.C);
  cudaStream_t stream = cuda_stream();
  if (d.NT > 1) {
    const bool pairs = pairs_aligned(d.C, {{a.g, d.g_stride, sizeof(float)},
                                           {a.d_output, d.C, sizeof(Act)},
                                           {a.scratch_a, d.C, sizeof(float)},
                                           {a.scratch_b, d.C, sizeof(float)}});
    if (pairs)
      backward_summary_kernel<Act, 2><<<chunk_grid(d, 2, d.NT - 1), kThreads, 0, stream>>>(p);
    else
      backward_summary_kernel<Act, 1><<<chunk_grid(d, 1, d.NT - 1), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_backward_summary");
    backward_carry_kernel<<<carry_blocks(d), kThreads, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH("gated_scan_backward_carry");
  }
  // One channel a thread: the chunk's h_{t−1} and e^{g_t} stay in registers (2·64 floats a channel).
  backward_grads_kernel<Act, 1><<<chunk_grid(d, 1, d.NT), kThreads, 0, stream>>>(p);
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
  HGRN_CUDA_DISPATCH_ACT(args.act, "gated_scan_cuda_forward", [&] { forward_impl<act_t>(d, args); });
}

void gated_scan_cuda_backward(const GatedScanCudaShape& shape, const GatedScanCudaBackwardArgs& args) {
  const Geometry d = make_geometry(shape, args.x_stride, args.g_stride);
  HGRN_CHECK(args.x && args.g, "gated_scan_cuda_backward: missing tensor");
  HGRN_CHECK(d.NT == 1 || (args.chunk_states && args.scratch_a && args.scratch_b),
             "gated_scan_cuda_backward: the chunk-state and scratch buffers are required when T > ", kChunk);
  if (!args.dx && !args.dg && !args.d_initial_state) return;
  HGRN_CUDA_DISPATCH_ACT(args.act, "gated_scan_cuda_backward", [&] { backward_impl<act_t>(d, args); });
}

}  // namespace hgrn
