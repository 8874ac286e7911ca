// gla_recurrence.cu: the chunkwise HGRU2/GLA recurrence on the GPU (spec 7.1–7.3), forward and backward, held to the
// CPU chunk form in src/ops/gla_recurrence.cpp (same stages, same gate-gradient bookkeeping).
//
// Work is split as fla splits it:
//   state_pass   (B·H, K-tiles, V-tiles or pairs of them; sequential over chunks): the states S^(c) entering every
//                chunk, and in reverse the state gradients dS_e^(c). Both are "M ← Diag(e^{G_L}) M + Xᵀ Y" over the
//                chunks.
//   fwd_output   (B·H, chunk): the intra-chunk scores A and o = s·(q ⊙ e^G) S^(c) + A v.
//   bwd_dv       (B·H, chunk): dv = Aᵀ dO + (k ⊙ e^{G_L − G}) dS_e, and dA = s·dO vᵀ.
//   bwd_dqk      (B·H, chunk, K-tile): intra and inter dq, dk, and dg; or, where q, g and k are a layer's HGRN2
//                gates (GlaGatesEpilogue), the gates' backward on them in its epilogue: q̂'s, f̂'s and γ's gradients
//                written instead, dq, dk and dg never stored.
// On Hopper each kernel launches as a programmatic dependent of the one before it, so that fwd_output and bwd_dv do
// their first phase while the state pass before them finishes (the rule they keep: dependent_launch.cuh).
// Products, bf16 activations: every chunk-sized product is a 64×64×64 block product (tile_mma) on the tensor cores
// (mma.sync, bf16 in, fp32 accumulate) with operands in shared memory and the accumulator in registers (WarpTile):
// the state pass keeps its running tile there across the chunks, and sums over K- or V-tiles stay there too. The
// intra-chunk products that need more than bf16 inputs (the score blocks below the diagonal, and the intra dq, dk
// from dA) run on the tensor cores in TF32 (mma.sync m16n8k8, fragments built straight from the fp32 tiles): they
// only enter results rounded to bf16, below which TF32's 2^-11 input rounding stays. The diagonal 16×16 blocks are
// element-wise fp32, one exp2 per pair and feature, except for the pairs across their two 8-row halves (j < 8 <= i),
// whose decay is factored at the second half's first row: in the forward (bf16) a TF32 product like the blocks below,
// in bwd_dqk (both dtypes) per-row factors, 16 exp2 per feature instead of 64. fp32 activations: every product in
// plain fp32 FMAs (TF32 would miss the fp32 tolerance).
// K and V are processed in tiles of 64 (zero-padded); rows past the end of a partial chunk are zero with g = 0, so
// the cumulative gate is flat there and row 63 holds G_L.
//
// Numerics (spec 10.1): the gate cumsum restarts every chunk and is fp32, in base 2 (G·log2 e, decays by the hardware
// exp2, as fla does); every exponent is a difference <= 0 (reference rows: the first row of a query sub-chunk or of a
// diagonal block's second half, the last row of a key sub-chunk, or the chunk's last row); the element-wise pairs only
// ever have j <= i, so no e^{positive} (and no 0·inf) exists.
// Determinism: no atomics; every sum has a fixed order, so results are bitwise reproducible.
//
// Scalar decays (kScalar: g [B·T, H], one per head and step, or [H], one per head; GlaDecay): the same kernels, with
// G one column per chunk instead of a [64][K] tile (read straight from g: no per-channel copy). The decay leaves the
// channel sums: the scores are one q kᵀ product per chunk times e^{G_i − G_j} per pair (no reference rows or
// element-wise diagonal blocks), bwd_dqk's intra dq, dk are W k and Wᵀ q with W = dA ⊙ e^{G_i − G_j}, and the state
// pass and bwd_dv scale by one factor a row (a chunk). dg is the per-channel dg summed over the channels: per row and
// K-tile in bwd_dqk, then over the K-tiles; an [H] g takes none. The per-channel builds compile as before.
//
// Resets (reset_masks, one 64-bit mask per chunk): as the CPU chunk form, each reset is a segment boundary inside its
// chunk with the same cumulative gates, so no exponent changes and nothing can overflow: the scores A (and dA) of
// pairs across a reset are set to 0, the state entering a chunk reaches only the rows before its first reset (Q̄'s and
// the reverse pass's rows after it are 0) and the chunk's exit only where the chunk has none (the pass's decay of M is
// 0 then), only the keys from its last reset on reach the state leaving it (X's rows before it are 0, and so is
// dk_inter), and dg's reverse cumulative sum restarts at every reset, whose own dg is 0. Every kernel is built twice
// (kResets): without resets it compiles to the code it was without them, instructions and bits alike.
//
// Memory: the forward's per-chunk states [B·H, NT, K, V] are stored in the activation dtype (bf16 as in fla's
// forward: fwd_output only uses them rounded to it, so this is exact, and they reach its shared memory by cp.async);
// the backward reads them the same way: kept from the forward where the caller keeps them, else recomputed by the
// forward's own pass (the same bits). Deviation from fla, whose backward recomputes them in fp32: besides the
// products (dq's dO·S_pᵀ, which round S_p to bf16 in fla too), S_p enters one more term, dg's rowsum(S_p ⊙ dS_e), and
// there it is the bf16 value times the fp32 dS_e (summed in fp32). That halves the recomputed states' bytes (written
// by the pass, read by bwd_dqk) and lets a caller keep the forward's states instead of recomputing them.
// The state gradients dS_e [B·H, NT, K, V] are fp32 where a gradient of g is formed (as fla's, whose dg also takes
// them in fp32); else (a per-head g: RetNet) every read rounds them to the activation dtype, so the reverse pass stores
// them rounded (the same dq, dk, dv bits from half the bytes; gla_cuda_state_gradients_dtype).
// The backward's scratch: the recomputed states (unless kept), the state gradients and dA (B·H·NT·64·64 fp32); the
// forward keeps A (B·H·NT·64·64, in the activation dtype: exact, see GlaCudaForwardArgs::scores) for the backward.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cp_async.cuh"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "chunk_sums.cuh"
#include "elementwise.cuh"
#include "hgrn2_gate_math.cuh"
#include "gla_recurrence.h"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

constexpr int kChunk = 64;  // BT
constexpr int kSub = 16;    // BC: sub-chunk (diagonal block) size
constexpr int kTile = 64;   // K and V tile width
constexpr int kThreads = 256;
constexpr int kMaxKey = 256;
constexpr int kLdF = kTile + 1;  // fp32 tiles read by SIMT code: the odd stride makes column walks conflict-free

// Shared-tile strides. bf16 operand tiles are read by ldmatrix, whose rows must start on 16 bytes (strides in
// multiples of 8 elements); the padding breaks up bank conflicts.
template <typename In> struct TileLd;
template <> struct TileLd<float> {
  static constexpr int in = kTile + 4;   // operand tiles (rows of whole 16-byte units, for cp.async)
  static constexpr int acc = kTile + 1;  // fp32 product tiles
  static constexpr int pad = 1;          // extra columns of full-K operand buffers
};
template <> struct TileLd<__nv_bfloat16> {
  static constexpr int in = kTile + 8;
  static constexpr int acc = kTile + 4;
  static constexpr int pad = 8;
};

// Carves a dynamic shared-memory block into 128-byte-aligned arrays. With a null base it only measures (the host uses
// it to size the launch with the very code the kernel uses to lay out its memory).
struct Carver {
  char* base;
  size_t off = 0;
  __host__ __device__ explicit Carver(void* b) : base(static_cast<char*>(b)) {}
  template <typename T>
  __host__ __device__ T* take(size_t count) {
    off = (off + 127) & ~static_cast<size_t>(127);
    T* p = base ? reinterpret_cast<T*>(base + off) : nullptr;
    off += count * sizeof(T);
    return p;
  }
};

struct Dims {
  int T, H, K, V, NT;  // NT = number of chunks
  int nk, nv;          // K-tiles, V-tiles
  int key_pad;         // nk·64
  // Row strides of q, k and v (GlaCudaRowStrides, resolved: H·K or H·V when contiguous); g, the output and its
  // gradient are contiguous. The gradients' strides come with their pointers, in the kernels' parameters.
  int q_stride, k_stride, v_stride;
};

// What a per-chunk block (fwd_output, bwd_dv, bwd_dqk) works on: chunk c (rows t0 .. t0+n) of head h of batch b
// (pair = b·H + h), and the row strides of the contiguous [B, T, H·K] and [B, T, H·V] tensors.
struct ChunkBlock {
  int c, pair, b, h, t0, n;
  int64_t key_stride, value_stride;
};
__device__ ChunkBlock chunk_block(const Dims& d, int c, int pair) {
  const int t0 = c * kChunk;
  return {c, pair, pair / d.H, pair % d.H, t0, min(kChunk, d.T - t0), static_cast<int64_t>(d.H) * d.K,
          static_cast<int64_t>(d.H) * d.V};
}

// Offset of row t of head h of batch b in a [B, T, H·width] tensor.
__device__ __forceinline__ int64_t row_offset(const Dims& d, int b, int t, int h, int width) {
  return ((static_cast<int64_t>(b) * d.T + t) * d.H + h) * width;
}
// The same in a row-strided one (rows `stride` elements apart: q, k, v and their gradients).
__device__ __forceinline__ int64_t strided_row_offset(const Dims& d, int b, int t, int h, int width, int stride) {
  return static_cast<int64_t>(b * d.T + t) * stride + h * width;
}

// A chunk's resets: bit i set where row i starts from the zero state (kernels/sequence_resets.h); 0 without resets.
__device__ __forceinline__ uint64_t chunk_resets(const uint64_t* masks, const Dims& d, int b, int c) {
  return masks ? masks[static_cast<int64_t>(b) * d.NT + c] : 0;
}
// The first reset row (kChunk without one): the rows before it see the state entering the chunk.
__device__ __forceinline__ int first_reset(uint64_t resets) {
  return resets ? __ffsll(static_cast<long long>(resets)) - 1 : kChunk;
}
// The last reset row (0 without one): the keys from it on reach the state leaving the chunk.
__device__ __forceinline__ int first_exiting(uint64_t resets) {
  return resets ? 63 - __clzll(static_cast<long long>(resets)) : 0;
}
// The last reset row <= i (0 without one): the keys j >= it reach query row i. (2 << 63 wraps to 0: all 64 bits.)
__device__ __forceinline__ int segment_start(uint64_t resets, int i) {
  const uint64_t upto = resets & ((uint64_t{2} << i) - 1);
  return upto ? 63 - __clzll(static_cast<long long>(upto)) : 0;
}

// Programmatic dependent launch (dependent_launch.cuh). Every kernel here launches as a programmatic dependent of the
// kernel before it on the stream and keeps that header's rule. hgrn's other kernels allow their dependents only after
// they have waited themselves, or never, and cuBLASLt's may allow at any point, so the kernels that follow them, the
// state passes, wait first thing:
//   state pass: waits first thing, then allows: so a dependent starting early sees everything before the pass done.
//   fwd_output, bwd_dv: allow first thing and do the work that needs nothing from the state pass before them (the
//     scores; the staging and decayed keys), then wait: their blocks take SMs as the pass frees them (or idle ones),
//     so the launch gap and the pass's tail overlap that work. What they read before the wait was written before the
//     pass started; they write nothing the pass reads.
//   bwd_dqk: waits first thing (a dependent of bwd_dv, which may itself still wait for the reverse pass).
// A kernel that allows before it waits lets its dependent start, but that one waits for it, and it for its own
// predecessor, so the order holds along the chain.

// ---------------------------------------------------------------------------------------------------------------------
// Tile movement. Every helper is called by all threads of the block.

// One thread's share of a 64×64 tile in registers: column threadIdx.x % 64, rows threadIdx.x / 64 + 4i (i < 16), so
// a warp touches 32 consecutive columns of one row. Global loads go through registers in two phases (fetch, then
// commit to shared memory): a loop that stored each loaded value straight away would wait out one memory latency per
// element, since the compiler cannot move a load past a store that might alias it. (Loads into registers do not
// overlap a __syncthreads: the barrier waits for them. Staging ahead across barriers uses cp.async, below.)
struct TileRegs {
  float x[16];
  __device__ static int col() { return threadIdx.x & 63; }
  __device__ static int row(int i) { return (threadIdx.x >> 6) + 4 * i; }
  // x = src[r·stride + c] for r < rows, c < cols, and 0 elsewhere (padding of partial chunks and tiles); all zero when
  // src is null (an absent gradient).
  template <typename Src>
  __device__ void fetch(const Src* src, int64_t stride, int rows, int cols) {
    const int c = col();
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int r = row(i);
      x[i] = (src && r < rows && c < cols) ? load_f(src[r * stride + c]) : 0.f;
    }
  }
  // dst[r·ld + c] = x.
  template <typename Dst>
  __device__ void commit(Dst* dst, int ld) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[row(i) * ld + col()] = store_f<Dst>(x[i]);
  }
};

// One thread's share of a 64×64 fp32 tile read as 16-byte vectors: columns 4·(t % 16) .. +3 of rows t / 16 + 16i
// (i < 4), so a warp reads two whole 256-byte rows per load. For the fp32 tiles that only move (states, state
// gradients, dA): a quarter of TileRegs' load instructions, which dominate the per-chunk kernels' instruction counts.
// Element by element, in the same layout, where the source is not 16-byte aligned or the tile's columns end early.
struct TileVec {
  float x[4][4];  // [i][u]: row row(i), column col() + u
  __device__ static int col() { return 4 * (threadIdx.x & 15); }
  __device__ static int row(int i) { return (threadIdx.x >> 4) + 16 * i; }
  __device__ void fetch(const float* src, int64_t stride, int rows, int cols) {
    const int c = col();
    const bool vector = src && stride % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && c + 4 <= cols;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row(i);
      if (vector) {
        const float4 v = r < rows ? *reinterpret_cast<const float4*>(src + r * stride + c) : make_float4(0, 0, 0, 0);
        x[i][0] = v.x;
        x[i][1] = v.y;
        x[i][2] = v.z;
        x[i][3] = v.w;
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) x[i][u] = src && r < rows && c + u < cols ? src[r * stride + c + u] : 0.f;
      }
    }
  }
  // dst[r·ld + c] = x, as column pairs where ld is even.
  template <typename Dst>
  __device__ void commit(Dst* dst, int ld) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      Dst* at = dst + row(i) * ld + col();
      if (ld % 2 == 0) {
        store_pack<2>(at, 0, {x[i][0], x[i][1]});
        store_pack<2>(at + 2, 0, {x[i][2], x[i][3]});
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) at[u] = store_f<Dst>(x[i][u]);
      }
    }
  }
};

// dst = src[:rows, :cols] zero-padded to 64×64, through registers (fp32 sources as 16-byte vectors).
template <typename Dst, typename Src>
__device__ void load_tile(Dst* dst, int ld, const Src* src, int64_t stride, int rows, int cols) {
  std::conditional_t<std::is_same_v<Src, float>, TileVec, TileRegs> t;
  t.fetch(src, stride, rows, cols);
  t.commit(dst, ld);
}

// dst[r·stride + c] (+)= src[r][c] for r < rows, c < cols, in TileVec's layout (a warp: two rows of 64 columns), stored
// by one 4-element access per group where dst's rows are aligned to 4 elements, element by element at a ragged right
// edge or otherwise. All old values are loaded before anything is stored (see TileRegs).
template <typename Dst>
__device__ void store_tile(Dst* dst, int64_t stride, const float* src, int ld, int rows, int cols, bool accumulate) {
  const bool vec = reinterpret_cast<uintptr_t>(dst) % (4 * sizeof(Dst)) == 0 && stride % 4 == 0;
  const int c = TileVec::col();
  float x[4][4] = {};
  if (accumulate)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (TileVec::row(i) < rows && c + e < cols) x[i][e] = load_f(dst[TileVec::row(i) * stride + c + e]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = TileVec::row(i);
    if (r >= rows) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) x[i][e] += src[r * ld + c + e];
    if (vec && c + 4 <= cols) {
      store_pack<4>(dst + r * stride + c, 0, x[i]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (c + e < cols) dst[r * stride + c + e] = store_f<Dst>(x[i][e]);
    }
  }
}

template <typename T>
__device__ void zero_tile(T* dst, int ld) {
  for (int idx = threadIdx.x; idx < kTile * kTile; idx += kThreads) dst[(idx >> 6) * ld + (idx & 63)] = store_f<T>(0.f);
}

// Asynchronous global → shared tile copies (cp.async, 16 bytes per copy), for the tiles a kernel stages ahead of use.
// Unlike loads into registers, they are not waited for at every __syncthreads, so they overlap with the work between
// barriers. A tile is [rows][cols] of a row-major source, zero-filled to 64×64 (cp.async's source size does the
// padding). Usable when every row start is 16-byte aligned: aligned base, and width and row strides in whole 16 bytes.
constexpr int kLdS = kTile + 4;  // fp32 staging tiles: 16-byte rows

template <typename T>
__device__ bool async_copyable(const void* base, int64_t width, int64_t stride, int ld) {
  constexpr int kVec = 16 / sizeof(T);
  return base && reinterpret_cast<uintptr_t>(base) % 16 == 0 && width % kVec == 0 && stride % kVec == 0 &&
         ld % kVec == 0;
}

