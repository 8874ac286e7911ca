// rmsnorm.cu: RMSNorm forward and backward (rmsnorm.h), llm.c-style.
// Rows up to 256 16-byte packs wide (2048 bf16 or 1024 fp32 values: the model's D) take one warp per row, a lane
// owning the same 16-byte packs of every row: the row statistics (Σx², Σ dy·w·x̂) are warp shuffles, the rows arrive
// in shared memory by cp.async one row ahead (RowStage) and are read there twice, around the statistic, and the
// backward folds the weight gradient into the same pass (each lane sums its columns' dy ⊙ x̂ in its warp's row of
// shared memory).
// Other widths or unaligned views take one block per row (loops, block reductions) and a separate weight-gradient
// pass. Either way the weight gradient Σ_rows dy ⊙ x̂ is summed without atomics, in fixed chunks of rows into an fp32
// scratch [chunks, width] and then over the chunks in order, so its bits depend only on the shape and path taken.
#include <algorithm>

#include "core/tensor.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "chunk_sums.cuh"
#include "column_sums.cuh"
#include "cp_async.cuh"
#include "elementwise.cuh"
#include "fp8_codes.cuh"
#include "rmsnorm.h"
#include "row_sums.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {
// The op's output element x̂ · w = (x · rstd) · w, w = 1 without a weight (exact), as every kernel here writes it: the
// forwards, and the backwards that write it again for a caller that freed it, so all give the same bits.
__device__ __forceinline__ float normalized(float x, float rstd, float w) { return x * rstd * w; }

// The gated forms' gate (RmsnormGate) as the warp kernels take it; gate null: no gate.
template <typename T>
struct GateRows {
  const T* gate = nullptr;
  T* dgate = nullptr;
  long long stride = 0, dgate_stride = 0;
  int groups = 1, width = 0;  // norm rows per gate row, and their width
  bool add = false;
  Fp8CodesOut codes;  // the gated output as FP8 codes in place of y, where codes.codes is set
  // Where norm row `row` starts in a gate-shaped array whose rows are `s` elements apart.
  __device__ long long offset(long long row, long long s) const {
    return (row / groups) * s + (row % groups) * (long long)width;
  }
};

// The gated output silu(g) · n (sigmoid_g = σ(g)), in swiglu's order of products.
__device__ __forceinline__ float gated_output(float g, float sigmoid_g, float n) { return g * sigmoid_g * n; }

// A row per block (grid-striding over rows).
template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const float* w, T* y, float* rstd, long long rows, int width,
                                       float eps) {
  __shared__ float warp_sums[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = row * width;
    const T* xr = x + base;
    float sum_sq = 0.f;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      const float v = load_f(xr[c]);
      sum_sq += v * v;
    }
    const float s = 1.f / sqrtf(block_sum(sum_sq, warp_sums) / (float)width + eps);
    if (threadIdx.x == 0) rstd[row] = s;
    for (int c = threadIdx.x; c < width; c += blockDim.x)
      y[base + c] = store_f<T>(normalized(load_f(xr[c]), s, w ? w[c] : 1.f));
  }
}

// g = s · (dy ⊙ w − x̂ · mean(dy ⊙ w ⊙ x̂)) per row, into dx (null: not wanted; add: accumulate, else overwrite).
// y non-null: the forward's output x̂ · w written again.
template <typename T>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const float* w, const float* rstd, const T* dy, T* dx, bool add,
                                           T* y, long long rows, int width) {
  __shared__ float warp_sums[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = row * width;
    const float s = rstd[row];
    float mean_dot = 0.f;
    if (dy) {
      float dot = 0.f;
      for (int c = threadIdx.x; c < width; c += blockDim.x)
        dot += load_f(dy[base + c]) * (w ? w[c] : 1.f) * load_f(x[base + c]) * s;
      mean_dot = block_sum(dot, warp_sums) / (float)width;
    }
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      if (dx) {
        const float g = s * (load_f(dy[base + c]) * (w ? w[c] : 1.f) - load_f(x[base + c]) * s * mean_dot);
        dx[base + c] = store_f<T>(add ? load_f(dx[base + c]) + g : g);
      }
      if (y) y[base + c] = store_f<T>(normalized(load_f(x[base + c]), s, w ? w[c] : 1.f));
    }
  }
}

