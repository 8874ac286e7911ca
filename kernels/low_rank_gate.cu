// low_rank_gate.cu: a low-rank gate through a log-sigmoid on the GPU (low_rank_gate.h), y = log σ(u·Wᵀ + b) / divisor,
// one pass each way.
// Tiles: a block of 256 threads is two row groups of 128. Thread t of a group owns outputs [4t, 4t + 4) of a
// 512-wide output tile and 8 rows of each 16-row step (group g: rows 8g..8g+7), whose 8×4 logits it sums from W's tile
// (transposed, in shared memory for the block's life) and the step's u (transposed, fp32, in shared memory). Both are
// zero-padded to a multiple of 16 ranks: the zeros add nothing, and the inner loops run whole 16-rank chunks.
// Backward, per step: d = dy·σ(−x)/divisor in registers; dW's and db's sums over the block's rows accumulate in
// registers (16 ranks at a time: a wider rank takes one pass per 16); du's sum over the tile's outputs runs across a
// warp by shuffles and across the group's 4 warps through shared memory. Each block writes its partial dW and db, which
// add_chunk_sums (chunk_sums.cuh) adds in block order (dW's when the caller asks); past one output tile each tile's du
// goes to scratch, added in tile order by a second kernel. The block count and every order are set by the shape alone
// (no atomics), so the bits repeat run to run.
#include "low_rank_gate.h"

#include <algorithm>

#include "chunk_sums.cuh"
#include "core/tensor.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

constexpr int kOutPerThread = 4;
constexpr int kGroupThreads = 128;
constexpr int kGroups = 2;
constexpr int kThreads = kGroups * kGroupThreads;
constexpr int kWarpsPerGroup = kGroupThreads / 32;
constexpr int kOutTile = kGroupThreads * kOutPerThread;
constexpr int kRowsPerThread = 8;
constexpr int kStepRows = kGroups * kRowsPerThread;
constexpr int kRankChunk = 16;
// Floats between the rows of W's transposed tile: 16-byte reads stay aligned and the transposing writes spread over
// the banks.
constexpr int kWeightPitch = kOutTile + 4;
// du's per-warp sums [group][warp][row][rank in chunk], padded against bank conflicts.
constexpr int kDuPitch = kRankChunk + 1;
constexpr int kDuSumFloats = kGroups * kWarpsPerGroup * kRowsPerThread * kDuPitch;
// Row group 1's dW and db sums [rank in chunk][output], then [output], for group 0 to add.
constexpr int kGroupSumFloats = kRankChunk * kOutTile + kOutTile;
constexpr int kForwardSteps = 4;      // steps per forward block
constexpr int kBackwardBlocks = 256;  // row blocks of the backward: fixed, as it sets the order of dW's sum
constexpr int kSumLanes = 16;         // add_chunk_sums' lanes

int rank_pad(int64_t rank) { return static_cast<int>((rank + kRankChunk - 1) / kRankChunk * kRankChunk); }
size_t forward_smem_bytes(int rank_pad) {
  return sizeof(float) * (static_cast<size_t>(rank_pad) * kWeightPitch + static_cast<size_t>(rank_pad) * kStepRows);
}
size_t backward_smem_bytes(int rank_pad) {
  return forward_smem_bytes(rank_pad) + sizeof(float) * (kDuSumFloats + kGroupSumFloats);
}
__host__ __device__ long long row_steps(long long rows) { return (rows + kStepRows - 1) / kStepRows; }
int out_tiles(int64_t out) { return static_cast<int>((out + kOutTile - 1) / kOutTile); }
// The backward's row blocks: fewer per tile where there are several tiles, so that the partials stay small.
long long backward_blocks(int64_t rows, int64_t out) {
  return std::min<long long>(row_steps(rows), std::max(1, kBackwardBlocks / out_tiles(out)));
}

template <typename T>
struct GateParams {
  const T* u;
  const float *weight, *bias;
  long long rows, u_stride;
  int out, rank, rank_pad;
  float inv_divisor;  // 1 / divisor: a multiply per element, exact for a power of two (GLA's 16)
  bool vec;  // out is a multiple of 4 and y / dy are 16-byte aligned: 16-byte accesses
};