// The rare fallback of stage_tile, kept out of line so that its per-element addresses are not hoisted into (and do
// not take registers from) the caller's main loop.
template <typename T>
__device__ __noinline__ void load_tile_uninlined(T* dst, int ld, const T* src, int64_t stride, int rows, int cols) {
  load_tile(dst, ld, src, stride, rows, cols);
}

// Stages a tile into dst: by cp.async when `async` (the caller commits and waits), else by plain loads; zeros when
// src is null.
template <typename T>
__device__ void stage_tile(T* dst, int ld, const T* src, int64_t stride, int rows, int cols, bool async) {
  if (!src || !async) {
    load_tile_uninlined(dst, ld, src, stride, rows, cols);
    return;
  }
  // Thread t copies the 16 bytes at column c of rows r0 + i·kRowStep: its column, and so the bytes it may read, are
  // the same for every row, and its addresses advance by constant steps (the address arithmetic of a per-copy
  // index was a third of the state pass's instructions).
  constexpr int kVec = 16 / sizeof(T), kPerRow = kTile / kVec, kRowStep = kThreads / kPerRow;
  static_assert(kThreads % kPerRow == 0 && kChunk % kRowStep == 0, "whole rows per pass");
  const int r0 = threadIdx.x / kPerRow, c = (threadIdx.x % kPerRow) * kVec;
  const unsigned to = shared_address(dst + r0 * ld + c);
  const T* from = src + r0 * stride + c;
  if (rows >= kChunk && cols >= kTile) {
    // A whole tile (every tile but a final partial chunk's or a ragged K or V edge's): plain 16-byte copies, no source
    // sizes to select. The general form below cost ~35 instructions a copy (nvcc emulates the source size by
    // offsetting the address), which made staging a third of the state pass's instructions.
#pragma unroll
    for (int i = 0; i < kChunk / kRowStep; ++i)
      cp_async_16(to + i * kRowStep * ld * unsigned{sizeof(T)}, from + i * kRowStep * stride);
    return;
  }
  const int column_bytes = max(0, min(kVec, cols - c)) * static_cast<int>(sizeof(T));
#pragma unroll
  for (int i = 0; i < kChunk / kRowStep; ++i) {
    const int bytes = r0 + i * kRowStep < rows ? column_bytes : 0;
    // Zero bytes (padding rows and columns): nothing is read, but the address stays a valid one.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to + i * kRowStep * ld * unsigned{sizeof(T)}),
                 "l"(bytes > 0 ? from + i * kRowStep * stride : src), "r"(bytes));
  }
}

// 2^x by the hardware's approximate exp2 (relative error ~2^-22, subnormal results flushed to 0): every decay is
// computed as 2^{(G_i − G_j)·log2 e} from the base-2 cumulative gate, as fla does, one instruction instead of expf's
// dozen in the element-wise loops.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

// Chunk-local cumulative sum of g·log2(e) (the base-2 G of spec 7.1) down the 64 rows of an fp32 [64][ld] tile, in
// place, or with g read from another tile `src` ([64][src_ld]): four 16-row segments are scanned in parallel, then
// offset by the totals of the segments before them. The result is still non-increasing in the row (rounding is
// monotone and each segment's last row equals the next segment's offset), so every G_i − G_j with i >= j stays <= 0.
// `seg` is [4][64] shared scratch.
__device__ void chunk_cumsum(float* G, int ld, float* seg, const float* src = nullptr, int src_ld = 0) {
  const int c = threadIdx.x & 63, s = threadIdx.x >> 6;
  const float* g = src ? src : G;
  const int g_ld = src ? src_ld : ld;
  // Constant trip counts: written as r from 16s to 16s + 16, nvcc 13.0 compiled the first loop in bwd_dqk's fp32
  // build as those 16 rows followed by a 21-row remainder that ran into the next segment (found by racecheck).
  float run = 0.f;
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    const int r = s * kSub + i;
    run += g[r * g_ld + c] * kLog2e;
    G[r * ld + c] = run;
  }
  seg[s * 64 + c] = run;
  __syncthreads();
  if (s > 0) {
    float prefix = 0.f;
    for (int s2 = 0; s2 < s; ++s2) prefix += seg[s2 * 64 + c];
#pragma unroll
    for (int i = 0; i < kSub; ++i) G[(s * kSub + i) * ld + c] += prefix;
  }
  __syncthreads();
}

// Scalar decays (kScalar): one log decay per row, shared by the head's key channels, so the chunk's gates are one
// column G[64] instead of a [64][K] tile. stage_scalar_gates issues the cp.async copies (4 bytes each; the caller
// commits) of chunk rows t0 .. t0+n of head h of batch b into dst, 0 past the chunk's end (g = 0: G stays flat).
// decay_stride: g's row stride, H for [B·T, H] (per head and step), 0 for [H] (per head). (It sits in the kernels'
// parameter structs, in padding, not in Dims: a larger Dims moved the per-channel builds' register allocation.)
__device__ void stage_scalar_gates(float* dst, const float* g, int decay_stride, const Dims& d, int b, int t0, int n,
                                   int h) {
  if (threadIdx.x >= kChunk) return;
  const int t = threadIdx.x;
  const float* src = g + static_cast<int64_t>(b * d.T + t0 + min(t, n - 1)) * decay_stride + h;  // a valid address
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst + t)), "l"(src),
               "r"(t < n ? 4 : 0));
}
// G = the chunk-local cumsum of g·log2(e) over the 64 rows of a staged column, in place: chunk_cumsum's arithmetic
// (four 16-row runs, then the earlier runs' totals in order), so G is non-increasing as there. Called by all threads
// (barriers); ends with one. seg: [4] scratch.
__device__ void scalar_cumsum(float* G, float* seg) {
  __syncthreads();  // the column is complete
  if (threadIdx.x < kChunk / kSub) {
    const int s = threadIdx.x;
    float run = 0.f;
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      run += G[s * kSub + i] * kLog2e;
      G[s * kSub + i] = run;
    }
    seg[s] = run;
  }
  __syncthreads();
  if (threadIdx.x >= kSub && threadIdx.x < kChunk) {
    const int s = threadIdx.x / kSub;
    float prefix = 0.f;
    for (int s2 = 0; s2 < s; ++s2) prefix += seg[s2];
    G[threadIdx.x] += prefix;
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------------------------------
// Chunk-sized products: C[64][64] += op(A) · op(B) over a depth of 64, operands in shared memory, the accumulator C in
// registers (WarpTile), so that a tile accumulated over several products, or carried across chunks (the state pass's
// running state), never makes a shared-memory round trip. A is [64 rows][64 depth] row-major, or with A_COL stored
// depth-major as [64 depth][64 rows]; B is [64 depth][64 cols] row-major, or with B_COL stored as [64 cols][64 depth].

// One round of a 4×4 transpose of 32-bit words across the lanes of a quad (lane t of the quad holding row t,
// w[j] = M[t][j]): with kMask = 2, lanes t and t ^ 2 swap their off-diagonal 2×2 blocks; then with kMask = 1, lanes
// t and t ^ 1 transpose within the 2×2 blocks. After both, w[s] = M[s][t]. `low`: bit kMask of t is clear.
template <int kMask>
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], bool low) {
  // The two entries a lane gives away: kMask = 2: j = 2, 3 (low) or 0, 1; kMask = 1: j = 1, 3 (low) or 0, 2.
  constexpr int a0 = kMask == 2 ? 2 : 1, a1 = 3, b0 = 0, b1 = kMask == 2 ? 1 : 2;
  const uint32_t y0 = __shfl_xor_sync(0xffffffffu, low ? w[a0] : w[b0], kMask);
  const uint32_t y1 = __shfl_xor_sync(0xffffffffu, low ? w[a1] : w[b1], kMask);
  if (low) {
    w[a0] = y0;
    w[a1] = y1;
  } else {
    w[b0] = y0;
    w[b1] = y1;
  }
}

// A 64×64 fp32 tile in registers: warp w owns rows 16·(w/2) .. +16 and columns 32·(w%2) .. +32, as four 16×8
// tensor-core accumulators (PTX m16n8 C layout: lane 4g + t holds rows g and g + 8, columns 2t and 2t + 1 of each).
struct WarpTile {
  float c[4][4];  // [n-tile j][element e]: row row(e), column col(j, e)
  __device__ static int row(int e) {
    return 16 * (threadIdx.x >> 6) + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1);
  }
  __device__ static int col(int j, int e) {
    return 32 * ((threadIdx.x >> 5) & 1) + 8 * j + 2 * (threadIdx.x & 3) + (e & 1);
  }
  __device__ void zero() {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[j][e] = 0.f;
  }
  // C = src[r·stride + c] for r < rows, c < cols, else 0 (all 0 for a null src).
  __device__ void load(const float* src, int64_t stride, int rows, int cols) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row(e), cc = col(j, e);
        c[j][e] = src && r < rows && cc < cols ? src[r * stride + cc] : 0.f;
      }
  }
  // dst[r·stride + c] (+)= C for r < rows, c < cols (global memory; the old values are all read before any store).
  // A lane's elements come in column pairs (2t, 2t + 1): one two-element access where the pair is whole and aligned.
  // A whole bf16 tile overwritten with 16-byte aligned rows goes out as 16-byte vectors instead (store_rows).
  template <typename Dst>
  __device__ void store(Dst* dst, int64_t stride, int rows, int cols, bool accumulate) const {
    const bool whole = !accumulate && rows >= kTile && cols >= kTile;
    if constexpr (std::is_same_v<Dst, __nv_bfloat16>) {
      if (whole && stride % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
        store_rows(dst, stride);
        return;
      }
    }
    const bool paired = stride % 2 == 0 && reinterpret_cast<uintptr_t>(dst) % (2 * sizeof(Dst)) == 0;
    if (paired && whole) {  // a whole tile written: no tests, no old values
      Dst* at = dst + row(0) * stride + col(0, 0);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) store_pack<2>(at + (e >> 1) * 8 * stride + 8 * j, 0, {c[j][e], c[j][e + 1]});
      return;
    }
    float old[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = row(e), cc = col(j, e);
        const Dst* at = dst + r * stride + cc;
        old[j][e] = old[j][e + 1] = 0.f;
        if (!accumulate || r >= rows) continue;
        if (paired && cc + 1 < cols) {
          float o[2];
          load_pack<2>(at, 0, o);
          old[j][e] = o[0];
          old[j][e + 1] = o[1];
        } else {
          if (cc < cols) old[j][e] = load_f(at[0]);
          if (cc + 1 < cols) old[j][e + 1] = load_f(at[1]);
        }
      }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = row(e), cc = col(j, e);
        Dst* at = dst + r * stride + cc;
        if (r >= rows) continue;
        if (paired && cc + 1 < cols) {
          store_pack<2>(at, 0, {c[j][e] + old[j][e], c[j][e + 1] + old[j][e + 1]});
        } else {
          if (cc < cols) at[0] = store_f<Dst>(c[j][e] + old[j][e]);
          if (cc + 1 < cols) at[1] = store_f<Dst>(c[j][e + 1] + old[j][e + 1]);
        }
      }
  }
  // dst[r·stride + c] = C (bf16) for the whole tile, rows 16-byte aligned. Lane 4g + t holds, per row half and n-tile
  // j, columns 8j + 2t, 8j + 2t + 1; a 4×4 transpose within each lane quad (two rounds of shuffles) gives it columns
  // 8t .. 8t + 7 instead, so each row half leaves as one 16-byte vector and a warp's store covers 64 contiguous bytes
  // of each of 8 rows. Element-pair stores wrote 16 bytes of a row per store instruction, half of every 32-byte
  // sector, and with the waits behind them were ~20% of the forward state pass's stall samples (ncu, H200); the pass
  // at B=16 H=8 K=V=128 went from 0.501 to 0.479 ms forward. (fp32 pairs already fill whole sectors: with the same
  // transpose the backward's fp32 passes were slower.)
  __device__ void store_rows(__nv_bfloat16* dst, int64_t stride) const {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t w[4];  // [n-tile j]: the column pair of row half h as bf16x2 (rounded as store_f rounds)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(c[j][2 * h], c[j][2 * h + 1]);  // .x: the lower address
        w[j] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      quad_transpose<2>(w, (t & 2) == 0);
      quad_transpose<1>(w, (t & 1) == 0);
      // w[s] now holds lane s's pair of n-tile t: columns 8t + 2s, 8t + 2s + 1, so w is columns 8t .. 8t + 7.
      *reinterpret_cast<uint4*>(dst + row(2 * h) * stride + 32 * ((threadIdx.x >> 5) & 1) + 8 * t) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  // C = src[r·ld + c] (a shared tile).
  __device__ void load_shared(const float* src, int ld) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[j][e] = src[row(e) * ld + col(j, e)];
  }
  // dst[r·ld + c] = C (a shared tile).
  __device__ void store_shared(float* dst, int ld) const {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[row(e) * ld + col(j, e)] = c[j][e];
  }
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const unsigned addr = shared_address(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  const unsigned addr = shared_address(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16: tensor cores (mma m16n8k16, fp32 accumulate), fragments by ldmatrix: lane 8i + r addresses row r of 8×8
// stored matrix i. The A fragment's four matrices are (rows, depth) = (+0, +0), (+8, +0), (+0, +8), (+8, +8) of the
// warp's 16 rows: ldmatrix for a row-major A, ldmatrix.trans for a depth-major one. Each pair of n-tiles takes four
// B matrices (n-tile, depth) = (+0, +0), (+0, +8), (+8, +0), (+8, +8): ldmatrix.trans for a depth-major B, ldmatrix
// for a column-stored one. Row strides must be multiples of 8 elements (16-byte rows).
template <bool A_COL, bool B_COL>
__device__ void tile_mma(WarpTile& C, const __nv_bfloat16* A, int lda, const __nv_bfloat16* B, int ldb) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, mi = lane >> 3, r = lane & 7;
  const int m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
#pragma unroll
  for (int d = 0; d < kTile; d += 16) {
    uint32_t a[4];
    if constexpr (A_COL)
      ldmatrix_x4_trans(a, A + (d + 8 * (mi >> 1) + r) * lda + m0 + 8 * (mi & 1));
    else
      ldmatrix_x4(a, A + (m0 + 8 * (mi & 1) + r) * lda + d + 8 * (mi >> 1));
#pragma unroll
    for (int jp = 0; jp < 2; ++jp) {
      const int n = n0 + 16 * jp;
      uint32_t b[4];
      if constexpr (B_COL)
        ldmatrix_x4(b, B + (n + 8 * (mi >> 1) + r) * ldb + d + 8 * (mi & 1));
      else
        ldmatrix_x4_trans(b, B + (d + 8 * (mi & 1) + r) * ldb + n + 8 * (mi >> 1));
      mma_bf16(C.c[2 * jp], a, b[0], b[1]);
      mma_bf16(C.c[2 * jp + 1], a, b[2], b[3]);
    }
  }
}
// fp32: plain FMAs on the same register layout (TF32 would miss the fp32 tolerance).
template <bool A_COL, bool B_COL>
__device__ void tile_mma(WarpTile& C, const float* A, int lda, const float* B, int ldb) {
  const int r0 = WarpTile::row(0), r1 = WarpTile::row(2);
  for (int d = 0; d < kTile; ++d) {
    const float a0 = A_COL ? A[d * lda + r0] : A[r0 * lda + d];
    const float a1 = A_COL ? A[d * lda + r1] : A[r1 * lda + d];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c0 = WarpTile::col(j, 0), c1 = WarpTile::col(j, 1);
      const float b0 = B_COL ? B[c0 * ldb + d] : B[d * ldb + c0];
      const float b1 = B_COL ? B[c1 * ldb + d] : B[d * ldb + c1];
      C.c[j][0] = fmaf(a0, b0, C.c[j][0]);
      C.c[j][1] = fmaf(a0, b1, C.c[j][1]);
      C.c[j][2] = fmaf(a1, b0, C.c[j][2]);
      C.c[j][3] = fmaf(a1, b1, C.c[j][3]);
    }
  }
}