// The block path's weight-gradient term for column_sums.cuh: dy ⊙ x̂ at (row, column).
template <typename T>
struct DweightTerm {
  const T* x;
  const float* rstd;
  const T* dy;
  int width;
  __device__ float operator()(long long r, int c) const {
    return load_f(dy[r * width + c]) * load_f(x[r * width + c]) * rstd[r];
  }
};

// The second pass (dw[c] += Σ_chunks partial[chunk, c]) is chunk_sums.cuh's, with 16 lanes.
constexpr int kFinalLanes = 16;

// ---- one warp per row (at most kMaxWarpPacks packs per lane, width a multiple of the pack, 16-byte aligned) ----
// Lane l holds packs l, l + 32, …, l + 32 (P − 1) of its row (coalesced: a warp's p-th access is 512 contiguous
// bytes); packs past the row's end are skipped.
constexpr int kMaxWarpPacks = 8;      // 64 bf16 or 32 fp32 values per lane: rows up to 2048 bf16 / 1024 fp32 wide
constexpr int kRowWarps = 8;          // warps per block
constexpr int kRowsPerWarp = 8;       // backward rows per warp of a block: its chunk, 8·warps rows, fixes dW's bits

// The backward's shared arrays (the weight, and each warp's weight-gradient sums) are in the lane_slot layout
// (elementwise.cuh); column_slot is the slot (in floats) of column c in that layout.
template <int V>
__device__ __forceinline__ int column_slot(int c) {
  const int pk = c / V, k = c % V;
  return lane_slot<V>(pk / 32, k / 4, pk % 32) * 4 + k % 4;
}

// The weight's pack p of a lane from the backward's shared copy (lane_slot layout).
template <int V>
__device__ __forceinline__ void shared_weight(const float4* weight, int p, int lane, float (&out)[V]) {
#pragma unroll
  for (int q = 0; q < V / 4; ++q) {
    const float4 f = weight[lane_slot<V>(p, q, lane)];
    out[4 * q] = f.x, out[4 * q + 1] = f.y, out[4 * q + 2] = f.z, out[4 * q + 3] = f.w;
  }
}