// W's rows [tile0, tile0 + kOutTile) transposed into wt[r][o], zeros past out and rank.
template <typename T>
__device__ void load_weight_tile(const GateParams<T>& p, int tile0, float* wt) {
  for (int i = threadIdx.x; i < kOutTile * p.rank_pad; i += kThreads) {
    const int o = i / p.rank_pad, r = i - o * p.rank_pad;
    wt[r * kWeightPitch + o] = tile0 + o < p.out && r < p.rank ? p.weight[(long long)(tile0 + o) * p.rank + r] : 0.f;
  }
}

// u's rows [row0, row0 + kStepRows) transposed into ut[r][m] in fp32, zeros past the rows and the rank.
template <typename T>
__device__ void load_u_step(const GateParams<T>& p, long long row0, float* ut) {
  for (int i = threadIdx.x; i < kStepRows * p.rank_pad; i += kThreads) {
    const int m = i / p.rank_pad, r = i - m * p.rank_pad;
    const long long row = row0 + m;
    ut[r * kStepRows + m] = row < p.rows && r < p.rank ? load_f(p.u[row * p.u_stride + r]) : 0.f;
  }
}

// The bias of outputs [o0, o0 + 4), zeros past out.
template <typename T>
__device__ __forceinline__ void load_bias(const GateParams<T>& p, int o0, float (&b)[kOutPerThread]) {
#pragma unroll
  for (int j = 0; j < kOutPerThread; ++j) b[j] = o0 + j < p.out ? p.bias[o0 + j] : 0.f;
}

// The thread's 8 rows of u at rank r (ut[r][m0 .. m0 + 8)).
__device__ __forceinline__ void load_u_rows(const float* ut, int r, int m0, float (&u)[kRowsPerThread]) {
  const float4 a = *reinterpret_cast<const float4*>(ut + r * kStepRows + m0);
  const float4 b = *reinterpret_cast<const float4*>(ut + r * kStepRows + m0 + 4);
  u[0] = a.x, u[1] = a.y, u[2] = a.z, u[3] = a.w, u[4] = b.x, u[5] = b.y, u[6] = b.z, u[7] = b.w;
}

__device__ __forceinline__ void load_w(const float* wt, int r, int o, float (&w)[kOutPerThread]) {
  const float4 v = *reinterpret_cast<const float4*>(wt + r * kWeightPitch + o);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}

// x[m][j] = Σ_r u[m0 + m][r]·W[o + j][r], r ascending over the padded rank.
__device__ __forceinline__ void tile_products(const float* wt, const float* ut, int rank_pad, int o, int m0,
                                              float (&x)[kRowsPerThread][kOutPerThread]) {
#pragma unroll
  for (int m = 0; m < kRowsPerThread; ++m)
#pragma unroll
    for (int j = 0; j < kOutPerThread; ++j) x[m][j] = 0.f;
  for (int c = 0; c < rank_pad; c += kRankChunk) {
#pragma unroll
    for (int k = 0; k < kRankChunk; ++k) {
      float u[kRowsPerThread], w[kOutPerThread];
      load_u_rows(ut, c + k, m0, u);
      load_w(wt, c + k, o, w);
#pragma unroll
      for (int m = 0; m < kRowsPerThread; ++m)
#pragma unroll
        for (int j = 0; j < kOutPerThread; ++j) x[m][j] += u[m] * w[j];
    }
  }
}

// row[o0 .. o0 + 4) where below out, zeros elsewhere.
__device__ __forceinline__ void load_four(const float* row, int o0, int out, bool vec, float (&v)[kOutPerThread]) {
  if (vec && o0 < out) {
    const float4 f = *reinterpret_cast<const float4*>(row + o0);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < kOutPerThread; ++j) v[j] = o0 + j < out ? row[o0 + j] : 0.f;
}