// O[64][64] += Σ_kt X[:, kt·64 : kt·64+64] · state[kt-tile rows][v0 .. v0+64) for one chunk's [K][V] state (or
// state gradient); X is a full-K operand buffer [64][ldx]. The next K-tile is fetched while the current one is
// multiplied. fp32 states (State = float) pass through registers into Y, one shared operand tile, rounded to In;
// states already in the operand dtype (bf16: the forward's) go straight to shared memory by cp.async, into Y and the
// tile after it (two buffers). Starts and ends with a barrier.
template <typename In, typename State>
__device__ void accumulate_state_product(WarpTile& O, const In* X, int ldx, const State* state, const Dims& d, int v0,
                                         In* Y) {
  const int vcols = min(kTile, d.V - v0);
  constexpr int ldi = TileLd<In>::in;
  if constexpr (!std::is_same_v<State, float>) {
    static_assert(std::is_same_v<State, In>, "states are fp32 or in the operand dtype");
    const bool async = async_copyable<In>(state, d.V, d.V, ldi);
    auto stage = [&](int kt) {
      const int k0 = kt * kTile;
      stage_tile(Y + (kt & 1) * kChunk * ldi, ldi, state + static_cast<int64_t>(k0) * d.V + v0, d.V,
                 min(kTile, d.K - k0), vcols, async);
      cp_async_commit();
    };
    __syncthreads();  // both buffers free
    stage(0);
    for (int kt = 0; kt < d.nk; ++kt) {
      if (kt + 1 < d.nk) {
        stage(kt + 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // tile kt has landed
      tile_mma<false, false>(O, X + kt * kTile, ldx, Y + (kt & 1) * kChunk * ldi, ldi);
      __syncthreads();  // its buffer is free for tile kt + 2
    }
  } else {
    TileVec next;
    auto fetch = [&](int kt) {
      const int k0 = kt * kTile;
      next.fetch(state + static_cast<int64_t>(k0) * d.V + v0, d.V, min(kTile, d.K - k0), vcols);
    };
    fetch(0);
    for (int kt = 0; kt < d.nk; ++kt) {
      __syncthreads();
      next.commit(Y, ldi);
      __syncthreads();
      if (kt + 1 < d.nk) fetch(kt + 1);
      tile_mma<false, false>(O, X + kt * kTile, ldx, Y, ldi);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// State pass (spec 7.2 step 1 forward, 7.3 step 2 in reverse). One block per (K-tile, kVTiles V-tiles, pair),
// sequential over chunks; M is the block's fp32 [64][64] tile (or tiles) of the running matrix:
//   forward: M = S, stored[c] = S^(c) before chunk c, M ← Diag(e^{G_L}) M + (x ⊙ e^{G_L − G})ᵀ y with x = k, y = v;
//   reverse: M = dS, stored[c] = dS_e^(c) before chunk c, M ← Diag(e^{G_L}) M + (s·x ⊙ e^{G})ᵀ y with x = q, y = dO.
// At the end the forward writes the final state, the reverse adds dS0 into the initial state's gradient. With resets,
// a chunk holding one decays M to 0, and X keeps the rows that exit it (forward) or that it enters (reverse).
// Scalar decays (kScalar): G is one column, so x's rows scale by one factor each and M by one e^{G_L} per chunk.
struct StatePassParams {
  const void* x;        // k or q (rows d.k_stride or d.q_stride apart)
  const void* y;        // v or dO (null: zero)
  int64_t y_stride;     // y's row stride
  const float* g;
  const float* init;    // S0 or dS_T (null: zero)
  void* stored;         // [B·H][NT][K][V]: fp32, or with stored_in_act in the activation dtype
  bool stored_in_act;
  int decay_stride;     // kScalar: g's row stride (stage_scalar_gates)
  float* final_out;     // forward: the final state (written); null otherwise
  float* final_acc;     // reverse: the initial state's gradient (+=); null when not wanted
  float x_scale;
  Dims d;
  const uint64_t* reset_masks;  // null: no resets
};

// Shared memory: G, x and y staged for two chunks (the next one arrives by cp.async during the current one); the
// decayed operand X replaces x in place. ~74 KB for bf16 (up to three blocks per SM; ~92 KB with two V-tiles, two),
// ~104 KB for fp32 (two).
template <typename In, int kVTiles, bool kScalar = false>
struct StatePassSmem {
  static constexpr int kGSize = kScalar ? kChunk : kChunk * kLdS, kInSize = kChunk * TileLd<In>::in;  // one buffer's
  float* G;   // 2 × [64][kLdS] (kScalar: 2 × [64]): g, then in place its chunk-local cumsum
  In* xs;     // 2 × [64][ldi]
  In* ys;     // 2 × kVTiles × [64][ldi]: buffer b, V-tile vt at (b·kVTiles + vt)·kInSize
  float* seg; // [4][64]
  __host__ __device__ static size_t carve(void* base, StatePassSmem* s) {
    Carver c(base);
    s->G = c.take<float>(2 * kGSize);
    s->xs = c.take<In>(2 * kInSize);
    s->ys = c.take<In>(2 * kVTiles * kInSize);
    s->seg = c.take<float>(4 * 64);
    return c.off;
  }
};

// kBlocksPerSm: the residency the registers are capped for; kVTiles: V-tiles per block (2 only where the V-tiles
// pair up evenly), which reads x and g once for both (see Launcher::state_pass).
template <typename In, bool REVERSE, int kBlocksPerSm, int kVTiles, bool kResets, bool kScalar>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) state_pass_kernel(StatePassParams p) {
  extern __shared__ __align__(128) char smem[];
  StatePassSmem<In, kVTiles, kScalar> s;
  StatePassSmem<In, kVTiles, kScalar>::carve(smem, &s);
  begin_dependent_kernel();
  constexpr int ldi = TileLd<In>::in;
  const Dims& d = p.d;
  const int k0 = blockIdx.x * kTile, v0 = blockIdx.y * kVTiles * kTile, pair = blockIdx.z;
  const int b = pair / d.H, h = pair % d.H;
  const int krows = min(kTile, d.K - k0);
  int vcols[kVTiles];
#pragma unroll
  for (int vt = 0; vt < kVTiles; ++vt) vcols[vt] = min(kTile, d.V - v0 - vt * kTile);
  const In* x = static_cast<const In*>(p.x);
  const In* y = static_cast<const In*>(p.y);
  const int64_t state_off = static_cast<int64_t>(pair) * d.K * d.V + static_cast<int64_t>(k0) * d.V + v0;
  const int64_t key_stride = static_cast<int64_t>(d.H) * d.K;
  const bool g_async = async_copyable<float>(p.g, d.K, key_stride, kLdS);
  const int x_stride = REVERSE ? d.q_stride : d.k_stride;
  const bool x_async = async_copyable<In>(x, d.K, x_stride, ldi);
  const bool y_async = async_copyable<In>(y, d.V, p.y_stride, ldi);
  auto stage = [&](int step, int buf) {
    const int c = REVERSE ? d.NT - 1 - step : step;
    const int t0 = c * kChunk, n = min(kChunk, d.T - t0);
    const int64_t key_at = row_offset(d, b, t0, h, d.K) + k0,
                  x_at = strided_row_offset(d, b, t0, h, d.K, x_stride) + k0,
                  value_at = strided_row_offset(d, b, t0, h, d.V, p.y_stride) + v0;
    if constexpr (kScalar)
      stage_scalar_gates(s.G + buf * s.kGSize, p.g, p.decay_stride, d, b, t0, n, h);
    else
      stage_tile(s.G + buf * s.kGSize, kLdS, p.g + key_at, key_stride, n, krows, g_async);
    stage_tile(s.xs + buf * s.kInSize, ldi, x + x_at, x_stride, n, krows, x_async);
#pragma unroll
    for (int vt = 0; vt < kVTiles; ++vt)
      stage_tile(s.ys + (buf * kVTiles + vt) * s.kInSize, ldi, y ? y + value_at + vt * kTile : y, p.y_stride, n,
                 vcols[vt], y_async);
    cp_async_commit();
  };

  WarpTile M[kVTiles];  // the running state (or state gradient) tiles, kept in registers across the chunks
#pragma unroll
  for (int vt = 0; vt < kVTiles; ++vt)
    M[vt].load(p.init ? p.init + state_off + vt * kTile : nullptr, d.V, krows, vcols[vt]);
  stage(0, 0);
  for (int step = 0; step < d.NT; ++step) {
    const int c = REVERSE ? d.NT - 1 - step : step, buf = step & 1;
    __syncthreads();  // the other buffers and X are free (the previous chunk is done with them)
    if (step + 1 < d.NT) {
      stage(step + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    const int64_t stored_off =
        (static_cast<int64_t>(pair) * d.NT + c) * d.K * d.V + static_cast<int64_t>(k0) * d.V + v0;
#pragma unroll
    for (int vt = 0; vt < kVTiles; ++vt) {
      if (p.stored_in_act)
        M[vt].store(static_cast<In*>(p.stored) + stored_off + vt * kTile, d.V, krows, vcols[vt], false);
      else
        M[vt].store(static_cast<float*>(p.stored) + stored_off + vt * kTile, d.V, krows, vcols[vt], false);
    }
    __syncthreads();  // this chunk's tiles have landed
    float* G = s.G + buf * s.kGSize;
    if constexpr (kScalar)
      scalar_cumsum(G, s.seg);
    else
      chunk_cumsum(G, kLdS, s.seg);
    const float* GL = G + (kChunk - 1) * (kScalar ? 1 : kLdS);
    In* xs = s.xs + buf * s.kInSize;
    const uint64_t resets = kResets ? chunk_resets(p.reset_masks, d, b, c) : 0;
    // The rows [row_lo, row_hi) reach the exit (forward) or see the entry (reverse); all of them without resets.
    const int row_lo = REVERSE ? 0 : first_exiting(resets), row_hi = REVERSE ? first_reset(resets) : kChunk;
    // Thread: columns a, a + 1 (one paired shared access each for G, x and X), rows threadIdx.x / 32 + 8i.
    const int a = 2 * (threadIdx.x & 31);
    float gl[2];
    if constexpr (kScalar)
      gl[0] = gl[1] = GL[0];
    else
      load_pack<2>(GL + a, 0, gl);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int t = (threadIdx.x >> 5) + 8 * i;
      // Rows past the chunk's end hold x = 0 and G = G_L, so they contribute nothing and no exponent is positive.
      float gt[2], xt[2];
      if constexpr (kScalar)
        gt[0] = gt[1] = G[t];
      else
        load_pack<2>(G + t * kLdS + a, 0, gt);
      load_pack<2>(xs + t * ldi + a, 0, xt);
      const bool in = !kResets || (t >= row_lo && t < row_hi);
      const float decay0 = !in ? 0.f : REVERSE ? exp2_fast(gt[0]) : exp2_fast(gl[0] - gt[0]);
      const float decay1 = kScalar ? decay0 : !in ? 0.f : REVERSE ? exp2_fast(gt[1]) : exp2_fast(gl[1] - gt[1]);
      store_pack<2>(xs + t * ldi + a, 0, {p.x_scale * xt[0] * decay0, p.x_scale * xt[1] * decay1});  // in place
    }
    // Row k of M (a K index) decays by e^{G_L[k]} (kScalar: all rows by the one e^{G_L}); not at all past a reset.
    const float decay_lo = resets ? 0.f : exp2_fast(GL[kScalar ? 0 : WarpTile::row(0)]);
    const float decay_hi = kScalar ? decay_lo : resets ? 0.f : exp2_fast(GL[WarpTile::row(2)]);
#pragma unroll
    for (int vt = 0; vt < kVTiles; ++vt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        M[vt].c[j][0] *= decay_lo;
        M[vt].c[j][1] *= decay_lo;
        M[vt].c[j][2] *= decay_hi;
        M[vt].c[j][3] *= decay_hi;
      }
    __syncthreads();
#pragma unroll
    for (int vt = 0; vt < kVTiles; ++vt)
      tile_mma<true, false>(M[vt], xs, ldi, s.ys + (buf * kVTiles + vt) * s.kInSize, ldi);  // M += Xᵀ y
  }
#pragma unroll
  for (int vt = 0; vt < kVTiles; ++vt) {
    if (p.final_out) M[vt].store(p.final_out + state_off + vt * kTile, d.V, krows, vcols[vt], false);
    if (p.final_acc) M[vt].store(p.final_acc + state_off + vt * kTile, d.V, krows, vcols[vt], true);
  }
}

// Four consecutive elements of an operand tile in shared memory as floats, and back: one 8-byte access for bf16 (rows
// of whole 16-byte units, 4-element groups); element by element for fp32, whose Q̄ rows (odd stride) are unaligned.
template <typename T>
__device__ __forceinline__ void load4(const T* p, float (&x)[4]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = p[e];
  } else {
    load_pack<4>(p, 0, x);
  }
}
template <typename T>
__device__ __forceinline__ void store4(T* p, const float (&x)[4]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = x[e];
  } else {
    store_pack<4>(p, 0, x);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Forward output (spec 7.2 steps 2–3). One block per (chunk, pair):
//   A_ij = s·Σ_a q_ia k_ja e^{G_ia − G_ja} (j <= i), by K-tiles: diagonal 16×16 blocks element-wise (bf16: their 8×8
//   triangles), blocks below them (bf16: and the diagonal blocks' lower-left 8×8 squares) with the reference row
//   n = G of the query rows' first row (Q̂ = q ⊙ e^{G_i − n}, K̂ = k ⊙ e^{n − G_j});
//   o = Q̄ S^(c) + A v with Q̄ = s·q ⊙ e^{G} (rounded to the activation dtype, as fla does, as is A for A·v).
// Scalar decays (kScalar): A_ij = s·e^{G_i − G_j}·(q_i·k_j), one product q kᵀ over the K-tiles (the operands as
// staged: bf16 on the tensor cores, exact products, fp32 sums) and one exp2 per pair; Q̄ scales by one factor a row.
// The scores phase's fp32 tiles (q, k and G of one K-tile): rows of ld = 68 floats, whole 16-byte units, ≡ 4 (mod 32
// banks): the tensor-core fragment reads (8 rows × 4 columns per warp) are conflict-free, and
// so are the diagonal blocks' reads (4 blocks × 8 column groups per warp; see diagonal_scores).
struct ScoreTile {
  static constexpr int ld = kTile + 4;
  static constexpr int size = kChunk * ld;
  __device__ static int at(int t, int a) { return t * ld + a; }
};

struct FwdOutputParams {
  const void* q;
  const void* k;
  const void* v;
  const float* g;
  const void* states;  // in the activation dtype (the state pass rounds them as the products would)
  float scale;
  int decay_stride;  // kScalar: g's row stride (stage_scalar_gates)
  void* output;
  void* scores;  // null: not saved; in the activation dtype
  Dims d;
  const uint64_t* reset_masks;  // null: no resets
};

template <typename In, bool kScalar = false>
struct FwdOutputSmem {
  In* Qb;       // [64][key_pad + pad]: Q̄
  float* A;     // [64][kLdF]
  In* Ain;      // [64][ldi]: A in the operand dtype, written after the scores phase; during it, the same bytes hold
  float* g_raw; // a K-tile's g as loaded ([64][kTile] fp32: the buffer is sized for the larger of the two)
  float *q, *k, *G, *Khat, *Qhat, *seg;  // scores phase: ScoreTile ×3, [48][kLdF], [16][kLdF] (fp32 only), [4][64]
  In* k_in;     // scores phase: the K-tile's k as loaded ([64][ldi]; its q is loaded into Qb's columns)
  In *Y, *W;    // output phase: operand tiles (Y: the states' staging, two tiles for bf16)
  float* O;     // [64][acc]
  __host__ __device__ static size_t carve(void* base, int key_pad, FwdOutputSmem* s) {
    Carver c(base);
    s->Qb = c.take<In>(kChunk * (key_pad + TileLd<In>::pad));
    s->A = c.take<float>(kChunk * kLdF);
    if constexpr (kScalar) {  // scores phase: G [64], its cumsum scratch and k_in; no fp32 tiles
      s->Ain = c.take<In>(kChunk * TileLd<In>::in);
      const size_t region = c.off;
      s->G = c.take<float>(kChunk);
      s->seg = c.take<float>(kChunk / kSub);
      s->k_in = c.take<In>(kChunk * TileLd<In>::in);
      return carve_output_phase(c, region, s);
    }
    s->Ain = c.take<In>(std::max<size_t>(kChunk * TileLd<In>::in, kChunk * kTile * sizeof(float) / sizeof(In)));
    s->g_raw = reinterpret_cast<float*>(s->Ain);
    const size_t region = c.off;
    // One array, so that the compiler sees k and G at constant offsets from q (one address, immediate offsets).
    s->q = c.take<float>(3 * ScoreTile::size);
    s->k = s->q + ScoreTile::size;
    s->G = s->k + ScoreTile::size;
    s->seg = c.take<float>(4 * 64);
    s->k_in = c.take<In>(kChunk * TileLd<In>::in);
    constexpr bool kSimtOffDiagonal = std::is_same_v<In, float>;
    s->Khat = c.take<float>(kSimtOffDiagonal ? 48 * kLdF : 0);
    s->Qhat = c.take<float>(kSimtOffDiagonal ? kSub * kLdF : 0);
    return carve_output_phase(c, region, s);
  }
  // The output phase's tiles, over the scores phase's from `region` on; the bytes both phases take.
  __host__ __device__ static size_t carve_output_phase(Carver& c, size_t region, FwdOutputSmem* s) {
    const size_t scores_end = c.off;
    c.off = region;
    s->Y = c.take<In>((std::is_same_v<In, float> ? 1 : 2) * kChunk * TileLd<In>::in);
    s->W = c.take<In>(kChunk * TileLd<In>::in);
    s->O = c.take<float>(kChunk * TileLd<In>::acc);
    return scores_end > c.off ? scores_end : c.off;
  }
};

// The element-wise triangles of the diagonal blocks: in each 16×16 diagonal block, the kTri×kTri triangles on its
// diagonal (kTri = 16: the whole block, the fp32 path; kTri = 8: its two 8×8 triangles, the bf16 path, whose 8×8 square
// below them goes to the tensor cores, see accumulate_scores). Only j <= i is formed, so every exponent is <= 0.
// Warp w takes rows p and kTri − 1 − p (p = w mod kTri/2) of triangle w / (kTri/2) of every block (kTri + 1 entries;
// the same work for every warp); lane 4s + b takes block b and the K-tile columns 4s .. 4s+3 and 32+4s .. 32+4s+3, in
// the order rotated by b (step u reads column 4s + (u + b) % 4 (+32)): rows 16 apart share banks (16·68 ≡ 0 mod 32),
// so the rotation is what keeps the four blocks' reads on different banks. The rows' q and G stay in registers, each
// key row's k and G are read once for both rows, and each entry's eight per-lane terms are summed in order, then
// across the eight column groups by a fixed butterfly (bitwise reproducible). Each (entry, feature) costs one exp2:
// that (the multi-function unit's 16 results per clock per SM) is what bounds this loop, hence kTri = 8 where TF32
// products are accurate enough.
template <int kTri>
__device__ void diagonal_scores(float* A, const float* q, const float* k, const float* G, float scale) {
  static_assert(kTri == kSub || kTri == kSub / 2, "triangles of 16 or 8 rows");
  constexpr int kRowPairs = kTri / 2;  // per triangle; 8 warps cover every triangle of a block
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int b = lane & 3, s = lane >> 2, pr = w % kRowPairs;
  const int first = kSub * b + kTri * (w / kRowPairs);  // the triangle's first row (and column)
  const int lo = first + pr, hi = first + kTri - 1 - pr;
  float q_lo[8], g_lo[8], q_hi[8], g_hi[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int a = 4 * s + ((u + b) & 3) + 32 * (u >> 2);
    q_lo[u] = q[ScoreTile::at(lo, a)];
    g_lo[u] = G[ScoreTile::at(lo, a)];
    q_hi[u] = q[ScoreTile::at(hi, a)];
    g_hi[u] = G[ScoreTile::at(hi, a)];
  }
  // Key row j = first + jj <= hi; also <= lo while jj <= pr. Two loops (warp-uniform bounds), so that the rows past lo
  // issue no predicated-off work for it.
  auto key_row = [&](int jj, auto both_rows) {
    constexpr bool kBoth = decltype(both_rows)::value;
    const int j = first + jj;
    float s_hi = 0.f, s_lo = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int a = 4 * s + ((u + b) & 3) + 32 * (u >> 2);
      const float kj = k[ScoreTile::at(j, a)], gj = G[ScoreTile::at(j, a)];
      s_hi = fmaf(q_hi[u] * kj, exp2_fast(g_hi[u] - gj), s_hi);
      if (kBoth) s_lo = fmaf(q_lo[u] * kj, exp2_fast(g_lo[u] - gj), s_lo);
    }
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) {
      s_hi += __shfl_xor_sync(0xffffffffu, s_hi, m);
      if (kBoth) s_lo += __shfl_xor_sync(0xffffffffu, s_lo, m);
    }
    if (s == 0) {
      A[hi * kLdF + j] += scale * s_hi;
      if (kBoth) A[lo * kLdF + j] += scale * s_lo;
    }
  };
  int jj = 0;
  for (; jj <= pr; ++jj) key_row(jj, std::true_type{});
  for (; jj < kTri - pr; ++jj) key_row(jj, std::false_type{});
}

// TF32 tensor-core product (mma.sync m16n8k8, fp32 accumulate): c += a·b with a 16×8 row-major and b 8×8 col-major
// fragments (PTX ISA fragment layouts: lane = 4g + t holds a[g][t], a[g+8][t], a[g][t+4], a[g+8][t+4], b[t][g],
// b[t+4][g], and c[g][2t], c[g][2t+1], c[g+8][2t], c[g+8][2t+1]).
// The operands are rounded to TF32 by adding half a TF32 unit (bit 12) to the fp32 bit pattern: the tensor cores
// read only the top 19 bits (they truncate), so this is cvt.rna's round to nearest, ties away from zero, in one integer
// add instead of the several instructions that sm_90 spends on cvt.rna (CUTLASS's round_half_ulp_truncate). Exact for
// every finite operand here (products of a bf16 value and a decay <= 1, far from the overflow at FLT_MAX).
__device__ __forceinline__ uint32_t to_tf32(float x) { return __float_as_uint(x) + 0x1000u; }
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One block of scores below the element-wise ones, by one warp on the tensor cores (TF32): query rows n .. n + kRows − 1
// against key columns j0 .. j0 + 8·kColTiles − 1 (all < n): A[i][j] += s·Σ_a Q̂_ia K̂_ja with the reference row n,
// Q̂ = q ⊙ e^{G_i − G_n} and K̂ = k ⊙ e^{G_n − G_j} (both exponents <= 0), built straight into the fragments from the
// tiles. Used for the 16×16 blocks below the diagonal blocks (n = 16r, j0 = 16J, J < r) and for the 8×8 square in
// the lower left of each diagonal block (n = 16b + 8, j0 = 16b; kRows = 8 leaves the fragment's rows g + 8 zero and
// unformed). Factoring e^{G_i − G_j} so costs 8 + 8 exp2 per feature for an 8×8 square instead of 64. For bf16
// activations only: there A only ever enters a product rounded to bf16 (A v, and the backward's Aᵀ dO), and TF32's
// 2^-11 input rounding stays below that; fp32 activations keep the SIMT rounds (their tolerance needs full fp32).
template <int kRows, int kColTiles>
__device__ void scores_block_tf32(float* A, const float* q, const float* k, const float* G, float scale, int n,
                                  int j0) {
  static_assert(kRows == 16 || kRows == 8, "m16n8k8 rows: 16, or 8 of them");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int i0 = n + g, i1 = n + g + 8;
  float acc[kColTiles][4] = {};
#pragma unroll 2
  for (int a0 = 0; a0 < kTile; a0 += 8) {
    const int c0 = a0 + t, c1 = a0 + t + 4;
    const float ref0 = G[ScoreTile::at(n, c0)], ref1 = G[ScoreTile::at(n, c1)];
    auto q_hat = [&](int i, int c, float ref) {
      return to_tf32(q[ScoreTile::at(i, c)] * exp2_fast(G[ScoreTile::at(i, c)] - ref));
    };
    const uint32_t fa[4] = {q_hat(i0, c0, ref0), kRows == 16 ? q_hat(i1, c0, ref0) : 0u, q_hat(i0, c1, ref1),
                            kRows == 16 ? q_hat(i1, c1, ref1) : 0u};
#pragma unroll
    for (int nt = 0; nt < kColTiles; ++nt) {
      const int j = j0 + 8 * nt + g;
      const uint32_t fb[2] = {to_tf32(k[ScoreTile::at(j, c0)] * exp2_fast(ref0 - G[ScoreTile::at(j, c0)])),
                              to_tf32(k[ScoreTile::at(j, c1)] * exp2_fast(ref1 - G[ScoreTile::at(j, c1)]))};
      mma_tf32(acc[nt], fa, fb);
    }
  }
#pragma unroll
  for (int nt = 0; nt < kColTiles; ++nt) {
    const int col = j0 + 8 * nt + 2 * t;
    A[i0 * kLdF + col] += scale * acc[nt][0];
    A[i0 * kLdF + col + 1] += scale * acc[nt][1];
    if (kRows == 16) {
      A[i1 * kLdF + col] += scale * acc[nt][2];
      A[i1 * kLdF + col + 1] += scale * acc[nt][3];
    }
  }
}

// Adds one K-tile's share to the scores A ([64][kLdF], s included). q, k, G: the tile's fp32 rows (ScoreTile);
// Khat, Qhat: scratch of the fp32 path. bf16 activations: the diagonal blocks' 8×8 triangles element-wise, and on the
// tensor cores the six blocks below them (warps 0–5, block (r, J) for warp r(r−1)/2 + J) and the diagonal blocks'
// lower-left 8×8 squares (warps 6 and 7, two blocks each: about the six warps' work). fp32 activations: the whole
// diagonal blocks element-wise, the rest as fp32 SIMT dot products, one query sub-chunk r at a time (reference row 16r).
template <typename In>
__device__ void accumulate_scores(float* A, const float* q, const float* k, const float* G, float* Khat, float* Qhat,
                                  float scale) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    diagonal_scores<kSub / 2>(A, q, k, G, scale);
    const int w = threadIdx.x >> 5;
    if (w < 6) {
      const int r = w == 0 ? 1 : w < 3 ? 2 : 3;
      scores_block_tf32<kSub, 2>(A, q, k, G, scale, r * kSub, (w - r * (r - 1) / 2) * kSub);
    } else {
      for (int blk = 2 * (w - 6); blk < 2 * (w - 6) + 2; ++blk)
        scores_block_tf32<kSub / 2, 1>(A, q, k, G, scale, blk * kSub + kSub / 2, blk * kSub);
    }
  } else {
    diagonal_scores<kSub>(A, q, k, G, scale);
    for (int r = 1; r < kChunk / kSub; ++r) {
      const int a0 = r * kSub;
      __syncthreads();  // Khat/Qhat free
      for (int idx = threadIdx.x; idx < a0 * kTile; idx += kThreads) {
        const int j = idx >> 6, a = idx & 63;
        Khat[j * kLdF + a] = k[ScoreTile::at(j, a)] * exp2_fast(G[ScoreTile::at(a0, a)] - G[ScoreTile::at(j, a)]);
      }
      for (int idx = threadIdx.x; idx < kSub * kTile; idx += kThreads) {
        const int i = idx >> 6, a = idx & 63;
        Qhat[i * kLdF + a] =
            q[ScoreTile::at(a0 + i, a)] * exp2_fast(G[ScoreTile::at(a0 + i, a)] - G[ScoreTile::at(a0, a)]);
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kSub * a0; e += kThreads) {
        const int i = e / a0, j = e % a0;
        const float *qi = Qhat + i * kLdF, *kj = Khat + j * kLdF;
        float sum = 0.f;
        for (int a = 0; a < kTile; ++a) sum = fmaf(qi[a], kj[a], sum);
        A[(a0 + i) * kLdF + j] += scale * sum;
      }
    }
  }
}

template <typename In, bool kResets, bool kScalar>
__global__ void __launch_bounds__(kThreads, 2) fwd_output_kernel(FwdOutputParams p) {
  extern __shared__ __align__(128) char smem[];
  FwdOutputSmem<In, kScalar> s;
  FwdOutputSmem<In, kScalar>::carve(smem, p.d.key_pad, &s);
  allow_dependent_launch();
  constexpr int ldi = TileLd<In>::in, ldc = TileLd<In>::acc;
  const Dims& d = p.d;
  const int ldq = d.key_pad + TileLd<In>::pad;
  // Plain variables, not a structured binding: the staging lambdas capture them (C++17).
  const ChunkBlock cb = chunk_block(d, blockIdx.x, blockIdx.y);
  const int c = cb.c, pair = cb.pair, b = cb.b, h = cb.h, t0 = cb.t0, n = cb.n;
  const int64_t key_stride = cb.key_stride, value_stride = cb.value_stride;
  const In* q = static_cast<const In*>(p.q) + strided_row_offset(d, b, t0, h, d.K, d.q_stride);
  const In* k = static_cast<const In*>(p.k) + strided_row_offset(d, b, t0, h, d.K, d.k_stride);
  const float* g = p.g + row_offset(d, b, t0, h, d.K);
  const uint64_t resets = kResets ? chunk_resets(p.reset_masks, d, b, c) : 0;
  const int entered = first_reset(resets);  // Q̄'s rows from here on are 0: S^(c) does not reach them

  if constexpr (kScalar) {
    // The K-tiles' q (into their columns of Qb) and k (into k_in) arrive by cp.async, the next one's during this
    // one's Q̄; g's column with the first.
    const bool q_async = async_copyable<In>(q, d.K, d.q_stride, ldq);
    const bool k_async = async_copyable<In>(k, d.K, d.k_stride, ldi);
    auto stage_key_tile = [&](int kt) {
      const int k0 = kt * kTile, kcols = min(kTile, d.K - k0);
      stage_tile(s.Qb + k0, ldq, q + k0, d.q_stride, n, kcols, q_async);
      stage_tile(s.k_in, ldi, k + k0, d.k_stride, n, kcols, k_async);
      cp_async_commit();
    };
    stage_scalar_gates(s.G, p.g, p.decay_stride, d, b, t0, n, h);
    stage_key_tile(0);
    WarpTile S;  // q kᵀ summed over the K-tiles
    S.zero();
    for (int kt = 0; kt < d.nk; ++kt) {
      const int k0 = kt * kTile;
      cp_async_wait<0>();
      __syncthreads();  // tile kt has landed; the previous tile's Q̄ pass is done
      if (kt == 0) scalar_cumsum(s.G, s.seg);
      tile_mma<false, true>(S, s.Qb + k0, ldq, s.k_in, ldi);
      __syncthreads();  // k_in free, q's columns read
      if (kt + 1 < d.nk) stage_key_tile(kt + 1);
      const int a = TileVec::col();
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // Q̄ = s·q·e^{G_t} over q's columns, in place
        const int t = TileVec::row(i);
        const float f = !kResets || t < entered ? p.scale * exp2_fast(s.G[t]) : 0.f;
        float x[4];
        load4(s.Qb + t * ldq + k0 + a, x);
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] *= f;
        store4(s.Qb + t * ldq + k0 + a, x);
      }
    }
    // A = s·e^{G_i − G_j}·(q kᵀ)_ij for j <= i, else 0 (rows past the chunk's end are 0: q is 0 there).
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = WarpTile::row(e), cc = WarpTile::col(j, e);
        s.A[r * kLdF + cc] = cc <= r ? p.scale * exp2_fast(s.G[r] - s.G[cc]) * S.c[j][e] : 0.f;
      }
  } else {
    zero_tile(s.A, kLdF);
    // Each K-tile's g (into g_raw), q (into its columns of Qb, which it later overwrites) and k (into k_in) arrive by
    // cp.async, 16 bytes a copy; G is then g_raw's cumsum, and q and k are widened into the fp32 tiles. The next
    // K-tile's copies are issued as soon as this tile's g_raw and k_in are consumed, so they land during its scores
    // (waited for at each tile's start, the copies held 7% of the kernel's stall samples; Nsight Compute, B=8).
    const bool g_async = async_copyable<float>(g, d.K, key_stride, kTile);
    const bool q_async = async_copyable<In>(q, d.K, d.q_stride, ldq);
    const bool k_async = async_copyable<In>(k, d.K, d.k_stride, ldi);
    auto stage_key_tile = [&](int kt) {
      const int k0 = kt * kTile, kcols = min(kTile, d.K - k0);
      stage_tile(s.g_raw, kTile, g + k0, key_stride, n, kcols, g_async);
      stage_tile(s.Qb + k0, ldq, q + k0, d.q_stride, n, kcols, q_async);
      stage_tile(s.k_in, ldi, k + k0, d.k_stride, n, kcols, k_async);
      cp_async_commit();
    };
    stage_key_tile(0);
    for (int kt = 0; kt < d.nk; ++kt) {
      const int k0 = kt * kTile;
      cp_async_wait<0>();
      __syncthreads();  // tile kt has landed; the previous tile's readers are done
      chunk_cumsum(s.G, ScoreTile::ld, s.seg, s.g_raw, kTile);  // ends with a barrier
      // One pass, four columns a thread (TileVec's layout): q and k widened into the fp32 tiles, and Q̄ = s·q ⊙ e^G
      // over q's columns of Qb (each thread rewrites the elements it read).
      const int a = TileVec::col();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = TileVec::row(i);
        float qv[4], kv[4], qbar[4];
        load4(s.Qb + t * ldq + k0 + a, qv);
        load4(s.k_in + t * ldi + a, kv);
        const float4 gv = *reinterpret_cast<const float4*>(s.G + ScoreTile::at(t, a));
        *reinterpret_cast<float4*>(s.q + ScoreTile::at(t, a)) = make_float4(qv[0], qv[1], qv[2], qv[3]);
        *reinterpret_cast<float4*>(s.k + ScoreTile::at(t, a)) = make_float4(kv[0], kv[1], kv[2], kv[3]);
        const float g4[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) qbar[e] = !kResets || t < entered ? p.scale * qv[e] * exp2_fast(g4[e]) : 0.f;
        store4(s.Qb + t * ldq + k0 + a, qbar);
      }
      __syncthreads();  // the widened tiles are complete, g_raw and k_in free
      if (kt + 1 < d.nk) stage_key_tile(kt + 1);
      accumulate_scores<In>(s.A, s.q, s.k, s.G, s.Khat, s.Qhat, p.scale);
    }
  }
  __syncthreads();
  if (resets) {  // block-uniform: the scores of pairs across a reset are 0
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kThreads) {
      const int i = idx >> 6, j = idx & 63;
      if (j < segment_start(resets, i)) s.A[i * kLdF + j] = 0.f;
    }
    __syncthreads();
  }
  if (p.scores) {
    In* dst = static_cast<In*>(p.scores) + (static_cast<int64_t>(pair) * d.NT + c) * kChunk * kChunk;
    store_tile(dst, kChunk, s.A, kLdF, kChunk, kChunk, false);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // four columns a thread (TileVec's layout)
    const int t = TileVec::row(i), a = TileVec::col();
    const float* row = s.A + t * kLdF + a;
    store4(s.Ain + t * ldi + a, {row[0], row[1], row[2], row[3]});
  }

  const In* state = static_cast<const In*>(p.states) + (static_cast<int64_t>(pair) * d.NT + c) * d.K * d.V;
  In* out = static_cast<In*>(p.output) + row_offset(d, b, t0, h, d.V);
  wait_for_previous_kernel();  // the states are the forward state pass's
  // v goes straight to shared memory by cp.async, arriving during the state product without holding registers
  // across it (the kernel is at its register cap; for the same reason v's address is formed where it is used).
  for (int vt = 0; vt < d.nv; ++vt) {
    const int v0 = vt * kTile, vcols = min(kTile, d.V - v0);
    __syncthreads();  // scores-phase buffers (aliased) and the previous tile's store are done
    WarpTile O;
    O.zero();
    const In* v = static_cast<const In*>(p.v) + strided_row_offset(d, b, t0, h, d.V, d.v_stride);
    stage_tile(s.W, ldi, v + v0, d.v_stride, n, vcols, async_copyable<In>(v, d.V, d.v_stride, ldi));
    cp_async_commit();
    accumulate_state_product(O, s.Qb, ldq, state, d, v0, s.Y);
    cp_async_wait<0>();
    __syncthreads();
    tile_mma<false, false>(O, s.Ain, ldi, s.W, ldi);
    // Out through shared memory, so that each warp's global stores are whole rows of consecutive elements.
    O.store_shared(s.O, ldc);
    __syncthreads();
    store_tile(out + v0, value_stride, s.O, ldc, n, vcols, false);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward dv and dA (spec 7.3 steps 3–4). One block per (chunk, pair):
//   dv_j = Σ_{t >= j} A_tj dO_t + (k_j ⊙ e^{G_L − G_j}) dS_e,   dA_tj = s·dO_t · v_j (j <= t), saved for bwd_dqk.
// Scalar decays (kScalar): k_j's row scales by the one factor e^{G_L − G_j} (G one column, in G's first 64 floats).
struct BwdDvParams {
  const void* k;
  const void* v;
  const float* g;
  const void* d_output;  // null: zero
  const void* d_states;  // fp32, or with d_states_in_act in the activation dtype
  const void* scores;  // in the activation dtype
  void* dv;            // null: not wanted
  float* d_scores;
  const uint64_t* reset_masks;  // null: no resets
  Dims d;
  float scale;
  int dv_stride;  // dv's row stride
  bool accumulate_dv;
  // kScalar: g is [B·T, H] (row stride H), else [H] (row stride 0). A flag, not the stride as in the other kernels'
  // parameters: the int would take the struct past 128 bytes, the flag sits in accumulate_dv's padding.
  bool decay_per_step;
  bool d_states_in_act;  // in the same padding
};
// Within 128 bytes (hence bwd_dv's field order): past that, nvcc compiled the state pass and bwd_dv to other code.
static_assert(sizeof(StatePassParams) <= 128 && sizeof(BwdDvParams) <= 128, "kernel parameters past 128 bytes");

template <typename In>
struct BwdDvSmem {
  static constexpr int kGatePad = 4;  // G's rows: key_pad + 4 floats, whole 16-byte units for cp.async
  In* X;       // [64][key_pad + pad]: k, made k ⊙ e^{G_L − G} in place
  In* Ain;     // [64][ldi]: A (read transposed)
  float *G, *seg;  // prologue: G [64][key_pad + kGatePad] (every K-tile), cumsum scratch
  In *Y, *dO, *Vt;
  float* O;
  // state_tiles: Y's tiles, 2 where the state gradients come in the activation dtype (accumulate_state_product
  // stages them by cp.async, two K-tiles in flight), else 1.
  __host__ __device__ static size_t carve(void* base, int key_pad, int state_tiles, BwdDvSmem* s) {
    Carver c(base);
    s->X = c.take<In>(kChunk * (key_pad + TileLd<In>::pad));
    s->Ain = c.take<In>(kChunk * TileLd<In>::in);
    const size_t region = c.off;
    s->G = c.take<float>(kChunk * (key_pad + kGatePad));
    s->seg = c.take<float>(4 * 64);
    const size_t prologue_end = c.off;
    c.off = region;
    s->Y = c.take<In>(state_tiles * kChunk * TileLd<In>::in);
    s->dO = c.take<In>(kChunk * TileLd<In>::in);
    s->Vt = c.take<In>(kChunk * TileLd<In>::in);
    s->O = c.take<float>(kChunk * TileLd<In>::acc);
    return prologue_end > c.off ? prologue_end : c.off;
  }
};

__host__ __device__ inline int bwd_dv_state_tiles(const BwdDvParams& p) { return p.d_states_in_act ? 2 : 1; }

template <typename In, bool kResets, bool kScalar>
__global__ void __launch_bounds__(kThreads, 2) bwd_dv_kernel(BwdDvParams p) {
  extern __shared__ __align__(128) char smem[];
  BwdDvSmem<In> s;
  BwdDvSmem<In>::carve(smem, p.d.key_pad, bwd_dv_state_tiles(p), &s);
  allow_dependent_launch();
  constexpr int ldi = TileLd<In>::in, ldc = TileLd<In>::acc;
  const Dims& d = p.d;
  const int ldx = d.key_pad + TileLd<In>::pad;
  const auto [c, pair, b, h, t0, n, key_stride, value_stride] = chunk_block(d, blockIdx.x, blockIdx.y);
  const In* k = static_cast<const In*>(p.k) + strided_row_offset(d, b, t0, h, d.K, d.k_stride);
  const float* g = p.g + row_offset(d, b, t0, h, d.K);

  const int64_t chunk_index = static_cast<int64_t>(pair) * d.NT + c;
  const In* scores = static_cast<const In*>(p.scores) + chunk_index * kChunk * kChunk;
  const uint64_t resets = kResets ? chunk_resets(p.reset_masks, d, b, c) : 0;
  const int exiting = first_exiting(resets);  // X's rows before it are 0: their keys do not reach dS_e

  // Prologue: k (into X), g of every K-tile and A all go to shared memory by cp.async, waited for once (loads through
  // registers would wait out one memory latency per tile).
  const int ldg = d.key_pad + BwdDvSmem<In>::kGatePad;
  const bool k_async = async_copyable<In>(k, d.K, d.k_stride, ldx);
  const bool g_async = async_copyable<float>(g, d.K, key_stride, ldg);
  for (int kt = 0; kt < d.nk; ++kt) {
    const int k0 = kt * kTile, kcols = min(kTile, d.K - k0);
    stage_tile(s.X + k0, ldx, k + k0, d.k_stride, n, kcols, k_async);
    if constexpr (!kScalar) stage_tile(s.G + k0, ldg, g + k0, key_stride, n, kcols, g_async);
  }
  if constexpr (kScalar) stage_scalar_gates(s.G, p.g, p.decay_per_step ? d.H : 0, d, b, t0, n, h);
  stage_tile(s.Ain, ldi, scores, kChunk, kChunk, kChunk, async_copyable<In>(scores, kChunk, kChunk, ldi));
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (kScalar) {
    scalar_cumsum(s.G, s.seg);
    float f[4];  // e^{G_L − G_t} of this thread's four rows (0 before the last reset)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = TileVec::row(i);
      f[i] = kResets && t < exiting ? 0.f : exp2_fast(s.G[kChunk - 1] - s.G[t]);
    }
    for (int kt = 0; kt < d.nk; ++kt) {
      const int col = kt * kTile + TileVec::col();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float x[4];
        load4(s.X + TileVec::row(i) * ldx + col, x);
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] *= f[i];
        store4(s.X + TileVec::row(i) * ldx + col, x);
      }
    }
  } else {
    for (int kt = 0; kt < d.nk; ++kt) {
      chunk_cumsum(s.G + kt * kTile, ldg, s.seg);  // ends with a barrier
      // X = k ⊙ e^{G_L − G} in place, four columns a thread in TileVec's layout (the same four in every row it takes,
      // so G_L once).
      const int col = kt * kTile + TileVec::col();
      const float4 gl = *reinterpret_cast<const float4*>(s.G + (kChunk - 1) * ldg + col);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = TileVec::row(i);
        float x[4];
        load4(s.X + t * ldx + col, x);
        const float4 gt = *reinterpret_cast<const float4*>(s.G + t * ldg + col);
        x[0] *= exp2_fast(gl.x - gt.x);
        x[1] *= exp2_fast(gl.y - gt.y);
        x[2] *= exp2_fast(gl.z - gt.z);
        x[3] *= exp2_fast(gl.w - gt.w);
        if (kResets && t < exiting) x[0] = x[1] = x[2] = x[3] = 0.f;
        store4(s.X + t * ldx + col, x);
      }
    }
  }
  WarpTile dA;  // s·dO vᵀ summed over the V-tiles
  dA.zero();

  const int64_t state_at = chunk_index * d.K * d.V;
  const In* d_out = p.d_output ? static_cast<const In*>(p.d_output) + row_offset(d, b, t0, h, d.V) : nullptr;
  const In* v = static_cast<const In*>(p.v) + strided_row_offset(d, b, t0, h, d.V, d.v_stride);
  In* dv = p.dv ? static_cast<In*>(p.dv) + strided_row_offset(d, b, t0, h, d.V, p.dv_stride) : nullptr;
  // dO and v go straight to shared memory by cp.async, arriving during the state product (as in fwd_output).
  const bool do_async = async_copyable<In>(d_out, d.V, value_stride, ldi);
  const bool v_async = async_copyable<In>(v, d.V, d.v_stride, ldi);
  wait_for_previous_kernel();  // the state gradients are the reverse state pass's
  for (int vt = 0; vt < d.nv; ++vt) {
    const int v0 = vt * kTile, vcols = min(kTile, d.V - v0);
    __syncthreads();  // the prologue's buffers (aliased) and the previous tile's products and store are done
    WarpTile O;
    O.zero();
    stage_tile(s.dO, ldi, d_out ? d_out + v0 : d_out, value_stride, n, vcols, do_async);
    stage_tile(s.Vt, ldi, v + v0, d.v_stride, n, vcols, v_async);
    cp_async_commit();
    if (p.d_states_in_act)
      accumulate_state_product(O, s.X, ldx, static_cast<const In*>(p.d_states) + state_at, d, v0, s.Y);
    else
      accumulate_state_product(O, s.X, ldx, static_cast<const float*>(p.d_states) + state_at, d, v0, s.Y);
    cp_async_wait<0>();
    __syncthreads();
    tile_mma<true, false>(O, s.Ain, ldi, s.dO, ldi);   // Aᵀ dO
    tile_mma<false, true>(dA, s.dO, ldi, s.Vt, ldi);   // dO vᵀ
    if (dv) {  // through shared memory, as in fwd_output
      O.store_shared(s.O, ldc);
      __syncthreads();
      store_tile(dv + v0, p.dv_stride, s.O, ldc, n, vcols, p.accumulate_dv);
    }
  }
  // dA, lower triangle (j <= i) with s, zeros above and across resets (from the row's segment start, as A): straight
  // from the registers (fp32, whole 64×64 tile).
  float* dA_out = p.d_scores + chunk_index * kChunk * kChunk;
  const int start_lo = segment_start(resets, WarpTile::row(0)), start_hi = segment_start(resets, WarpTile::row(2));
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // column pairs (2t, 2t + 1): one 8-byte store
      const int r = WarpTile::row(e), cc = WarpTile::col(j, e), start = e == 0 ? start_lo : start_hi;
      *reinterpret_cast<float2*>(dA_out + r * kChunk + cc) =
          make_float2(cc <= r && (!kResets || cc >= start) ? p.scale * dA.c[j][e] : 0.f,
                      cc + 1 <= r && (!kResets || cc + 1 >= start) ? p.scale * dA.c[j][e + 1] : 0.f);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward dq, dk, dg (spec 7.3 steps 5–6), one block per (K-tile, chunk, pair). As in the CPU reference, dq and dk are