// Stages the weight (all ones without one) for packs 0 .. 32·P − 1 into `weight` (lane_slot layout, 32·P·V / 4
// float4s) by all threads of the block; the caller syncs before reading it. Read from global memory for each row
// instead, the weight's 32-byte lane strides (two 16-byte loads a pack, half of each sector unused) were most of the
// warp kernels' L1 traffic, their bottleneck.
template <int P, int V>
__device__ void stage_weight(float4* weight, const float* w, int row_packs) {
  for (int i = threadIdx.x; i < 32 * P * V / 4; i += blockDim.x) {
    const int pk = (i / 32 / (V / 4)) * 32 + i % 32, q = (i / 32) % (V / 4);
    weight[i] = !w ? make_float4(1.f, 1.f, 1.f, 1.f)
                   : pk < row_packs ? reinterpret_cast<const float4*>(w + (long long)pk * V)[q]
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// A warp's rows in shared memory, two buffers deep: while the warp works on one row (read from its buffer twice, for
// the row's statistic and again for the outputs), the next row's copies are in flight into the other. Each buffer
// holds kArrays arrays of a row (x; or x and dy), 32·P packs each; lane l copies, and later reads, packs l, l + 32, …
// only, so its own cp_async_wait makes them visible to it with no barrier, and a buffer is refilled only after the
// lane has consumed what it read from it. Why shared memory: read twice from global memory (the second time meant to
// hit L1), the rows mostly missed L1 (14% hits under ncu, H200, 385m) and doubled the L2 traffic, whose throughput
// (78-88%) then held DRAM to 63-70% of its bandwidth; the copies (.cg) pass L1 by.
template <typename T, int P, int kArrays>
struct RowStage {
  static constexpr int V = 16 / sizeof(T);
  using Packed = Pack<T, V>;
  static constexpr size_t kBytesPerWarp = size_t{2} * kArrays * 32 * P * sizeof(Packed);
  Packed* base;  // this warp's two buffers
  __device__ RowStage(char* smem, int warp)
      : base(reinterpret_cast<Packed*>(smem) + static_cast<size_t>(warp) * 2 * kArrays * 32 * P) {}
  __device__ const T* row(int buffer, int array) const {
    return reinterpret_cast<const T*>(base + (buffer * kArrays + array) * 32 * P);
  }
  // Issues the copies of the row at element `offset` of each source (sources[a] for array a; null ones skipped) into
  // `buffer`, if `valid`, and commits them as one group (an empty group otherwise, so that every row has one).
  __device__ void fetch(int buffer, const T* const (&sources)[kArrays], long long offset, bool valid, int row_packs,
                        int lane) {
    if (valid)
#pragma unroll
      for (int a = 0; a < kArrays; ++a) {
        if (!sources[a]) continue;
        const unsigned to = shared_address(base + (buffer * kArrays + a) * 32 * P);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int pk = p * 32 + lane;
          if (pk < row_packs)
            cp_async_16(to + pk * static_cast<unsigned>(sizeof(Packed)), sources[a] + offset + (long long)pk * V);
        }
      }
    cp_async_commit();
  }
};

// Forward: rows grid-stride over all warps of the grid (sized to what is resident: rmsnorm_forward_blocks), so that
// the block stages the weight once (stage_weight) for many rows; each warp's rows arrive through a RowStage (dynamic
// shared memory: kRowWarps · RowStage<T, P, 1>::kBytesPerWarp).
template <typename T, int P, bool kGated>
__global__ void __launch_bounds__(kRowWarps * 32)
    rmsnorm_forward_warp_kernel(const T* x, const float* w, T* y, float* rstd, long long rows, int width, float eps,
                                GateRows<T> gate) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  const int row_packs = width / V;
  const long long warps = (long long)gridDim.x * kRowWarps;
  __shared__ __align__(16) float4 weight[32 * P * V / 4];  // at most 8 KB
  extern __shared__ __align__(16) char staged_rows[];
  RowStage<T, P, 1> stage(staged_rows, threadIdx.x / 32);
  stage_weight<P, V>(weight, w, row_packs);
  const bool to_codes = kGated && gate.codes.codes;
  DeviceCodesOut codes{};
  if (to_codes) codes = device_codes_out(gate.codes);
  float local_amax = 0.f;
  __syncthreads();
  const long long first = blockIdx.x * (long long)kRowWarps + threadIdx.x / 32;
  stage.fetch(0, {x}, first * width, first < rows, row_packs, lane);
  int buffer = 0;
  for (long long row = first; row < rows; row += warps, buffer ^= 1) {
    const long long base = row * width;  // a multiple of V: every row starts on a pack
    stage.fetch(buffer ^ 1, {x}, base + warps * width, row + warps < rows, row_packs, lane);
    cp_async_wait<1>();  // this row has landed; the next one may still be in flight
    const T* normed_row = stage.row(buffer, 0);
    float sum_sq = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int pk = p * 32 + lane;
      if (pk >= row_packs) continue;
      float v[V];
      load_pack<V>(normed_row, pk, v);
#pragma unroll
      for (int k = 0; k < V; ++k) sum_sq += v[k] * v[k];
    }
    const float s = 1.f / sqrtf(warp_sum(sum_sq) / (float)width + eps);
    if (lane == 0) rstd[row] = s;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int pk = p * 32 + lane;
      if (pk >= row_packs) continue;
      float v[V], wv[V];
      load_pack<V>(normed_row, pk, v);
      shared_weight<V>(weight, p, lane, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = normalized(v[k], s, wv[k]);  // wv = 1 without a weight (stage_weight)
      if constexpr (kGated) {
        float g[V];
        load_pack<V>(gate.gate + gate.offset(row, gate.stride), pk, g);
        round_to_stored<T, V>(v);  // the norm's output as swiglu reads it back from memory
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = gated_output(g[k], stable_sigmoid<T>(g[k]), v[k]);
      }
      if (to_codes)
        store_codes<T, V>(codes, base + (long long)pk * V, v, local_amax);
      else
        store_pack<V>(y + base, pk, v);
    }
  }
  if (to_codes && codes.amax) fold_block_amax(local_amax, codes.amax);  // uniform over the block
}