__device__ __forceinline__ void store_four(float* row, int o0, int out, bool vec, const float (&v)[kOutPerThread]) {
  if (vec) {
    if (o0 < out) *reinterpret_cast<float4*>(row + o0) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kOutPerThread; ++j)
    if (o0 + j < out) row[o0 + j] = v[j];
}

// The sum over the warp of s[m] for the lane's row m = (lane >> 2) & 7, the same in the 4 lanes of a quad: lanes 16
// apart trade halves (rows 0-3 / 4-7), then 8 apart (pairs) and 4 apart (single rows), each keeping the half its lane
// bit names; the quad's two last steps add the rest. A fixed tree, so the bits repeat.
__device__ __forceinline__ float warp_row_sum(float (&s)[kRowsPerThread], int lane) {
  const bool upper_half = lane & 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float send = upper_half ? s[i] : s[i + 4], keep = upper_half ? s[i + 4] : s[i];
    s[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  const bool upper_pair = lane & 8;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float send = upper_pair ? s[i] : s[i + 2], keep = upper_pair ? s[i + 2] : s[i];
    s[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  const bool upper_row = lane & 4;
  const float send = upper_row ? s[0] : s[1], keep = upper_row ? s[1] : s[0];
  float v = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v;
}

template <typename T>
struct ForwardParams : GateParams<T> {
  float* y;
};

// Block (kThreads) = output tile blockIdx.y over steps [blockIdx.x·kForwardSteps, + kForwardSteps).
template <typename T>
__global__ void __launch_bounds__(kThreads) low_rank_gate_forward_kernel(const ForwardParams<T> p) {
  extern __shared__ float4 smem_forward[];
  float* wt = reinterpret_cast<float*>(smem_forward);
  float* ut = wt + p.rank_pad * kWeightPitch;
  const int tile0 = blockIdx.y * kOutTile;
  const int o = (threadIdx.x % kGroupThreads) * kOutPerThread, m0 = threadIdx.x / kGroupThreads * kRowsPerThread;
  load_weight_tile(p, tile0, wt);
  float b[kOutPerThread];
  load_bias(p, tile0 + o, b);
  const long long first = (long long)blockIdx.x * kForwardSteps;
  const long long last = min(row_steps(p.rows), first + kForwardSteps);
  for (long long step = first; step < last; ++step) {
    const long long row0 = step * kStepRows;
    __syncthreads();  // W's tile is in place; the previous step's reads of ut are done
    load_u_step(p, row0, ut);
    __syncthreads();
    float x[kRowsPerThread][kOutPerThread];
    tile_products(wt, ut, p.rank_pad, o, m0, x);
#pragma unroll
    for (int m = 0; m < kRowsPerThread; ++m) {
      const long long row = row0 + m0 + m;
      if (row >= p.rows) break;
      float v[kOutPerThread];
#pragma unroll
      for (int j = 0; j < kOutPerThread; ++j) v[j] = log_sigmoid_value(x[m][j] + b[j]) * p.inv_divisor;
      store_four(p.y + row * p.out, tile0 + o, p.out, p.vec, v);
    }
  }
}

template <typename T>
struct BackwardParams : GateParams<T> {
  const float* dy;
  T* du;
  long long du_stride;
  bool add_du;
  float* du_partial;  // [tiles, rows, rank]: each output tile's part of du, where there are several
  float* partial_w;   // [blocks, out·rank]: each row block's part of dW
  float* partial_b;   // [blocks, out]
};

// Block (kThreads) = output tile blockIdx.y over steps blockIdx.x, + gridDim.x, …, once per 16-rank chunk.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2) low_rank_gate_backward_kernel(const BackwardParams<T> p) {
  extern __shared__ float4 smem_backward[];
  float* wt = reinterpret_cast<float*>(smem_backward);
  float* ut = wt + p.rank_pad * kWeightPitch;
  float* du_sums = ut + p.rank_pad * kStepRows;
  float* group_sums = du_sums + kDuSumFloats;
  const int tile0 = blockIdx.y * kOutTile;
  const int group = threadIdx.x / kGroupThreads, t = threadIdx.x % kGroupThreads;
  const int warp = t / 32, lane = t % 32, o = t * kOutPerThread, m0 = group * kRowsPerThread;
  const bool want_du = p.du || p.du_partial, want_sums = p.partial_w || p.partial_b;
  load_weight_tile(p, tile0, wt);
  const long long steps = row_steps(p.rows);
  for (int c = 0; c < p.rank_pad; c += kRankChunk) {
    float dw[kOutPerThread][kRankChunk], db[kOutPerThread];
#pragma unroll
    for (int j = 0; j < kOutPerThread; ++j) {
      db[j] = 0.f;
#pragma unroll
      for (int k = 0; k < kRankChunk; ++k) dw[j][k] = 0.f;
    }
    for (long long step = blockIdx.x; step < steps; step += gridDim.x) {
      const long long row0 = step * kStepRows;
      __syncthreads();  // W's tile is in place; the previous step's reads of ut and du_sums are done
      load_u_step(p, row0, ut);
      __syncthreads();
      // d = dy·σ(−x)/divisor, made in place of the logits x (rows past the end have dy = 0).
      float d[kRowsPerThread][kOutPerThread], b[kOutPerThread];
      tile_products(wt, ut, p.rank_pad, o, m0, d);
      load_bias(p, tile0 + o, b);  // each step: registers are short here
#pragma unroll
      for (int m = 0; m < kRowsPerThread; ++m) {
        const long long row = row0 + m0 + m;
        float dy[kOutPerThread] = {0.f, 0.f, 0.f, 0.f};
        if (row < p.rows) load_four(p.dy + row * p.out, tile0 + o, p.out, p.vec, dy);
#pragma unroll
        for (int j = 0; j < kOutPerThread; ++j)
          d[m][j] = dy[j] * stable_sigmoid<float>(-(d[m][j] + b[j])) * p.inv_divisor;
      }
      if (c == 0) {
#pragma unroll
        for (int m = 0; m < kRowsPerThread; ++m)
#pragma unroll
          for (int j = 0; j < kOutPerThread; ++j) db[j] += d[m][j];
      }
#pragma unroll
      for (int k = 0; k < kRankChunk; ++k) {
        float u[kRowsPerThread];
        load_u_rows(ut, c + k, m0, u);
#pragma unroll
        for (int j = 0; j < kOutPerThread; ++j)
#pragma unroll
          for (int m = 0; m < kRowsPerThread; ++m) dw[j][k] += d[m][j] * u[m];
        if (want_du) {
          float w[kOutPerThread], s[kRowsPerThread];
          load_w(wt, c + k, o, w);
#pragma unroll
          for (int m = 0; m < kRowsPerThread; ++m) {
            s[m] = d[m][0] * w[0];
#pragma unroll
            for (int j = 1; j < kOutPerThread; ++j) s[m] += d[m][j] * w[j];
          }
          const float v = warp_row_sum(s, lane);
          float* warp_sums = du_sums + (group * kWarpsPerGroup + warp) * kRowsPerThread * kDuPitch;
          if ((lane & 3) == 0) warp_sums[lane / 4 * kDuPitch + k] = v;  // the quad's row, once
        }
      }
      if (want_du) {
        __syncthreads();
        // Thread t of group g takes row m = t / 16 and rank k = t % 16: adds the group's warps in order and stores
        // du[row0 + 8g + m, c + k].
        const int m = t / kRankChunk, k = t % kRankChunk;
        const float* sums = du_sums + (group * kWarpsPerGroup * kRowsPerThread + m) * kDuPitch + k;
        float v = sums[0];
#pragma unroll
        for (int w = 1; w < kWarpsPerGroup; ++w) v += sums[w * kRowsPerThread * kDuPitch];
        const long long row = row0 + m0 + m;
        const int r = c + k;
        if (row < p.rows && r < p.rank) {
          if (p.du_partial) {
            p.du_partial[((long long)blockIdx.y * p.rows + row) * p.rank + r] = v;
          } else {
            T* dst = p.du + row * p.du_stride + r;
            *dst = store_f<T>(p.add_du ? load_f(*dst) + v : v);
          }
        }
      }
    }
    if (want_sums) {
      // The block's sums: group 1's through shared memory, added to group 0's, into the block's partial row.
      if (group == 1) {
#pragma unroll
        for (int k = 0; k < kRankChunk; ++k)
          *reinterpret_cast<float4*>(group_sums + k * kOutTile + o) =
              make_float4(dw[0][k], dw[1][k], dw[2][k], dw[3][k]);
        *reinterpret_cast<float4*>(group_sums + kRankChunk * kOutTile + o) = make_float4(db[0], db[1], db[2], db[3]);
      }
      __syncthreads();
      if (group == 0) {
#pragma unroll
        for (int j = 0; j < kOutPerThread; ++j) {
          const int out_index = tile0 + o + j;
          if (out_index >= p.out) break;
          if (p.partial_w) {
            float* row = p.partial_w + (long long)blockIdx.x * p.out * p.rank + (long long)out_index * p.rank;
#pragma unroll
            for (int k = 0; k < kRankChunk; ++k)
              if (c + k < p.rank) row[c + k] = dw[j][k] + group_sums[k * kOutTile + o + j];
          }
          if (c == 0 && p.partial_b)
            p.partial_b[(long long)blockIdx.x * p.out + out_index] = db[j] + group_sums[kRankChunk * kOutTile + o + j];
        }
      }
      __syncthreads();  // group_sums is written again at the next chunk's end
    }
  }
}

// du (+)= Σ_tiles partial[tile] in tile order, for rows·rank elements.
template <typename T>
__global__ void add_tile_sums_kernel(const float* partial, int tiles, long long rows, int rank, T* du,
                                     long long du_stride, bool add) {
  const long long n = rows * rank;
  HGRN_FOR_EACH_PACK(i, n) {
    float v = partial[i];
    for (int tile = 1; tile < tiles; ++tile) v += partial[tile * n + i];
    T* dst = du + (i / rank) * du_stride + i % rank;
    *dst = store_f<T>(add ? load_f(*dst) + v : v);
  }
}

template <typename T>
GateParams<T> gate_params(const void* u, const float* weight, const float* bias, float divisor,
                          const LowRankGateShape& s, std::initializer_list<const void*> row_major) {
  GateParams<T> p;
  p.u = static_cast<const T*>(u);
  p.weight = weight;
  p.bias = bias;
  p.rows = s.rows;
  p.u_stride = s.u_stride ? s.u_stride : s.rank;
  p.out = static_cast<int>(s.out);
  p.rank = static_cast<int>(s.rank);
  p.rank_pad = rank_pad(s.rank);
  p.inv_divisor = static_cast<float>(1.0 / static_cast<double>(divisor));
  p.vec = s.out % kOutPerThread == 0;
  for (const void* ptr : row_major) p.vec = p.vec && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  return p;
}

void check_shape(const LowRankGateShape& s, const char* op) {
  HGRN_CHECK(s.rows >= 0 && s.out >= 1 && s.out <= (int64_t{1} << 30) && s.rank >= 1 && s.rank <= kLowRankGateMaxRank,
             op, ": rows ", s.rows, ", out ", s.out, ", rank ", s.rank, " (the GPU takes ranks 1 to ",
             kLowRankGateMaxRank, ")");
  HGRN_CHECK(s.u_stride == 0 || s.u_stride >= s.rank, op, ": u's row stride ", s.u_stride, " is below its rank ",
             s.rank);
  HGRN_CHECK(row_steps(s.rows) / kForwardSteps < 0x7fffffffLL, op, ": ", s.rows, " rows exceed the launch grid");
}

}  // namespace