// first formed without their gate-independent terms (the diagonal scores' dA_ii, the last row's dk_inter_L), dg is the
// reverse cumulative sum of q ⊙ dq − k ⊙ dk plus d_last, and the held-back terms are added afterwards: they would
// otherwise cancel only up to an O(1)·eps residue that swamps a dg made tiny by strong decay.
//   inter: dq_t += s·e^{G_t} ⊙ (dO_t S_pᵀ);  dk_inter_j = e^{G_L − G_j} ⊙ (v_j dS_eᵀ)
//   intra: dq_i += Σ_{j<i} dA_ij k_j ⊙ e^{G_i − G_j};  dk_j += Σ_{i>j} dA_ij q_i ⊙ e^{G_i − G_j}
//   d_last = e^{G_L} ⊙ rowsum(S_p ⊙ dS_e) + Σ_{j<L} k_j ⊙ dk_inter_j
// Off-diagonal intra blocks: dq uses the first row of the query sub-chunk as reference, dk the last row of the key
// sub-chunk (spec 7.3 step 5).
// Scalar decays (kScalar): the intra terms from one product each, dq += W k and dk += Wᵀ q with W_ij = dA_ij·e^{G_i −
// G_j} (j < i), and the inter ones by a factor a row; dg, the sum over the key channels of theirs, is summed over the
// K-tile's channels per row: into dg itself with one K-tile, else into dg_partials, added up after the kernel.
struct BwdDqkParams {
  const void* q;
  const void* k;
  const void* v;
  const float* g;
  const void* d_output;  // null: zero
  const void* states;    // in the activation dtype
  const void* d_states;  // fp32, or with d_states_in_act in the activation dtype (then no dg is formed)
  const float* d_scores;
  float scale;
  int decay_stride;  // kScalar: g's row stride (stage_scalar_gates)
  void* dq;
  void* dk;
  float* dg;
  int dq_stride, dk_stride;  // dq's and dk's row strides (dg is contiguous)
  bool accumulate_dq, accumulate_dk, accumulate_dg;
  Dims d;
  GlaGatesEpilogue gates;  // q_hat set: the gates' gradients instead of dq, dk, dg (strides resolved: never 0)
  const uint64_t* reset_masks;  // null: no resets
  float* dg_partials;           // kScalar with several K-tiles: [nk][B·T·H], one K-tile's dg each (written)
  bool d_states_in_act;
};