// Warps per backward block: kRowWarps, halved where their weight-gradient rows (32 P V floats each) would pass 32 KB
// of shared memory (bf16 rows over 1024 wide).
template <typename T, int P>
__host__ __device__ constexpr int backward_row_warps() {
  return 32 * P * (16 / static_cast<int>(sizeof(T))) * kRowWarps * 4 <= 32768 ? kRowWarps : kRowWarps / 2;
}
// Resident blocks per SM the backward's registers are held to: 3 for rows of one pack a lane (e.g. the gated per-head
// norms of GLA and RetNet: a warp's short rows keep few bytes in flight, so more warps are needed to keep memory
// busy), else 2 (shared memory allows no more for wide rows).
template <typename T, int P>
__host__ __device__ constexpr int backward_min_blocks() {
  return P == 1 ? 3 : 2;
}
// Rows per backward block (the weight gradient's chunk): kRowsPerWarp per warp, so that blocks of half the warps take
// half the rows and the grid keeps its size. At a fixed 64 rows the 2048-wide bf16 rows of hgrn2-1b (16384 of them)
// made 256 blocks of 4 warps, about 8 warps per SM, and ran at half the 1024-wide rows' bandwidth (220 against 102 us
// for the same 64 MB).
template <typename T, int P>
__host__ __device__ constexpr int backward_chunk_rows() {
  return kRowsPerWarp * backward_row_warps<T, P>();
}