void cuda_low_rank_gate_forward(const void* u, DType u_dtype, const float* weight, const float* bias, float divisor,
                                float* y, const LowRankGateShape& shape) {
  check_shape(shape, "low_rank_gate");
  if (shape.rows == 0) return;
  const dim3 grid(static_cast<unsigned>((row_steps(shape.rows) + kForwardSteps - 1) / kForwardSteps),
                  static_cast<unsigned>(out_tiles(shape.out)));
  HGRN_CUDA_DISPATCH_ACT(u_dtype, "low_rank_gate", [&] {
    ForwardParams<act_t> p;
    static_cast<GateParams<act_t>&>(p) = gate_params<act_t>(u, weight, bias, divisor, shape, {y});
    p.y = y;
    constexpr auto kernel = low_rank_gate_forward_kernel<act_t>;
    allow_dynamic_smem<kernel>(forward_smem_bytes(kLowRankGateMaxRank));
    kernel<<<grid, kThreads, forward_smem_bytes(p.rank_pad), cuda_stream()>>>(p);
  });
  CUDA_CHECK_LAUNCH("low_rank_gate_forward");
}

int64_t cuda_low_rank_gate_weight_partials(const LowRankGateShape& shape) {
  return shape.rows ? backward_blocks(shape.rows, shape.out) * shape.out * shape.rank : 0;
}