// bwd_dqk's tile strides: q, k and G rows of kLdB (≡ 8 banks mod 32) and dA rows of kLdD (≡ 4): the tensor-core
// fragments below read 4 rows × 8 columns of q, k, G and 8 rows × 4 columns of dA per warp without bank conflicts.
constexpr int kLdB = kTile + 8;
constexpr int kLdD = kTile + 4;

// One job of bwd_dqk's intra products below the diagonal blocks, on the tensor cores (TF32, mma m16n8k8; bf16
// activations only, as off_diagonal_block_tf32 in the forward): the 16 rows of sub-chunk `blk` and 32 columns
// (col0 ..) of the K-tile, against the inner rows [inner0, inner1) of the other side:
//   dq (DK = false): Pq_i += e^{G_i − G_n} Σ_{j in inner} dA_ij k̂_j,  k̂_j = k_j ⊙ e^{G_n − G_j},  n = 16·blk, j < n;
//   dk (DK = true):  Pk_j += e^{G_n − G_j} Σ_{i in inner} dA_ij q̌_i,  q̌_i = q_i ⊙ e^{G_i − G_n},  n = 16·blk + 15, i > n.
// Every exponent is <= 0. The operand fragments are built straight from the tiles; TF32's 2^-11 input rounding sits
// below the bf16 rounding of dq and dk (dg, formed from them in fp32, keeps the bf16 tolerance).
template <bool DK, typename In>
__device__ void intra_block_tf32(float* P, int ldp, const float* dA, const In* x, const float* G, int blk, int col0,
                                 int inner0, int inner1) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int o0 = blk * kSub, n = DK ? o0 + kSub - 1 : o0;
  float ref[4], acc[4][4] = {};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) ref[nt] = G[n * kLdB + col0 + 8 * nt + g];
  for (int i0 = inner0; i0 < inner1; i0 += 8) {
    // A fragment: rows o0 + g (+8), columns i0 + t (+4) of dA (dq), or of dAᵀ (dk).
    auto dA_at = [&](int row, int col) { return DK ? dA[col * kLdD + row] : dA[row * kLdD + col]; };
    const uint32_t fa[4] = {to_tf32(dA_at(o0 + g, i0 + t)), to_tf32(dA_at(o0 + g + 8, i0 + t)),
                            to_tf32(dA_at(o0 + g, i0 + t + 4)), to_tf32(dA_at(o0 + g + 8, i0 + t + 4))};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int a = col0 + 8 * nt + g;
      auto hat = [&](int row) {
        const float e = DK ? G[row * kLdB + a] - ref[nt] : ref[nt] - G[row * kLdB + a];
        return to_tf32(load_f(x[row * kLdB + a]) * exp2_fast(e));
      };
      const uint32_t fb[2] = {hat(i0 + t), hat(i0 + t + 4)};
      mma_tf32(acc[nt], fa, fb);
    }
  }
  // acc[nt] holds rows o0 + g (+8), columns col0 + 8nt + 2t (+1).
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = o0 + g + 8 * (e >> 1), a = col0 + 8 * nt + 2 * t + (e & 1);
      const float gr = G[row * kLdB + a], gn = G[n * kLdB + a];
      P[row * ldp + a] += exp2_fast(DK ? gn - gr : gr - gn) * acc[nt][e];
    }
}