// Backward: block b takes rows [b·R, +R) (R = backward_chunk_rows), warp i of them rows i, i + W, … (W =
// backward_row_warps); with partial non-null (weight gradient wanted; needs dy) it writes the chunk's Σ dy ⊙ x̂ to
// partial[b, :], warps added in warp order. dx (needs dy) is accumulated into (add) or overwritten. y non-null: the
// forward's output x̂ · w written again from the x it reads anyway.
template <typename T, int P, bool kGated>
__global__ void __launch_bounds__(backward_row_warps<T, P>() * 32, backward_min_blocks<T, P>())
    rmsnorm_backward_warp_kernel(const T* x, const float* w, const float* rstd, const T* dy, T* dx, bool add,
                                 float* partial, T* y, long long rows, int width, GateRows<T> gate) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  constexpr int V = 16 / sizeof(T);
  constexpr int W = backward_row_warps<T, P>();
  __shared__ __align__(16) float warp_dw[W][32 * P * V];  // at most 32 KB
  __shared__ __align__(16) float4 weight[32 * P * V / 4];  // at most 4 KB
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row_packs = width / V;
  // The weight is staged in shared memory once per block (stage_weight) and read back where it is used, rather than
  // held in registers; each lane sums its columns' dy ⊙ x̂ in its warp's row of shared memory (only that lane touches
  // those words until the barrier). With the staged rows, shared memory (~100 KB a block for 1024-wide bf16 rows) is
  // what bounds the occupancy: two blocks an SM.
  stage_weight<P, V>(weight, w, row_packs);
  const bool to_codes = gate.codes.codes != nullptr;  // the output (gated or not) as codes in place of y
  DeviceCodesOut codes{};
  if (to_codes) codes = device_codes_out(gate.codes);
  float4* dw = reinterpret_cast<float4*>(warp_dw[warp]);
  if (partial)
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int q = 0; q < V / 4; ++q) dw[lane_slot<V>(p, q, lane)] = make_float4(0.f, 0.f, 0.f, 0.f);
  __syncthreads();  // the weight is staged
  const long long r_begin = blockIdx.x * (long long)backward_chunk_rows<T, P>();
  const long long r_end = min(rows, r_begin + backward_chunk_rows<T, P>());
  // x and dy arrive through a RowStage (dynamic shared memory: W · RowStage<T, P, 2>::kBytesPerWarp), so neither is
  // held in registers across the row's reduction: held, they took the 1024-wide bf16 build to 118 registers, and
  // prefetching the next row into registers made the kernel slower (H200, 385m: 118 us against 109 us per call). An
  // accumulated dx is read as raw packs (P · 16 bytes of registers) before the wait for the row, in flight during it.
  using Packed = Pack<T, V>;
  extern __shared__ __align__(16) char staged_rows[];
  RowStage<T, P, 2> stage(staged_rows, warp);
  stage.fetch(0, {x, dy}, (r_begin + warp) * width, r_begin + warp < r_end, row_packs, lane);
  int buffer = 0;
  for (long long row = r_begin + warp; row < r_end; row += W, buffer ^= 1) {
    const long long base = row * width;
    stage.fetch(buffer ^ 1, {x, dy}, base + W * width, row + W < r_end, row_packs, lane);
    Packed dx_in[P];
    if (dx && add)
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (p * 32 + lane < row_packs) dx_in[p] = reinterpret_cast<const Packed*>(dx + base)[p * 32 + lane];
    const float s = rstd[row];
    cp_async_wait<1>();  // this row has landed; the next one may still be in flight
    const T* xr = stage.row(buffer, 0);
    const T* dyr = stage.row(buffer, 1);  // holds the row only with dy
    if constexpr (kGated) {
      // The gated output's gradient dy becomes the norm output's, dn = dy · silu(g), in the staged row (this lane's
      // packs only), as swiglu's backward stores it; the gate's gradient and the gated output are written on the way.
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int pk = p * 32 + lane;
        if (pk >= row_packs) continue;
        float xv[V], dv[V], g[V], wv[V], out[V], dg[V];
        load_pack<V>(xr, pk, xv);
        load_pack<V>(dyr, pk, dv);
        load_pack<V>(gate.gate + gate.offset(row, gate.stride), pk, g);
        shared_weight<V>(weight, p, lane, wv);
        T* dgate_row = gate.dgate ? gate.dgate + gate.offset(row, gate.dgate_stride) : nullptr;
        if (dgate_row && gate.add) load_pack<V>(dgate_row, pk, dg);
        float n[V];
#pragma unroll
        for (int k = 0; k < V; ++k) n[k] = normalized(xv[k], s, wv[k]);
        round_to_stored<T, V>(n);  // as in the forward
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float sg = stable_sigmoid<T>(g[k]);
          out[k] = gated_output(g[k], sg, n[k]);
          const float v = silu_backward_value(g[k], sg, dv[k] * n[k]);
          dg[k] = dgate_row && gate.add ? accumulated(dg[k], v) : v;
          dv[k] = dv[k] * g[k] * sg;
        }
        if (to_codes) {
          float unused = 0.f;
          store_codes<T, V>(codes, base + (long long)pk * V, out, unused);
        } else if (y) {
          store_pack<V>(y + base, pk, out);
        }
        if (dgate_row) store_pack<V>(dgate_row, pk, dg);
        store_pack<V>(const_cast<T*>(dyr), pk, dv);
      }
    }
    float mean_dot = 0.f;
    if (dy) {
      float dot = 0.f;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p * 32 + lane >= row_packs) continue;
        float xv[V], dv[V], wv[V];
        load_pack<V>(xr, p * 32 + lane, xv);
        load_pack<V>(dyr, p * 32 + lane, dv);
        shared_weight<V>(weight, p, lane, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) dot += dv[k] * wv[k] * xv[k] * s;
      }
      mean_dot = warp_sum(dot) / (float)width;
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int pk = p * 32 + lane;
      if (pk >= row_packs) continue;
      float xv[V], g[V], wv[V];
      load_pack<V>(xr, pk, xv);
      if (dy || y || to_codes) shared_weight<V>(weight, p, lane, wv);
      if (!kGated && (y || to_codes)) {  // the forward's output again (the gated one was written above)
        float out[V];
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = normalized(xv[k], s, wv[k]);
        if (to_codes) {
          float unused = 0.f;
          store_codes<T, V>(codes, base + (long long)pk * V, out, unused);
        } else {
          store_pack<V>(y + base, pk, out);
        }
      }
      if (dy) {
        float dv[V];
        load_pack<V>(dyr, pk, dv);
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = s * (dv[k] * wv[k] - xv[k] * s * mean_dot);
        if (partial) {
          // float4 at a time, in the lane-contiguous layout (lane_slot).
#pragma unroll
          for (int q = 0; q < V / 4; ++q) {
            float4& acc = dw[lane_slot<V>(p, q, lane)];
            float4 t = acc;
            t.x += dv[4 * q] * xv[4 * q] * s;
            t.y += dv[4 * q + 1] * xv[4 * q + 1] * s;
            t.z += dv[4 * q + 2] * xv[4 * q + 2] * s;
            t.w += dv[4 * q + 3] * xv[4 * q + 3] * s;
            acc = t;
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = 0.f;
      }
      if (dx) {  // non-null only with dy
        float out[V];
        if (add)
#pragma unroll
          for (int k = 0; k < V; ++k) out[k] = load_f(dx_in[p].v[k]) + g[k];
        else
#pragma unroll
          for (int k = 0; k < V; ++k) out[k] = g[k];
        store_pack<V>(dx + base, pk, out);
      }
    }
  }
  if (!partial) return;  // uniform over the block: no thread skips the barrier
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float total = 0.f;
    for (int i = 0; i < W; ++i) total += warp_dw[i][column_slot<V>(c)];
    partial[blockIdx.x * (long long)width + c] = total;
  }
}

