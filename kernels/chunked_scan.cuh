// chunked_scan.cuh: what the chunked elementwise scans (gated_scan.cu, lower_bounded_gated_scan.cu) share: the
// geometry of B sequences × T steps × C channels in chunks, a thread's channels and their vector accesses, the
// sequential carry across chunks each way, and the launch shapes.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <tuple>

#include "core/check.h"
#include "elementwise.cuh"

namespace hgrn::chunked_scan {

constexpr int kThreads = 128;
constexpr int kCarryBatch = 8;  // the chunks whose loads a carry pass issues before using them

struct Dims {
  int B, T, C, NT;
  // Offset of chunk k's slot of a [B, NT − 1, C] per-chunk buffer, for batch b and channel c.
  __device__ int64_t slot(int b, int k, int c) const { return (static_cast<int64_t>(b) * (NT - 1) + k) * C + c; }
  // Chunk k's reset mask of sequence b (kernels/sequence_resets.h; 0 without resets): bit i set where step 64k + i
  // starts from the zero state.
  __device__ uint64_t resets(const uint64_t* masks, int b, int k) const {
    return masks ? masks[static_cast<int64_t>(b) * NT + k] : 0;
  }
};

// Whether row i of a chunk whose reset mask is `resets` restarts from the zero state.
__device__ __forceinline__ bool restarts(uint64_t resets, int i) { return (resets >> i) & 1; }

// The thread's first channel (it owns V adjacent ones); false past the last channel.
template <int V>
__device__ __forceinline__ bool thread_channel(const Dims& d, int& c) {
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

// A chunk's decay as the carries multiply by it: stored as its log (kLogDecay, then e^S) or as the product itself.
template <bool kLogDecay>
__device__ __forceinline__ float chunk_decay(float stored) {
  if constexpr (kLogDecay) return expf(stored);
  return stored;
}

// Per (batch, channel) of this thread, chunks in order: H^(k+1) = P^(k) H^(k) + h_end^(k), written over h_end^(k)
// (chunk_states), from the initial state (null: 0). A chunk holding a reset (reset_masks) passes nothing on: P = 0.
template <bool kLogDecay>
__device__ __forceinline__ void carry_forward(const Dims& d, const float* initial_state, float* chunk_states,
                                              const float* decays, const uint64_t* reset_masks = nullptr) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(d.B) * d.C) return;
  const int b = static_cast<int>(idx / d.C), c = static_cast<int>(idx % d.C);
  float h = initial_state ? initial_state[idx] : 0.f;
  float* states = chunk_states + d.slot(b, 0, c);
  const float* chunk_decays = decays + d.slot(b, 0, c);
  const int n = d.NT - 1;
  for (int k0 = 0; k0 < n; k0 += kCarryBatch) {
    float s[kCarryBatch], e[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (k0 + j < n) {
        s[j] = states[static_cast<int64_t>(k0 + j) * d.C];
        e[j] = chunk_decays[static_cast<int64_t>(k0 + j) * d.C];
      }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (k0 + j < n) {
        h = d.resets(reset_masks, b, k0 + j) ? s[j] : chunk_decay<kLogDecay>(e[j]) * h + s[j];
        states[static_cast<int64_t>(k0 + j) * d.C] = h;
      }
  }
}

// Per (batch, channel) of this thread, chunks in reverse from β^(NT−1) = the final state's gradient (null: 0):
// β^(k−1) = u^(k) + P^(k) β^(k), written over u^(k) (slot k − 1 of boundary); P = 0 for a chunk holding a reset.
template <bool kLogDecay>
__device__ __forceinline__ void carry_backward(const Dims& d, const float* d_final_state, float* boundary_buffer,
                                               const float* decays, const uint64_t* reset_masks = nullptr) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(d.B) * d.C) return;
  const int b = static_cast<int>(idx / d.C), c = static_cast<int>(idx % d.C);
  float beta = d_final_state ? d_final_state[idx] : 0.f;
  float* boundary = boundary_buffer + d.slot(b, 0, c);
  const float* chunk_decays = decays + d.slot(b, 0, c);
  for (int j0 = d.NT - 2; j0 >= 0; j0 -= kCarryBatch) {  // slots j0, j0 − 1, ... (chunk k = slot + 1)
    float u[kCarryBatch], e[kCarryBatch];
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (j0 - j >= 0) {
        u[j] = boundary[static_cast<int64_t>(j0 - j) * d.C];
        e[j] = chunk_decays[static_cast<int64_t>(j0 - j) * d.C];
      }
#pragma unroll
    for (int j = 0; j < kCarryBatch; ++j)
      if (j0 - j >= 0) {
        beta = d.resets(reset_masks, b, j0 - j + 1) ? u[j] : u[j] + chunk_decay<kLogDecay>(e[j]) * beta;
        boundary[static_cast<int64_t>(j0 - j) * d.C] = beta;
      }
  }
}

// ---- host side ----

// The chunk geometry of a [batch, time, channels] call in chunks of `chunk` steps; `op` names it in messages.
inline Dims make_dims(int64_t batch, int64_t time, int64_t channels, int64_t chunk, const char* op) {
  HGRN_CHECK(batch > 0 && time > 0 && channels > 0, op, " CUDA: empty shape");
  const int64_t chunks = (time + chunk - 1) / chunk;
  HGRN_CHECK(batch <= 65535 && chunks <= 65535 && channels <= 0x7fffffff / 2, op, " CUDA: B ", batch, ", T ", time,
             " or C ", channels, " too large (at most 65535 sequences and 65535 chunks of ", chunk, ")");
  return Dims{static_cast<int>(batch), static_cast<int>(time), static_cast<int>(channels), static_cast<int>(chunks)};
}

// Whether every (pointer, row stride, element size) allows a thread V adjacent channels as one aligned access.
inline bool aligned_for(int V, int64_t channels,
                        std::initializer_list<std::tuple<const void*, int64_t, size_t>> operands) {
  if (channels % V != 0) return false;
  for (const auto& [pointer, stride, element] : operands)
    if (pointer && (reinterpret_cast<uintptr_t>(pointer) % (V * element) != 0 || stride % V != 0)) return false;
  return true;
}

inline dim3 chunk_grid(const Dims& d, int vector, int chunks) {
  return dim3(static_cast<unsigned>((d.C + kThreads * vector - 1) / (kThreads * vector)),
              static_cast<unsigned>(chunks), static_cast<unsigned>(d.B));
}
inline unsigned carry_blocks(const Dims& d) {
  return static_cast<unsigned>((static_cast<int64_t>(d.B) * d.C + kThreads - 1) / kThreads);
}

}  // namespace hgrn::chunked_scan