template <typename In>
struct BwdDqkSmem {
  In *q, *k;          // [64][kLdB], in the activation dtype (exact copies; halves their footprint for bf16)
  float* G;           // [64][kLdB]
  float *Pq, *Pk;     // [64][acc]: dq and dk under construction
  float *seg, *rowsum, *dlast_part, *dk_last, *d_last;  // [4][64], [64], [4][64], [64], [64]
  In *dO, *Vt, *Sp, *dS;       // inter phase operand tiles
  float *dA, *hat;             // intra phase: [64][kLdD], [48][kLdF] (fp32 only: K̂, then Q̌, of one round)
  In *q_hat, *f_hat;           // intra phase, the gates' epilogue only: the K-tile's q̂, f̂ [64][kLdB] and γ [64],
  float* gamma;                // staged during the intra products (they fit in the inter tiles' room: no more bytes)
  float* Gs;                   // kScalar: G, one column [64] (G above then only holds dg's running sums)
  template <bool kScalar = false>
  __host__ __device__ static size_t carve(void* base, BwdDqkSmem* s) {
    Carver c(base);
    s->q = c.take<In>(kChunk * kLdB);
    s->k = c.take<In>(kChunk * kLdB);
    s->G = c.take<float>(kChunk * kLdB);
    s->Pq = c.take<float>(kChunk * TileLd<In>::acc);
    s->Pk = c.take<float>(kChunk * TileLd<In>::acc);
    s->seg = c.take<float>(4 * 64);
    s->rowsum = c.take<float>(64);
    s->dlast_part = c.take<float>(4 * 64);
    s->dk_last = c.take<float>(64);
    s->d_last = c.take<float>(64);
    if constexpr (kScalar) s->Gs = c.take<float>(kChunk);
    const size_t region = c.off;
    s->dO = c.take<In>(kChunk * TileLd<In>::in);
    s->Vt = c.take<In>(kChunk * TileLd<In>::in);
    s->Sp = c.take<In>(kTile * TileLd<In>::in);
    s->dS = c.take<In>(kTile * TileLd<In>::in);
    const size_t inter_end = c.off;
    c.off = region;
    s->dA = c.take<float>(kChunk * kLdD);
    s->hat = c.take<float>(std::is_same_v<In, float> ? 48 * kLdF : 0);
    s->q_hat = c.take<In>(kChunk * kLdB);
    s->f_hat = c.take<In>(kChunk * kLdB);
    s->gamma = c.take<float>(kTile);
    return inter_end > c.off ? inter_end : c.off;
  }
};

// Blocks per SM the register budget is set for: two for bf16 (its shared memory, ~108 KB, allows two); fp32 tiles
// take ~150 KB, so one, with registers to spare.
template <typename In> constexpr int kDqkBlocksPerSm = std::is_same_v<In, float> ? 1 : 2;

// dg's share from the 16-row groups after row r's (suffix), for row r of the group ending at row r_hi: all of it where
// no reset lies in rows r .. r_hi − 1, else none (a reset row's own dg is 0, and rows before a reset are in another
// segment than the later groups).
__device__ __forceinline__ float row_suffix(uint64_t resets, int r, int r_hi, float suffix) {
  return (resets >> r) & ((uint64_t{1} << (r_hi - r)) - 1) ? 0.f : suffix;
}

// Row r's dq, dk and dg at column a as bwd_dqk hands them out: the held-back diagonal terms dA_rr·k and dA_rr·q added,
// dk_inter_L on the chunk's last row (last_row), dg's later segments (suffix, from row_suffix), each onto old (an
// accumulated gradient). The default −0 is the additive identity that leaves every value's bits alone (+0 would turn a
// −0 into +0), so the compiler drops those adds where nothing accumulates.
struct RowGradients {
  float dq, dk, dg;
};
template <typename In>
__device__ __forceinline__ RowGradients row_gradients(const BwdDqkSmem<In>& s, int r, int a, bool last_row,
                                                      float suffix, float old_q = -0.f, float old_k = -0.f,
                                                      float old_g = -0.f) {
  constexpr int ldc = TileLd<In>::acc;
  const float diag = s.dA[r * kLdD + r];
  float dk = s.Pk[r * ldc + a] + diag * load_f(s.q[r * kLdB + a]);
  if (last_row) dk += s.dk_last[a];
  return {old_q + s.Pq[r * ldc + a] + diag * load_f(s.k[r * kLdB + a]), old_k + dk, old_g + s.G[r * kLdB + a] + suffix};
}

// The gates' epilogue's inputs for K-tile k0 of chunk block cb, by cp.async into their intra-phase buffers (the
// caller commits and, before the epilogue, waits): q̂ and f̂ of the chunk's rows, and γ. Read from global memory in
// the epilogue itself, each block waited out their latency there; staged here they land during the intra products
// (bwd_dqk −12 us a call at hgrn2-385m's shape on an H100). The buffers take room the inter tiles leave free, so the
// kernel's shared memory does not grow; ptxas now keeps one 4-byte value in local memory (around the staging
// fallback's call), which did not show in the timings.
template <typename In>
__device__ void stage_gate_inputs(const GlaGatesEpilogue& e, const BwdDqkSmem<In>& s, const Dims& d,
                                  const ChunkBlock& cb, int k0, int kcols) {
  const int64_t row0 = static_cast<int64_t>(cb.b) * d.T + cb.t0, channel = static_cast<int64_t>(cb.h) * d.K + k0;
  const In* q_hat = static_cast<const In*>(e.q_hat) + row0 * e.q_hat_stride + channel;
  const In* f_hat = static_cast<const In*>(e.f_hat) + row0 * e.f_hat_stride + channel;
  stage_tile(s.q_hat, kLdB, q_hat, e.q_hat_stride, cb.n, kcols, async_copyable<In>(q_hat, d.K, e.q_hat_stride, kLdB));
  stage_tile(s.f_hat, kLdB, f_hat, e.f_hat_stride, cb.n, kcols, async_copyable<In>(f_hat, d.K, e.f_hat_stride, kLdB));
  if (!e.gamma_row) return;
  const float* gamma = e.gamma_row + channel;
  if (kcols == kTile && reinterpret_cast<uintptr_t>(gamma) % 16 == 0) {
    if (threadIdx.x < kTile / 4) cp_async_16(shared_address(s.gamma + 4 * threadIdx.x), gamma + 4 * threadIdx.x);
  } else if (threadIdx.x < kcols) {
    s.gamma[threadIdx.x] = gamma[threadIdx.x];
  }
}

// bwd_dqk's epilogue with the gates' backward (GlaGatesEpilogue), on the rows this thread owns (column a of rows
// r_lo .. r_lo + rows − 1 of chunk c of pair (b, h), K-tile at k0): dq, dk and dg formed as write_rows forms them
// (never stored), then through the gates: df̂ = (dg − λ·dk)·∂g/∂f̂ and dq̂ = silu'(q̂)·dq, with
// cuda_hgrn2_gates_backward's per-element functions (hgrn2_gate_math.cuh, sigmoid.cuh), and the chunk's column sums
// of (dg − λ·dk)·∂g/∂γ into its row of the partials (this thread's rows in order, then the four row groups in order).
// q̂, f̂ and γ are read from their staged copies (stage_gate_inputs). Every thread of the block calls it (the
// partials' barrier); a thread past the K-tile's width has rows = 0.
template <typename In>
__device__ void write_gate_gradients(const BwdDqkParams& p, const BwdDqkSmem<In>& s, const ChunkBlock& cb, int k0,
                                     int kcols, int a, int rg, int rows, float suffix, uint64_t resets) {
  using namespace gate_math;
  const GlaGatesEpilogue& e = p.gates;
  const Dims& d = p.d;
  const int r_lo = rg * kSub, last = cb.n - 1;
  const int64_t channel = static_cast<int64_t>(cb.h) * d.K + k0 + a;
  float gamma = 0.f, log_gamma = 0.f, log_one_minus_gamma = 0.f;
  if (e.gamma_row && a < kcols) {
    gamma = s.gamma[a];
    log_gamma = logf(gamma);
    log_one_minus_gamma = log1pf(-gamma);
  }
  const int64_t row0 = static_cast<int64_t>(cb.b) * d.T + cb.t0 + r_lo;
  In* dq_hat = static_cast<In*>(e.dq_hat) + row0 * e.dq_hat_stride + channel;
  In* df_hat = static_cast<In*>(e.df_hat) + row0 * e.df_hat_stride + channel;
  float gamma_sum = 0.f;
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    if (i >= rows) break;
    const int r = r_lo + i;
    const float xq = load_f(s.q_hat[r * kLdB + a]), xf = load_f(s.f_hat[r * kLdB + a]);
    const auto [dq, dk, dg] = row_gradients(s, r, a, r == last, row_suffix(resets, r, r_lo + kSub, suffix));
    const ForgetGateGrad fg = forget_gate_grad<In>(xf, gamma, log_gamma, log_one_minus_gamma);
    float total = dg;
    total -= fg.lambda * dk;
    df_hat[i * e.df_hat_stride] = store_f<In>(total * fg.dg_df);
    gamma_sum += total * fg.dg_dgamma;
    dq_hat[i * e.dq_hat_stride] = store_f<In>(silu_backward_value(xq, stable_sigmoid<In>(xq), dq));
  }
  if (!e.partials) return;  // the same for the whole block: no thread misses the barrier
  s.dlast_part[rg * 64 + a] = gamma_sum;  // free since d_last was formed
  __syncthreads();
  if (rg == 0 && a < kcols) {
    const float* part = s.dlast_part + a;
    e.partials[(static_cast<int64_t>(cb.b) * d.NT + cb.c) * d.H * d.K + channel] =
        ((part[0] + part[64]) + part[128]) + part[192];
  }
}

// bwd_dqk's scalar-decay intra product: C += W X (kTransposed: Wᵀ X) with W the fp32 [64][kLdD] tile, zero on and
// above the diagonal, and X q or k ([64][kLdB]). bf16: on the tensor cores in TF32 (mma m16n8k8; X's bf16 values are
// exact in TF32, W is rounded to 2^-11, as the per-channel intra blocks round theirs), over only the depths where the
// warp's rows of W (of Wᵀ) can be nonzero. fp32: plain FMAs (tile_mma).
template <bool kTransposed, typename In>
__device__ void scalar_intra_product(WarpTile& C, const float* W, const In* X) {
  if constexpr (std::is_same_v<In, float>) {
    tile_mma<kTransposed, false>(C, W, kLdD, X, kLdB);
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
    // W k: row i needs depths j < i <= m0 + 15; Wᵀ q: column j needs depths i > j >= m0.
    const int d_lo = kTransposed ? m0 : 0, d_hi = kTransposed ? kChunk : m0 + kSub;
    auto w_at = [&](int r, int depth) { return to_tf32(kTransposed ? W[depth * kLdD + r] : W[r * kLdD + depth]); };
    for (int d0 = d_lo; d0 < d_hi; d0 += 8) {
      const uint32_t fa[4] = {w_at(m0 + g, d0 + t), w_at(m0 + g + 8, d0 + t), w_at(m0 + g, d0 + t + 4),
                              w_at(m0 + g + 8, d0 + t + 4)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = n0 + 8 * j + g;
        const uint32_t fb[2] = {__float_as_uint(load_f(X[(d0 + t) * kLdB + col])),
                                __float_as_uint(load_f(X[(d0 + t + 4) * kLdB + col]))};
        mma_tf32(C.c[j], fa, fb);
      }
    }
  }
}