// Packs per lane for the warp path, 0 when the row does not qualify. At most kMaxWarpPacks (the backward's per-warp
// weight-gradient rows in shared memory grow with it).
template <typename T>
int warp_packs(int64_t width, std::initializer_list<const void*> pointers) {
  constexpr int V = 16 / sizeof(T);
  if (width % V != 0) return 0;
  for (const void* p : pointers)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  for (int packs = 1; packs <= kMaxWarpPacks; packs *= 2)
    if (32 * packs * V >= width) return packs;
  return 0;
}

// Calls f(std::integral_constant<int, P>{}) for the P warp_packs chose (1, 2, 4 or 8).
template <typename F>
void with_packs(int packs, F&& f) {
  switch (packs) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// Blocks for the forward's warp kernel: as many as the GPU holds at once (each warp then takes several rows, reading
// its weights once), never more than one row per warp needs.
template <auto kernel>
unsigned rmsnorm_forward_blocks(int64_t rows, size_t dynamic_smem) {
  return static_cast<unsigned>(
      std::min((rows + kRowWarps - 1) / kRowWarps, resident_blocks<kernel>(kRowWarps * 32, dynamic_smem)));
}

// Queues the weight gradient's second pass: dweight (+)= Σ over chunks of partial [chunks, width].
void finalize_dweight(const float* partial, float* dweight, bool accumulate, int64_t chunks, int64_t width) {
  add_chunk_sums<kFinalLanes>(partial, dweight, chunks, width, "rmsnorm_dw_finalize", accumulate);
}

// The warp kernels' view of an RmsnormGate (null: none), its rows checked to fit (cuda_rmsnorm_gate_fits).
template <typename T>
GateRows<T> gate_rows(const RmsnormGate* gate, int64_t width, const Fp8CodesOut* y_codes = nullptr) {
  GateRows<T> g;
  if (y_codes) g.codes = *y_codes;  // the plain norm's output as codes
  if (!gate) return g;
  g.gate = static_cast<const T*>(gate->gate);
  g.dgate = static_cast<T*>(gate->dgate);
  g.stride = gate->stride;
  g.dgate_stride = gate->dgate_stride;
  g.groups = static_cast<int>(gate->groups);
  g.width = static_cast<int>(width);
  g.add = gate->add_dgate;
  g.codes = gate->codes;
  return g;
}

}  // namespace