void cuda_low_rank_gate_add_weight_partials(const float* partials, float* dweight, const LowRankGateShape& shape) {
  if (shape.rows == 0) return;
  add_chunk_sums<kSumLanes>(partials, dweight, backward_blocks(shape.rows, shape.out), shape.out * shape.rank,
                            "low_rank_gate_dweight");
}

void cuda_low_rank_gate_backward(const LowRankGateBackwardArgs& a) {
  const LowRankGateShape& s = a.shape;
  check_shape(s, "low_rank_gate backward");
  const bool want_du = a.du != nullptr, want_sums = a.dweight_partials || a.dbias;
  if (s.rows == 0 || (!want_du && !want_sums)) return;
  const int tiles = out_tiles(s.out);
  const long long blocks = backward_blocks(s.rows, s.out);
  // Scratch from hgrn's allocator, freed at the end of this scope but reused only by work queued after these kernels
  // (one stream).
  Tensor partial_b, du_partial;
  if (a.dbias) partial_b = Tensor::empty({blocks, s.out}, DType::F32, Device::CUDA);
  if (want_du && tiles > 1) du_partial = Tensor::empty({tiles, s.rows, s.rank}, DType::F32, Device::CUDA);
  const long long du_stride = a.du_stride ? a.du_stride : s.rank;
  HGRN_CUDA_DISPATCH_ACT(a.u_dtype, "low_rank_gate backward", [&] {
    BackwardParams<act_t> p;
    static_cast<GateParams<act_t>&>(p) = gate_params<act_t>(a.u, a.weight, a.bias, a.divisor, s, {a.dy});
    p.dy = a.dy;
    p.du = tiles == 1 ? static_cast<act_t*>(a.du) : nullptr;
    p.du_stride = du_stride;
    p.add_du = a.add_du;
    p.du_partial = du_partial.defined() ? du_partial.data<float>() : nullptr;
    p.partial_w = a.dweight_partials;
    p.partial_b = partial_b.defined() ? partial_b.data<float>() : nullptr;
    constexpr auto kernel = low_rank_gate_backward_kernel<act_t>;
    allow_dynamic_smem<kernel>(backward_smem_bytes(kLowRankGateMaxRank));
    kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles)), kThreads,
             backward_smem_bytes(p.rank_pad), cuda_stream()>>>(p);
    CUDA_CHECK_LAUNCH("low_rank_gate_backward");
    if (du_partial.defined()) {
      add_tile_sums_kernel<act_t><<<grid_for(s.rows * s.rank, kElementwiseThreads), kElementwiseThreads, 0,
                                    cuda_stream()>>>(du_partial.data<float>(), tiles, s.rows,
                                                     static_cast<int>(s.rank), static_cast<act_t*>(a.du), du_stride,
                                                     a.add_du);
      CUDA_CHECK_LAUNCH("low_rank_gate_du_tiles");
    }
  });
  if (a.dbias) add_chunk_sums<kSumLanes>(partial_b.data<float>(), a.dbias, blocks, s.out, "low_rank_gate_dbias");
}

}  // namespace hgrn