template <typename In, bool kResets, bool kScalar>
__global__ void __launch_bounds__(kThreads, kDqkBlocksPerSm<In>) bwd_dqk_kernel(BwdDqkParams p) {
  extern __shared__ __align__(128) char smem[];
  BwdDqkSmem<In> s;
  BwdDqkSmem<In>::template carve<kScalar>(smem, &s);
  wait_for_previous_kernel();
  constexpr int ldi = TileLd<In>::in, ldc = TileLd<In>::acc;
  const Dims& d = p.d;
  // Plain variables, not a structured binding: the staging lambdas capture them (C++17).
  const ChunkBlock cb = chunk_block(d, blockIdx.y, blockIdx.z);
  const int c = cb.c, pair = cb.pair, b = cb.b, h = cb.h, t0 = cb.t0, n = cb.n;
  const int64_t key_stride = cb.key_stride, value_stride = cb.value_stride;
  const int k0 = blockIdx.x * kTile, kcols = min(kTile, d.K - k0), last = n - 1;
  const int64_t key_off = row_offset(d, b, t0, h, d.K) + k0;  // g's and dg's
  const int64_t chunk_index = static_cast<int64_t>(pair) * d.NT + c;
  const uint64_t resets = kResets ? chunk_resets(p.reset_masks, d, b, c) : 0;

  // q, k and g go to shared memory by cp.async: they land while the inter products run (the first V-tile's wait
  // covers them), and nothing reads them before the gate cumsum after those products.
  {
    const In* q = static_cast<const In*>(p.q) + strided_row_offset(d, b, t0, h, d.K, d.q_stride) + k0;
    const In* k = static_cast<const In*>(p.k) + strided_row_offset(d, b, t0, h, d.K, d.k_stride) + k0;
    const float* g = p.g + key_off;
    if constexpr (kScalar)
      stage_scalar_gates(s.Gs, p.g, p.decay_stride, d, b, t0, n, h);
    else
      stage_tile(s.G, kLdB, g, key_stride, n, kcols, async_copyable<float>(g, d.K, key_stride, kLdB));
    stage_tile(s.q, kLdB, q, d.q_stride, n, kcols, async_copyable<In>(q, d.K, d.q_stride, kLdB));
    stage_tile(s.k, kLdB, k, d.k_stride, n, kcols, async_copyable<In>(k, d.K, d.k_stride, kLdB));
  }

  // Inter-chunk products over the V-tiles: Pq = dO S_pᵀ, Pk = v dS_eᵀ, and rowsum(S_p ⊙ dS_e) (S_p as stored, in the
  // activation dtype; dS_e fp32). dO, v and S_p (copied as they are) go to shared memory by cp.async, saving the
  // registers of three tiles; fp32 state gradients pass through registers, whose values also feed the row sums (dg's
  // only). The first V-tile's dO, v and S_p travel with q, k and g, so that its wait overlaps the state gradients'
  // loads instead of following them. State gradients in the activation dtype (d_states_in_act: no dg is formed) go
  // by cp.async with the others, and the row sums are not formed.
  const In* d_out = p.d_output ? static_cast<const In*>(p.d_output) + row_offset(d, b, t0, h, d.V) : nullptr;
  const In* v = static_cast<const In*>(p.v) + strided_row_offset(d, b, t0, h, d.V, d.v_stride);
  const In* state = static_cast<const In*>(p.states) + chunk_index * d.K * d.V + static_cast<int64_t>(k0) * d.V;
  const bool do_async = async_copyable<In>(d_out, d.V, value_stride, ldi);
  const bool v_async = async_copyable<In>(v, d.V, d.v_stride, ldi);
  const bool state_async = async_copyable<In>(state, d.V, d.V, ldi);
  // One of the two is set: the state gradients in fp32 or in the activation dtype.
  const int64_t d_state_at = chunk_index * d.K * d.V + static_cast<int64_t>(k0) * d.V;
  const float* d_state = p.d_states_in_act ? nullptr : static_cast<const float*>(p.d_states) + d_state_at;
  const In* d_state_act = p.d_states_in_act ? static_cast<const In*>(p.d_states) + d_state_at : nullptr;
  const bool d_state_async = d_state_act && async_copyable<In>(d_state_act, d.V, d.V, ldi);
  auto stage_values = [&](int v0, int vcols) {
    stage_tile(s.dO, ldi, d_out ? d_out + v0 : d_out, value_stride, n, vcols, do_async);
    stage_tile(s.Vt, ldi, v + v0, d.v_stride, n, vcols, v_async);
    stage_tile(s.Sp, ldi, state + v0, d.V, kcols, vcols, state_async);
    if (d_state_act) stage_tile(s.dS, ldi, d_state_act + v0, d.V, kcols, vcols, d_state_async);
    cp_async_commit();
  };
  stage_values(0, min(kTile, d.V));
  float prod[4][4];  // this thread's share of S_p ⊙ dS_e summed over the V-tiles (TileVec layout)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) prod[i][u] = 0.f;
  for (int vt = 0; vt < d.nv; ++vt) {
    const int v0 = vt * kTile, vcols = min(kTile, d.V - v0);
    TileVec dsr;
    if (d_state) dsr.fetch(d_state + v0, d.V, kcols, vcols);
    if (vt > 0) {
      __syncthreads();  // the previous tile's products are done
      stage_values(v0, vcols);
    }
    if (d_state) dsr.commit(s.dS, ldi);
    cp_async_wait<0>();
    __syncthreads();
    if (d_state) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // S_p as staged (the activation dtype) times the fp32 dS_e
        float sp[4];
        load4(s.Sp + TileVec::row(i) * ldi + TileVec::col(), sp);
#pragma unroll
        for (int u = 0; u < 4; ++u) prod[i][u] = fmaf(sp[u], dsr.x[i][u], prod[i][u]);
      }
    }
    // Pq and Pk accumulate in shared memory between V-tiles (each thread rereads only its own elements): held in
    // registers across the loop they would push the kernel past its 128-register cap.
    auto accumulate = [&](float* P, const In* X, const In* Y) {
      WarpTile acc;
      if (vt == 0)
        acc.zero();
      else
        acc.load_shared(P, ldc);
      tile_mma<false, true>(acc, X, ldi, Y, ldi);
      acc.store_shared(P, ldc);
    };
    accumulate(s.Pq, s.dO, s.Sp);
    accumulate(s.Pk, s.Vt, s.dS);
  }
  // Row sums across the 64 columns: the thread's four, then the 16 lanes of the row by a fixed butterfly.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float x = (prod[i][0] + prod[i][1]) + (prod[i][2] + prod[i][3]);
    for (int offset = 8; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    if ((threadIdx.x & 15) == 0) s.rowsum[TileVec::row(i)] = x;
  }
  __syncthreads();  // inter tiles done (q, k, g landed with them): the region now holds the intra-phase buffers
  {
    TileVec dA_regs;  // in flight during the cumsum
    dA_regs.fetch(p.d_scores + chunk_index * kChunk * kChunk, kChunk, kChunk, kChunk);
    if constexpr (kScalar)
      scalar_cumsum(s.Gs, s.seg);
    else
      chunk_cumsum(s.G, kLdB, s.seg);
    dA_regs.commit(s.dA, kLdD);
  }
  __syncthreads();  // dA in place

  // From here thread (rg, a) owns column a of sub-chunk rg: rows r_lo .. r_lo + 15 of Pq, Pk (and of dg below).
  const int a = threadIdx.x & 63, rg = threadIdx.x >> 6, r_lo = rg * kSub;
  const float GL = kScalar ? s.Gs[kChunk - 1] : s.G[(kChunk - 1) * kLdB + a];
  if constexpr (kScalar) {
    // The inter terms on this thread's rows (the intra ones follow as products): Pq·s·e^{G_i}, dk_inter, d_last's
    // share, as below.
    float dl = 0.f;
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      const int r = r_lo + j;
      const float gr = s.Gs[r];
      s.Pq[r * ldc + a] *= !kResets || r < first_reset(resets) ? p.scale * exp2_fast(gr) : 0.f;
      const float dk_inter = (!kResets || r >= first_exiting(resets) ? exp2_fast(GL - gr) : 0.f) * s.Pk[r * ldc + a];
      if (r == last) {
        s.dk_last[a] = dk_inter;
        s.Pk[r * ldc + a] = 0.f;
      } else {
        s.Pk[r * ldc + a] = dk_inter;
        dl = fmaf(load_f(s.k[r * kLdB + a]), dk_inter, dl);
      }
    }
    s.dlast_part[rg * 64 + a] = dl;
  } else {
    // Intra, the diagonal block, strictly j < i (the j = i terms are held back), with the block's G, k and dk in
    // registers (fully unrolled) and dA_ij a broadcast read (one warp, one block). Pairs within one 8-row half:
    // each pair's dA_ij e^{G_i − G_j} is formed once and feeds both dq_i += (dA_ij e) k_j and dk_j += (dA_ij e) q_i.
    // Pairs across the halves (j < 8 <= i): the decay factored at the second half's first row n,
    // e^{G_i − G_j} = e^{G_i − G_n}·e^{G_n − G_j} (both exponents <= 0), so that these 64 pairs cost 16 exp2
    // instead of 64 (the multi-function unit bounds this loop): dq_i += e^{G_i − G_n} Σ_j dA_ij k̂_j and
    // dk_j += e^{G_n − G_j} Σ_i dA_ij q̌_i with k̂_j = k_j e^{G_n − G_j}, q̌_i = q_i e^{G_i − G_n}. Sums in ascending
    // j (dq) and i (dk). The inter terms are finished on the same rows: Pq·s·e^{G_i} and dk_inter = e^{G_L − G_j} ⊙ Pk.
    constexpr int kHalf = kSub / 2;
    float gk[kSub], kk[kSub], dk[kSub];
    float e_k[kHalf], across_k[kHalf];  // e^{G_n − G_j}, and dk_j's sums over the second half's rows
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      gk[j] = s.G[(r_lo + j) * kLdB + a];
      kk[j] = load_f(s.k[(r_lo + j) * kLdB + a]);
      dk[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      e_k[j] = exp2_fast(gk[kHalf] - gk[j]);
      across_k[j] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int r = r_lo + i;
      const float* dA_row = s.dA + r * kLdD + r_lo;  // 16-byte aligned: kLdD and r_lo are multiples of 4
      const float qi = load_f(s.q[r * kLdB + a]);
      float dq = 0.f, x4[4];
      if (i >= kHalf) {  // the pairs across the halves
        const float e_i = exp2_fast(gk[i] - gk[kHalf]), q_check = qi * e_i;
        float across_q = 0.f;
#pragma unroll
        for (int j = 0; j < kHalf; ++j) {
          if (j % 4 == 0) {
            const float4 t = *reinterpret_cast<const float4*>(dA_row + j);
            x4[0] = t.x, x4[1] = t.y, x4[2] = t.z, x4[3] = t.w;
          }
          const float x = x4[j % 4];
          across_q = fmaf(x * kk[j], e_k[j], across_q);
          across_k[j] = fmaf(x, q_check, across_k[j]);
        }
        dq = across_q * e_i;
      }
#pragma unroll
      for (int j = i < kHalf ? 0 : kHalf; j < i; ++j) {  // the pairs within i's half
        if (j % 4 == 0) {
          const float4 t = *reinterpret_cast<const float4*>(dA_row + j);
          x4[0] = t.x, x4[1] = t.y, x4[2] = t.z, x4[3] = t.w;
        }
        const float xe = x4[j % 4] * exp2_fast(gk[i] - gk[j]);  // dA_ij e, shared by both sums
        dq = fmaf(xe, kk[j], dq);
        dk[j] = fmaf(xe, qi, dk[j]);
      }
      // S_p reaches only the rows before the chunk's first reset.
      s.Pq[r * ldc + a] =
          s.Pq[r * ldc + a] * (!kResets || r < first_reset(resets) ? p.scale * exp2_fast(gk[i]) : 0.f) + dq;
    }
#pragma unroll
    for (int j = 0; j < kHalf; ++j) dk[j] = fmaf(e_k[j], across_k[j], dk[j]);
    float dl = 0.f;  // Σ_{j<L} k_j ⊙ dk_inter_j over these rows
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      const int r = r_lo + j;
      // Only the keys from the chunk's last reset on reach dS_e.
      const float dk_inter =
          (!kResets || r >= first_exiting(resets) ? exp2_fast(GL - gk[j]) : 0.f) * s.Pk[r * ldc + a];
      if (r == last) {
        s.dk_last[a] = dk_inter;
        s.Pk[r * ldc + a] = dk[j];
      } else {
        s.Pk[r * ldc + a] = dk_inter + dk[j];
        dl = fmaf(kk[j], dk_inter, dl);
      }
    }
    s.dlast_part[rg * 64 + a] = dl;
  }
  if (!kScalar && p.gates.q_hat) {  // in flight until the epilogue; the block's coordinates formed again
    stage_gate_inputs<In>(p.gates, s, d, chunk_block(d, blockIdx.y, blockIdx.z), k0, kcols);
    cp_async_commit();
  }
  // Intra, blocks below the diagonal.
  if constexpr (kScalar) {
    // W = dA ⊙ e^{G_i − G_j} strictly below the diagonal, in place; dA_ii (held back) stays in thread i's register
    // and goes back for row_gradients. Then Pq += W k, Pk += Wᵀ q.
    const int tid = threadIdx.x;
    const float diag = tid < kChunk ? s.dA[tid * kLdD + tid] : 0.f;
    __syncthreads();  // the inter terms are in Pq and Pk; the diagonal is read
    for (int idx = tid; idx < kChunk * kChunk; idx += kThreads) {
      const int i = idx >> 6, j = idx & 63;
      float& w = s.dA[i * kLdD + j];
      w = j < i ? w * exp2_fast(s.Gs[i] - s.Gs[j]) : 0.f;
    }
    __syncthreads();
    WarpTile acc;
    acc.load_shared(s.Pq, ldc);
    scalar_intra_product<false>(acc, s.dA, s.k);
    acc.store_shared(s.Pq, ldc);
    acc.load_shared(s.Pk, ldc);
    scalar_intra_product<true>(acc, s.dA, s.q);
    acc.store_shared(s.Pk, ldc);
    __syncthreads();  // W is read
    if (tid < kChunk) s.dA[tid * kLdD + tid] = diag;
  } else if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    // On the tensor cores, eight jobs of equal depth: warp w does dq (w even) or dk (w odd) for columns 32·((w/2)%2)
    // onward of sub-chunk 3 (dq; keys 0..47) or 0 (dk; queries 16..63) when w < 4, else of sub-chunks 2 then 1
    // (dq), 1 then 2 (dk).
    __syncthreads();  // the diagonal blocks' sums are in Pq and Pk
    const int w = threadIdx.x >> 5, col0 = 32 * ((w >> 1) & 1);
    const bool is_dk = w & 1;
    for (int job = 0; job < (w < 4 ? 1 : 2); ++job) {
      const int r = w < 4 ? 3 : 2 - job;  // query sub-chunk (dq); the key sub-chunk of dk is 3 − r
      if (is_dk)
        intra_block_tf32<true>(s.Pk, ldc, s.dA, s.q, s.G, 3 - r, col0, kSub * (4 - r), kChunk);
      else
        intra_block_tf32<false>(s.Pq, ldc, s.dA, s.k, s.G, r, col0, 0, kSub * r);
    }
  } else {
    // fp32 SIMT. Round r: query sub-chunk r against keys j < 16r (reference G_{16r}), and key
    // sub-chunk r − 1 against queries i >= 16r (reference G_{16r − 1}).
    for (int r = 1; r < kChunk / kSub; ++r) {
      const int a0 = r * kSub;
      __syncthreads();  // hat free
      for (int idx = threadIdx.x; idx < a0 * kTile; idx += kThreads) {
        const int j = idx >> 6, col = idx & 63;
        s.hat[j * kLdF + col] = load_f(s.k[j * kLdB + col]) * exp2_fast(s.G[a0 * kLdB + col] - s.G[j * kLdB + col]);
      }
      __syncthreads();
      {  // the thread's four query rows a0 + rg + 4m side by side: one K̂ read feeds four independent sums
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < a0; ++j) {
          const float kh = s.hat[j * kLdF + a];
#pragma unroll
          for (int m = 0; m < 4; ++m) sum[m] = fmaf(s.dA[(a0 + rg + 4 * m) * kLdD + j], kh, sum[m]);
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int i = a0 + rg + 4 * m;
          s.Pq[i * ldc + a] += exp2_fast(s.G[i * kLdB + a] - s.G[a0 * kLdB + a]) * sum[m];
        }
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < (kChunk - a0) * kTile; idx += kThreads) {
        const int i = idx >> 6, col = idx & 63;
        s.hat[i * kLdF + col] =
            load_f(s.q[(a0 + i) * kLdB + col]) * exp2_fast(s.G[(a0 + i) * kLdB + col] - s.G[(a0 - 1) * kLdB + col]);
      }
      __syncthreads();
      {  // likewise the four key rows a0 − 16 + rg + 4m
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        for (int i = a0; i < kChunk; ++i) {
          const float qh = s.hat[(i - a0) * kLdF + a];
#pragma unroll
          for (int m = 0; m < 4; ++m) sum[m] = fmaf(s.dA[i * kLdD + a0 - kSub + rg + 4 * m], qh, sum[m]);
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int j = a0 - kSub + rg + 4 * m;
          s.Pk[j * ldc + a] += exp2_fast(s.G[(a0 - 1) * kLdB + a] - s.G[j * kLdB + a]) * sum[m];
        }
      }
    }
  }
  if (threadIdx.x < 64) {
    float total = resets ? 0.f : exp2_fast(GL) * s.rowsum[a];  // S_p reaches dS_e only through a chunk without resets
    for (int part = 0; part < 4; ++part) total += s.dlast_part[part * 64 + a];
    s.d_last[a] = total;
  }
  __syncthreads();

  // dg: reverse cumulative sum of q ⊙ dq − k ⊙ dk plus d_last, by 16-row segments (thread: segment rg, column a);
  // the running sums go into G, which is no longer needed. With resets the sum restarts at each reset row (whose dg
  // is 0), a group passes on only its rows before its first reset (seg), and the groups after a group with a reset,
  // and d_last, reach no row before that reset.
  const int r_hi = r_lo + kSub;
  float run = 0.f;
#pragma unroll 4
  for (int u = kSub - 1; u >= 0; --u) {  // a constant trip count (see chunk_cumsum)
    const int i = r_lo + u;
    run += load_f(s.q[i * kLdB + a]) * s.Pq[i * ldc + a] - load_f(s.k[i * kLdB + a]) * s.Pk[i * ldc + a];
    if (kResets && (resets >> i) & 1) run = 0.f;
    s.G[i * kLdB + a] = run;
  }
  s.seg[rg * 64 + a] = run;
  cp_async_wait<0>();  // the gates' epilogue's inputs (stage_gate_inputs) have landed
  __syncthreads();
  int stop = 4;  // the first later group holding a reset (4: none)
  if constexpr (kResets)
    for (int later = rg + 1; later < 4 && stop == 4; ++later)
      if ((resets >> (kSub * later)) & 0xffffu) stop = later;
  float suffix = stop == 4 ? s.d_last[a] : 0.f;
  for (int later = min(stop, 3); later > rg; --later) suffix += s.seg[later * 64 + a];

  // Into the gradients. The usual case, a whole 16-row segment into the step's fresh gradient buffers (all three
  // wanted, none accumulated), runs without per-row tests or old values: those tests and loads, unrolled over the 16
  // rows, were a fifth of the kernel's instructions. Otherwise all old values are loaded before anything is stored
  // (see TileRegs), two rounds of 8 rows keeping 24 of them live instead of 48 (the kernel is at its register cap).
  const int rows = a < kcols ? max(0, min(r_hi, n) - r_lo) : 0;
  if constexpr (kScalar) {
    if (p.dg) {  // block-uniform
      // Row r's dg: the channels' dg (as the per-channel mode has them) summed over the K-tile, in a fixed order
      // rotated by the row (no bank conflicts). Padding channels add exact zeros (their q, k, S_p and dS_e rows are 0).
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
        const int r = r_lo + i;
        s.G[r * kLdB + a] += kResets ? row_suffix(resets, r, r_hi, suffix) : suffix;
      }
      __syncthreads();
      if (threadIdx.x < n) {
        const int r = threadIdx.x;
        float sum = 0.f;
        for (int u = 0; u < kTile; ++u) sum += s.G[r * kLdB + ((u + r) & (kTile - 1))];
        const int64_t at = static_cast<int64_t>(b * d.T + t0 + r) * d.H + h;
        if (d.nk > 1)
          p.dg_partials[static_cast<int64_t>(blockIdx.x) * gridDim.z * d.T + at] = sum;
        else
          p.dg[at] = p.accumulate_dg ? p.dg[at] + sum : sum;
      }
    }
  } else {
    if (p.gates.q_hat) {
      write_gate_gradients<In>(p, s, chunk_block(d, blockIdx.y, blockIdx.z), k0, kcols, a, rg, rows, suffix, resets);
      return;
    }
  }
  // Row r_lo's element of column a in each (dq and dk row-strided, dg contiguous), and their row strides.
  In* dq = p.dq ? static_cast<In*>(p.dq) + strided_row_offset(d, b, t0 + r_lo, h, d.K, p.dq_stride) + k0 + a : nullptr;
  In* dk = p.dk ? static_cast<In*>(p.dk) + strided_row_offset(d, b, t0 + r_lo, h, d.K, p.dk_stride) + k0 + a : nullptr;
  // kScalar: dg was written above.
  float* dg = !kScalar && p.dg ? p.dg + key_off + static_cast<int64_t>(r_lo) * key_stride + a : nullptr;
  const int64_t dq_stride = p.dq_stride, dk_stride = p.dk_stride, dg_stride = key_stride;
  auto write_rows = [&](auto general_case) {
    constexpr bool kGeneral = decltype(general_case)::value;
#pragma unroll
    for (int half = 0; half < kSub; half += kSub / 2) {
      float old_q[kSub / 2] = {}, old_k[kSub / 2] = {}, old_g[kSub / 2] = {};
      if constexpr (kGeneral) {
#pragma unroll
        for (int u = 0; u < kSub / 2; ++u) {
          const int i = half + u;
          const bool in = i < rows;
          if (in && dq && p.accumulate_dq) old_q[u] = load_f(dq[i * dq_stride]);
          if (in && dk && p.accumulate_dk) old_k[u] = load_f(dk[i * dk_stride]);
          if (in && dg && p.accumulate_dg) old_g[u] = dg[i * dg_stride];
        }
      }
#pragma unroll
      for (int u = 0; u < kSub / 2; ++u) {
        const int i = half + u;
        if (kGeneral && i >= rows) break;
        const int r = r_lo + i;
        // A whole segment can hold the chunk's last row only as its own last row.
        const RowGradients grads =
            row_gradients(s, r, a, (kGeneral || i == kSub - 1) && r == last,
                          kResets ? row_suffix(resets, r, r_hi, suffix) : suffix, old_q[u], old_k[u], old_g[u]);
        if (!kGeneral || dq) dq[i * dq_stride] = store_f<In>(grads.dq);
        if (!kGeneral || dk) dk[i * dk_stride] = store_f<In>(grads.dk);
        if (!kScalar && (!kGeneral || dg)) dg[i * dg_stride] = grads.dg;
      }
    }
  };
  if (rows == kSub && dq && dk && (kScalar || dg) && !p.accumulate_dq && !p.accumulate_dk &&
      (kScalar || !p.accumulate_dg))
    write_rows(std::false_type{});
  else
    write_rows(std::true_type{});
}