bool cuda_rmsnorm_gate_fits(int64_t width, const void* x, const RmsnormGate& gate, DType dtype) {
  const int64_t pack = 16 / static_cast<int64_t>(dtype_size(dtype));
  if (gate.groups < 1 || gate.groups > 0x7fffffffLL || width > 0x7fffffffLL) return false;
  if (gate.stride % pack != 0 || (gate.dgate && gate.dgate_stride % pack != 0)) return false;
  int packs = 0;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rmsnorm gate", [&] { packs = warp_packs<act_t>(width, {x, gate.gate, gate.dgate}); });
  return packs > 0;
}

bool cuda_rmsnorm_codes_fit(int64_t width, DType dtype, std::initializer_list<const void*> buffers) {
  int packs = 0;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rmsnorm codes", [&] { packs = warp_packs<act_t>(width, buffers); });
  return packs > 0;
}

void cuda_rmsnorm_forward(const void* x, const float* weight, void* y, float* rstd, int64_t rows, int64_t width,
                          double eps, DType dtype, const RmsnormGate* gate) {
  check_row_width(width, "rmsnorm");
  HGRN_CHECK(!gate || cuda_rmsnorm_gate_fits(width, x, *gate, dtype), "rmsnorm: a gated norm of rows ", width,
             " wide that the warp kernels do not take (see cuda_rmsnorm_gate_fits)");
  HGRN_CHECK(!gate || !gate->codes.codes || (!y && gate->codes.scale),
             "rmsnorm: the gated output's FP8 codes need a scale and replace y");
  if (rows == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rmsnorm", [&] {
    const int packs = warp_packs<act_t>(width, {x, weight, y});
    HGRN_CHECK(!gate || packs > 0, "rmsnorm: the gated norm's output or weight is not on 16 bytes");
    if (packs > 0) {
      with_packs(packs, [&](auto p) {
        with_flag(gate != nullptr, [&](auto gated) {
          constexpr int P = decltype(p)::value;
          constexpr auto kernel = rmsnorm_forward_warp_kernel<act_t, P, decltype(gated)::value>;
          constexpr size_t smem = kRowWarps * RowStage<act_t, P, 1>::kBytesPerWarp;
          launch_as_dependent(kernel, dim3(rmsnorm_forward_blocks<kernel>(rows, smem)), dim3(kRowWarps * 32), smem,
                              static_cast<const act_t*>(x), weight, static_cast<act_t*>(y), rstd, rows,
                              static_cast<int>(width), static_cast<float>(eps), gate_rows<act_t>(gate, width));
        });
      });
    } else {
      rmsnorm_forward_kernel<act_t><<<row_blocks(rows), row_block_threads(width), 0, cuda_stream()>>>(
          static_cast<const act_t*>(x), weight, static_cast<act_t*>(y), rstd, rows, static_cast<int>(width),
          static_cast<float>(eps));
    }
    CUDA_CHECK_LAUNCH("rmsnorm_forward");
  });
}