// ---------------------------------------------------------------------------------------------------------------------
// Host side.

// A row stride as the kernels take it: 0 is the contiguous one, the row's width.
int row_stride(int64_t stride, int64_t width, const char* name) {
  if (!stride) stride = width;
  HGRN_CHECK(stride >= width && stride <= 0x7fffffff, "gla_recurrence CUDA: ", name, "'s row stride ", stride,
             " is narrower than its width ", width, " or too wide");
  return static_cast<int>(stride);
}

Dims make_dims(const GlaCudaShape& shape, const GlaCudaRowStrides& strides) {
  HGRN_CHECK(shape.batch > 0 && shape.time > 0 && shape.heads > 0 && shape.key_dim > 0 && shape.value_dim > 0,
             "gla_recurrence CUDA: empty shape");
  HGRN_CHECK(shape.key_dim <= kMaxKey, "gla_recurrence CUDA: key dim ", shape.key_dim, " > ", kMaxKey, " is not supported");
  HGRN_CHECK(shape.batch * shape.heads <= 65535, "gla_recurrence CUDA: batch·heads ", shape.batch * shape.heads,
             " exceeds the grid limit 65535");
  HGRN_CHECK((shape.time + kChunk - 1) / kChunk <= 65535 && shape.value_dim < (int64_t{1} << 20),
             "gla_recurrence CUDA: sequence or value dim too large (at most 65535 chunks of 64)");
  Dims d;
  d.T = static_cast<int>(shape.time);
  d.H = static_cast<int>(shape.heads);
  d.K = static_cast<int>(shape.key_dim);
  d.V = static_cast<int>(shape.value_dim);
  d.NT = (d.T + kChunk - 1) / kChunk;
  d.nk = (d.K + kTile - 1) / kTile;
  d.nv = (d.V + kTile - 1) / kTile;
  d.key_pad = d.nk * kTile;
  HGRN_CHECK(shape.batch * shape.time <= 0x7fffffff, "gla_recurrence CUDA: B·T ", shape.batch * shape.time,
             " is too large");
  const int64_t hk = static_cast<int64_t>(d.H) * d.K, hv = static_cast<int64_t>(d.H) * d.V;
  d.q_stride = row_stride(strides.q, hk, "q");
  d.k_stride = row_stride(strides.k, hk, "k");
  d.v_stride = row_stride(strides.v, hv, "v");
  return d;
}

// Launches `kernel` with `bytes` of dynamic shared memory (raising the kernel's limit past the 48 KB default once), as
// a programmatic dependent of the kernel before it where that is supported, else in plain stream order. Every kernel
// launched here keeps the rule in dependent_launch.cuh, as laid out above allow_dependent_launch's first use.
template <typename... Args>
void launch(void (*kernel)(Args...), dim3 grid, size_t bytes, const char* name, Args... args) {
  static_assert(sizeof...(Args) == 1, "one parameter struct");
  const size_t optin = cuda_device_properties().sharedMemPerBlockOptin;
  HGRN_CHECK(bytes <= optin, "gla_recurrence CUDA: ", name, " needs ", bytes, " bytes of shared memory, the device has ", optin);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  launch_as_dependent(kernel, grid, dim3(kThreads), bytes, args...);
  CUDA_CHECK_LAUNCH(name);
}

// How many rounds `blocks` blocks of `kernel` take to pass through the GPU (`bytes` is fixed per kernel).
template <auto kernel>
int64_t waves(int64_t blocks, size_t bytes) {
  const int64_t slots = resident_blocks<kernel>(kThreads, bytes);
  return (blocks + slots - 1) / slots;
}

// The launches of one dtype. Grids: state pass (K-tiles, V-tiles, pairs); per-chunk kernels (chunks, pairs), and
// bwd_dqk (K-tiles, chunks, pairs).
template <typename In, bool kResets, bool kScalar>
struct Launcher {
  const Dims d;
  const unsigned pairs;

  // The pass is sequential over the chunks, so it takes (waves of blocks) x (one block's time). For bf16, three
  // blocks fit on an SM, but each then runs slower (the pass is bound by instruction issue and latency, capped at
  // 80 registers): the three-block build runs only where it takes off a wave (hgrn2-150m: B·H = 96, 384 blocks:
  // two waves of 264 on an H200, one of 396), else the two-block one (measured: no gain at equal waves). Where the
  // V-tiles pair up, a block takes two V-tiles (reading x and g once for both: half the blocks, ~30% less traffic)
  // where that takes off a wave (hgrn2-385m's B·H = 128: 512 blocks, two waves, then one), or where the paired
  // blocks fit one to an SM (B·H = 64, the peer's benchmark shape: 128 blocks, ~10 us faster a pass on an H200
  // than 256 two to an SM), there built without the two-block register cap (~200 registers instead of 128: another
  // ~4 us; a third cp.async stage did not help). Not at equal waves otherwise: at B·H = 96 (hgrn2-150m) 192 paired
  // blocks, one or two to an SM, ran the recurrence 1.5% slower than 384 three to an SM.
  template <bool REVERSE>
  void state_pass(const StatePassParams& p) const {
    const char* name = REVERSE ? "gla_state_pass_reverse" : "gla_state_pass";
    StatePassSmem<In, 1, kScalar> s1;
    const size_t bytes = StatePassSmem<In, 1, kScalar>::carve(nullptr, &s1);
    const int64_t blocks = static_cast<int64_t>(d.nk) * d.nv * pairs;
    if constexpr (!std::is_same_v<In, float>) {
      StatePassSmem<In, 2, kScalar> s2;
      const size_t bytes2 = StatePassSmem<In, 2, kScalar>::carve(nullptr, &s2);
      const int64_t waves2 = waves<state_pass_kernel<In, REVERSE, 2, 1, kResets, kScalar>>(blocks, bytes);
      const int64_t waves3 = waves<state_pass_kernel<In, REVERSE, 3, 1, kResets, kScalar>>(blocks, bytes);
      if (d.nv % 2 == 0) {
        const dim3 paired_grid(d.nk, d.nv / 2, pairs);
        if (blocks / 2 <= cuda_device_properties().multiProcessorCount) {  // one to an SM: no two-block register cap
          launch(state_pass_kernel<In, REVERSE, 1, 2, kResets, kScalar>, paired_grid, bytes2, name, p);
          return;
        }
        if (waves<state_pass_kernel<In, REVERSE, 2, 2, kResets, kScalar>>(blocks / 2, bytes2) <
            std::min(waves2, waves3)) {
          launch(state_pass_kernel<In, REVERSE, 2, 2, kResets, kScalar>, paired_grid, bytes2, name, p);
          return;
        }
      }
      if (waves3 < waves2) {
        launch(state_pass_kernel<In, REVERSE, 3, 1, kResets, kScalar>, dim3(d.nk, d.nv, pairs), bytes, name, p);
        return;
      }
    }
    launch(state_pass_kernel<In, REVERSE, 2, 1, kResets, kScalar>, dim3(d.nk, d.nv, pairs), bytes, name, p);
  }
  void fwd_output(const FwdOutputParams& p) const {
    FwdOutputSmem<In, kScalar> s;
    launch(fwd_output_kernel<In, kResets, kScalar>, dim3(d.NT, pairs),
           FwdOutputSmem<In, kScalar>::carve(nullptr, d.key_pad, &s), "gla_fwd_output", p);
  }
  void bwd_dv(const BwdDvParams& p) const {
    BwdDvSmem<In> s;
    launch(bwd_dv_kernel<In, kResets, kScalar>, dim3(d.NT, pairs),
           BwdDvSmem<In>::carve(nullptr, d.key_pad, bwd_dv_state_tiles(p), &s), "gla_bwd_dv", p);
  }
  void bwd_dqk(const BwdDqkParams& p) const {
    BwdDqkSmem<In> s;
    launch(bwd_dqk_kernel<In, kResets, kScalar>, dim3(d.nk, d.NT, pairs),
           BwdDqkSmem<In>::template carve<kScalar>(nullptr, &s), "gla_bwd_dqk", p);
  }
};

// dg[i] (+)= Σ_kt partials[kt·outputs + i] for i < outputs, the K-tiles in order: a scalar decay's gradient from
// bwd_dqk's per-K-tile sums.
__global__ void sum_key_tiles_kernel(const float* partials, float* dg, long long outputs, int tiles, bool accumulate) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= outputs) return;
  float sum = partials[i];
  for (int kt = 1; kt < tiles; ++kt) sum += partials[kt * outputs + i];
  dg[i] = accumulate ? dg[i] + sum : sum;
}

// g's row stride in the scalar-decay mode: [B·T, H] or [H].
int decay_stride(GlaDecay decay, const Dims& d) { return decay == GlaDecay::PerStep ? d.H : 0; }

template <typename In, bool kResets, bool kScalar>
void forward_impl(const Dims& d, unsigned pairs, const GlaCudaForwardArgs& a) {
  const Launcher<In, kResets, kScalar> launcher{d, pairs};
  const int ds = decay_stride(a.decay, d);
  const StatePassParams sp{a.k,  a.v, d.v_stride,    a.g,     a.initial_state, a.states,     true,
                           ds,   a.final_state, nullptr, 1.0f, d, a.reset_masks};
  launcher.template state_pass<false>(sp);
  launcher.fwd_output(
      FwdOutputParams{a.q, a.k, a.v, a.g, a.states, a.scale, ds, a.output, a.scores, d, a.reset_masks});
}

template <typename In, bool kResets, bool kScalar>
void backward_impl(const Dims& d, unsigned pairs, const GlaCudaBackwardArgs& a) {
  const Launcher<In, kResets, kScalar> launcher{d, pairs};
  const int ds = decay_stride(a.decay, d);
  const int64_t key_width = static_cast<int64_t>(d.H) * d.K, value_width = static_cast<int64_t>(d.H) * d.V;
  const bool need_dqk = a.dq || a.dk || a.dg || a.gates.q_hat;
  if (need_dqk && !a.states_given) {  // S^(c), recomputed as the forward stored them: only dq, dk and dg read them
    const StatePassParams sp{a.k, a.v,     d.v_stride, a.g,  a.initial_state, a.states,     true,
                             ds,  nullptr, nullptr,    1.0f, d,               a.reset_masks};
    launcher.template state_pass<false>(sp);
  }
  const bool d_states_in_act = gla_cuda_state_gradients_dtype(a) != DType::F32;
  const StatePassParams dsp{a.q,       a.d_output,      static_cast<int64_t>(d.H) * d.V, a.g,     a.d_final_state,
                            a.d_states, d_states_in_act, ds,                              nullptr, a.d_initial_state,
                            a.scale,    d,               a.reset_masks};
  launcher.template state_pass<true>(dsp);
  if (need_dqk || a.dv)
    launcher.bwd_dv(BwdDvParams{a.k, a.v, a.g, a.d_output, a.d_states, a.scores, a.dv, a.d_scores, a.reset_masks, d,
                                a.scale, row_stride(a.strides.dv, value_width, "dv"), a.accumulate_dv,
                                a.decay == GlaDecay::PerStep, d_states_in_act});
  if (!need_dqk) return;
  GlaGatesEpilogue gates = a.gates;
  for (int64_t* stride : {&gates.q_hat_stride, &gates.f_hat_stride, &gates.dq_hat_stride, &gates.df_hat_stride})
    if (!*stride) *stride = key_width;
  if (!gates.dgamma_row) gates.partials = nullptr;
  // kScalar with several K-tiles: each K-tile's share of dg apart, added up below.
  const bool dg_split = kScalar && a.dg && d.nk > 1;
  launcher.bwd_dqk(BwdDqkParams{a.q, a.k, a.v, a.g, a.d_output, a.states, a.d_states, a.d_scores, a.scale, ds, a.dq,
                                a.dk, a.dg, row_stride(a.strides.dq, key_width, "dq"),
                                row_stride(a.strides.dk, key_width, "dk"), a.accumulate_dq, a.accumulate_dk,
                                a.accumulate_dg, d, gates, a.reset_masks, dg_split ? a.dg_partials : nullptr,
                                d_states_in_act});
  if (dg_split) {
    const long long outputs = static_cast<long long>(pairs) * d.T;
    constexpr int kSumThreads = 256;
    sum_key_tiles_kernel<<<static_cast<unsigned>((outputs + kSumThreads - 1) / kSumThreads), kSumThreads, 0,
                           cuda_stream()>>>(a.dg_partials, a.dg, outputs, d.nk, a.accumulate_dg);
    CUDA_CHECK_LAUNCH("gla_dg_sum_key_tiles");
  }
  if (gates.partials)  // the chunks' partial sums into γ's gradient, in chunk order
    add_chunk_sums<8>(gates.partials, gates.dgamma_row, static_cast<long long>(pairs / d.H) * d.NT, key_width,
                      "hgru2_gates_dgamma_reduce");
}

}  // namespace

int64_t gla_cuda_states_elements(const GlaCudaShape& s) {
  return s.batch * s.heads * ((s.time + kChunk - 1) / kChunk) * s.key_dim * s.value_dim;
}

int64_t gla_cuda_gate_partials_elements(const GlaCudaShape& s) {
  return s.batch * ((s.time + kChunk - 1) / kChunk) * s.heads * s.key_dim;
}

int64_t gla_cuda_scores_elements(const GlaCudaShape& s) {
  return s.batch * s.heads * ((s.time + kChunk - 1) / kChunk) * kChunk * kChunk;
}

int64_t gla_cuda_dg_partials_elements(const GlaCudaShape& s) {
  const int64_t key_tiles = (s.key_dim + kTile - 1) / kTile;
  return key_tiles > 1 ? key_tiles * s.batch * s.time * s.heads : 0;
}

void gla_cuda_forward(const GlaCudaShape& shape, const GlaCudaForwardArgs& args) {
  const Dims d = make_dims(shape, args.strides);
  HGRN_CHECK(args.q && args.k && args.v && args.g && args.output && args.final_state && args.states,
             "gla_cuda_forward: missing tensor");
  const unsigned pairs = static_cast<unsigned>(shape.batch * shape.heads);
  const bool scalar = args.decay != GlaDecay::PerChannel;
  HGRN_CUDA_DISPATCH_ACT(args.act, "gla_cuda_forward", [&] {
    if (args.reset_masks)
      scalar ? forward_impl<act_t, true, true>(d, pairs, args) : forward_impl<act_t, true, false>(d, pairs, args);
    else
      scalar ? forward_impl<act_t, false, true>(d, pairs, args) : forward_impl<act_t, false, false>(d, pairs, args);
  });
}

DType gla_cuda_state_gradients_dtype(const GlaCudaBackwardArgs& args) {
  return args.dg || args.gates.q_hat ? DType::F32 : args.act;
}

void gla_cuda_backward(const GlaCudaShape& shape, const GlaCudaBackwardArgs& args) {
  const Dims d = make_dims(shape, args.strides);
  HGRN_CHECK(args.q && args.k && args.v && args.g && args.scores && args.d_states && args.d_scores,
             "gla_cuda_backward: missing tensor");
  const bool scalar = args.decay != GlaDecay::PerChannel;
  HGRN_CHECK(args.decay != GlaDecay::PerHead || !args.dg, "gla_cuda_backward: a per-head g takes no gradient");
  HGRN_CHECK(!args.dg || !scalar || d.nk == 1 || args.dg_partials,
             "gla_cuda_backward: a scalar g's gradient with K > 64 needs dg_partials");
  HGRN_CHECK(!scalar || !args.gates.q_hat, "gla_cuda_backward: the gates epilogue comes with per-channel gates");
  const GlaGatesEpilogue& e = args.gates;
  HGRN_CHECK(args.states || !(args.dq || args.dk || args.dg || e.q_hat),
             "gla_cuda_backward: dq, dk, dg (or the gates' gradients) need the states buffer");
  if (e.q_hat) {
    HGRN_CHECK(!args.dq && !args.dk && !args.dg,
               "gla_cuda_backward: with the gates epilogue, dq, dk and dg are not formed: pass them null");
    HGRN_CHECK(e.f_hat && e.dq_hat && e.df_hat, "gla_cuda_backward: the gates epilogue needs f_hat, dq_hat, df_hat");
    HGRN_CHECK(!e.dgamma_row || (e.gamma_row && e.partials),
               "gla_cuda_backward: the gates epilogue's dgamma_row needs gamma_row and partials");
    const int64_t key_width = shape.heads * shape.key_dim;
    for (int64_t stride : {e.q_hat_stride, e.f_hat_stride, e.dq_hat_stride, e.df_hat_stride})
      HGRN_CHECK(stride == 0 || stride >= key_width, "gla_cuda_backward: a gates row stride ", stride,
                 " is narrower than H·K = ", key_width);
  }
  const unsigned pairs = static_cast<unsigned>(shape.batch * shape.heads);
  HGRN_CUDA_DISPATCH_ACT(args.act, "gla_cuda_backward", [&] {
    if (args.reset_masks)
      scalar ? backward_impl<act_t, true, true>(d, pairs, args) : backward_impl<act_t, true, false>(d, pairs, args);
    else
      scalar ? backward_impl<act_t, false, true>(d, pairs, args) : backward_impl<act_t, false, false>(d, pairs, args);
  });
}

}  // namespace hgrn