void cuda_rmsnorm_backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx, bool add,
                           float* dweight, bool dweight_add, void* y, int64_t rows, int64_t width, DType dtype,
                           const RmsnormGate* gate, const Fp8CodesOut* y_codes) {
  check_row_width(width, "rmsnorm backward");
  HGRN_CHECK(!gate || (dy && cuda_rmsnorm_gate_fits(width, x, *gate, dtype)),
             "rmsnorm backward: a gated norm needs the output's gradient and rows the warp kernels take");
  HGRN_CHECK(!gate || !y_codes, "rmsnorm backward: a gated norm's codes come in its RmsnormGate");
  HGRN_CHECK(!y_codes || (y_codes->codes && y_codes->scale && !y_codes->amax && !y &&
                          cuda_rmsnorm_codes_fit(width, dtype, {x, weight, dy, dx})),
             "rmsnorm backward: the output's FP8 codes need a buffer and a scale, replace y, record no amax and need "
             "rows the warp kernels take");
  // A fresh weight gradient with nothing to sum holds zeros.
  if (dweight && !dweight_add && (rows == 0 || !dy))
    CUDA_CHECK(cudaMemsetAsync(dweight, 0, static_cast<size_t>(width) * sizeof(float), cuda_stream()));
  if (rows == 0) return;
  const bool want_dx = dx && dy, want_dw = dweight && dy;
  HGRN_CHECK(!gate || !gate->codes.codes || (!y && !gate->codes.amax),
             "rmsnorm backward: the gated output's FP8 codes replace y and record no amax");
  if (!want_dx && !want_dw && !y && !y_codes && !(gate && (gate->dgate || gate->codes.codes))) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rmsnorm backward", [&] {
    const act_t* xt = static_cast<const act_t*>(x);
    const act_t* dyt = static_cast<const act_t*>(dy);
    act_t* dxt = want_dx ? static_cast<act_t*>(dx) : nullptr;
    const int packs = warp_packs<act_t>(width, {x, weight, dy, dx, y});
    HGRN_CHECK((!gate && !y_codes) || packs > 0,
               "rmsnorm backward: the gated norm's or the codes' buffers are not on 16 bytes");
    if (packs > 0) {
      // One pass for both gradients; the chunk partials of dweight go to a scratch summed by finalize_dweight.
      with_packs(packs, [&](auto p) {
        constexpr int P = decltype(p)::value;
        const int64_t chunks = (rows + backward_chunk_rows<act_t, P>() - 1) / backward_chunk_rows<act_t, P>();
        HGRN_CHECK(chunks <= 0x7fffffffLL, "rmsnorm backward: ", rows, " rows exceed the launch grid");
        // Freed at the end of this scope but reused only by work queued after these kernels (one stream).
        Tensor partial;
        if (want_dw) partial = Tensor::empty({chunks, width}, DType::F32, Device::CUDA);
        float* partial_data = want_dw ? static_cast<float*>(partial.raw_data()) : nullptr;
        with_flag(gate != nullptr, [&](auto gated) {
          constexpr auto kernel = rmsnorm_backward_warp_kernel<act_t, P, decltype(gated)::value>;
          constexpr size_t smem = backward_row_warps<act_t, P>() * RowStage<act_t, P, 2>::kBytesPerWarp;
          allow_dynamic_smem<kernel>(smem);
          launch_as_dependent(kernel, dim3(static_cast<unsigned>(chunks)), dim3(backward_row_warps<act_t, P>() * 32),
                              smem, xt, weight, rstd, dyt, dxt, add, partial_data, static_cast<act_t*>(y), rows,
                              static_cast<int>(width), gate_rows<act_t>(gate, width, y_codes));
        });
        CUDA_CHECK_LAUNCH("rmsnorm_backward_warp");
        if (want_dw) finalize_dweight(partial_data, dweight, dweight_add, chunks, width);
      });
      return;
    }
    if (want_dx || y) {
      rmsnorm_backward_dx_kernel<act_t><<<row_blocks(rows), row_block_threads(width), 0, cuda_stream()>>>(
          xt, weight, rstd, want_dx ? dyt : nullptr, dxt, add, static_cast<act_t*>(y), rows, static_cast<int>(width));
      CUDA_CHECK_LAUNCH("rmsnorm_backward_dx");
    }
    if (want_dw) {
      Tensor partial = Tensor::empty({column_sum_chunks(rows), width}, DType::F32, Device::CUDA);
      add_column_sums(DweightTerm<act_t>{xt, rstd, dyt, static_cast<int>(width)},
                      static_cast<float*>(partial.raw_data()), dweight, rows, width, "rmsnorm_dw", dweight_add);
    }
  });
}

}  // namespace hgrn
