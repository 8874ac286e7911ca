// fp8.cu: the scaled FP8 casts with their amax, the transpose of codes and the delayed-scaling update on the GPU
// (fp8.h). The cast of one value and the amax fold: fp8_codes.cuh.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "fp8.h"
#include "fp8_codes.cuh"

namespace hgrn {
namespace {

// Blocks for a cast that folds an amax: enough to fill the GPU, few enough that the atomics stay cheap.
unsigned amax_grid(long long work_items, int threads) {
  const long long cap = 16LL * cuda_device_properties().multiProcessorCount;
  return static_cast<unsigned>(std::min<long long>(grid_for(work_items, threads), cap));
}

template <int V, typename T>
__global__ void fp8_quantize_kernel(const T* x, long long packs, const float* scale, __nv_fp8_interpretation_t format,
                                    uint8_t* out, float* amax) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  const float s = *scale;
  float local = 0.0f;
  HGRN_FOR_EACH_PACK(i, packs) {
    float v[V];
    load_pack<V>(x, i, v);
    Pack<uint8_t, V> codes;
    fp8_codes_of<V>(v, s, format, codes.v, local);
    reinterpret_cast<Pack<uint8_t, V>*>(out)[i] = codes;
  }
  if (amax) fold_block_amax(local, amax);
}

// The FP8 codes of a row-major [rows, cols] matrix written transposed to out_t and, where `out` is not null, as they
// are to out; a Source (CastCodes, StoredCodes below) gives the codes of kWidth adjacent elements of a row. A 64 x 64
// tile per step, 256 threads. Reading: each thread takes kWidth adjacent elements of a row (16-byte loads when
// kPacked), stores their codes to `out` along the row and to shared memory transposed. Writing: each thread takes 16
// adjacent codes of a tile column, one 16-byte store to a row of out_t. Blocks stride over the row tiles (blockIdx.x);
// blockIdx.y is the column tile. kPacked needs cols % kWidth == 0, rows % 16 == 0 and aligned pointers; otherwise
// every element is moved on its own, with bounds.
constexpr int kTile = 64, kTileThreads = 256, kWriteWidth = 16;
constexpr int kTilePitch = kTile + 4;  // column-major rows 68 bytes apart: at most 2-way bank conflicts either way

// The scaled cast of x's elements (widened to fp32), folding each |x| into the thread's amax.
template <typename T>
struct CastCodes {
  static constexpr int kWidth = 8;  // 16 or 32 bytes of x
  const T* x;
  const float* scale;  // on the device: read once per thread (prepare)
  __nv_fp8_interpretation_t format;
  float s = 0.0f;

  __device__ __forceinline__ void prepare() { s = *scale; }
  template <bool kPacked>
  __device__ __forceinline__ void read(long long r, long long c, long long rows, long long cols,
                                       uint8_t (&codes)[kWidth], float& amax) const {
    float v[kWidth];
    if constexpr (kPacked) {
      load_pack<kWidth>(x + r * cols + c, 0, v);
    } else {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) v[k] = r < rows && c + k < cols ? load_f(x[r * cols + c + k]) : 0.0f;
    }
    fp8_codes_of<kWidth>(v, s, format, codes, amax);
  }
};

// Codes cast before, moved as they are.
struct StoredCodes {
  static constexpr int kWidth = 16;  // one 16-byte load
  const uint8_t* codes;

  __device__ __forceinline__ void prepare() {}
  template <bool kPacked>
  __device__ __forceinline__ void read(long long r, long long c, long long rows, long long cols,
                                       uint8_t (&out)[kWidth], float&) const {
    if constexpr (kPacked) {
      const Pack<uint8_t, kWidth> pack = *reinterpret_cast<const Pack<uint8_t, kWidth>*>(codes + r * cols + c);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) out[k] = pack.v[k];
    } else {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) out[k] = r < rows && c + k < cols ? codes[r * cols + c + k] : 0;
    }
  }
};

template <bool kPacked, typename Source>
__global__ void __launch_bounds__(kTileThreads)
    fp8_transpose_tiles_kernel(Source source, long long rows, long long cols, uint8_t* out, uint8_t* out_t,
                               float* amax) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  constexpr int kReadWidth = Source::kWidth;
  __shared__ __align__(16) uint8_t tile_t[kTile][kTilePitch];  // tile_t[column][row]
  source.prepare();
  float local = 0.0f;
  const long long c0 = static_cast<long long>(blockIdx.y) * kTile;
  const long long row_tiles = (rows + kTile - 1) / kTile;
  const int read_col = (threadIdx.x % (kTile / kReadWidth)) * kReadWidth, read_row = threadIdx.x / (kTile / kReadWidth);
  constexpr int kReadRowsPerPass = kTileThreads / (kTile / kReadWidth);
  const int write_col = threadIdx.x / (kTile / kWriteWidth), write_row = (threadIdx.x % (kTile / kWriteWidth)) * kWriteWidth;
  for (long long row_tile = blockIdx.x; row_tile < row_tiles; row_tile += gridDim.x) {
    const long long r0 = row_tile * kTile;
#pragma unroll
    for (int pass = 0; pass < kTile / kReadRowsPerPass; ++pass) {
      const int j = read_row + pass * kReadRowsPerPass;
      const long long r = r0 + j, c = c0 + read_col;
      if (kPacked && (r >= rows || c >= cols)) continue;
      Pack<uint8_t, kReadWidth> codes;
      source.template read<kPacked>(r, c, rows, cols, codes.v, local);
#pragma unroll
      for (int k = 0; k < kReadWidth; ++k) tile_t[read_col + k][j] = codes.v[k];
      if constexpr (kPacked) {
        if (out) *reinterpret_cast<Pack<uint8_t, kReadWidth>*>(out + r * cols + c) = codes;
      } else if (out) {
        for (int k = 0; k < kReadWidth; ++k)
          if (r < rows && c + k < cols) out[r * cols + c + k] = codes.v[k];
      }
    }
    __syncthreads();
    const long long c = c0 + write_col, r = r0 + write_row;
    if constexpr (kPacked) {
      if (c < cols && r < rows) {
        Pack<uint32_t, kWriteWidth / 4> words;
#pragma unroll
        for (int k = 0; k < kWriteWidth / 4; ++k)
          words.v[k] = *reinterpret_cast<const uint32_t*>(&tile_t[write_col][write_row + 4 * k]);
        *reinterpret_cast<Pack<uint32_t, kWriteWidth / 4>*>(out_t + c * rows + r) = words;
      }
    } else if (c < cols) {
      for (int k = 0; k < kWriteWidth && r + k < rows; ++k) out_t[c * rows + r + k] = tile_t[write_col][write_row + k];
    }
    __syncthreads();  // the tile is rewritten by the next step
  }
  if (amax) fold_block_amax(local, amax);
}

// Runs fp8_transpose_tiles_kernel over [rows, cols] (`input`: where the source reads, elements of `element_bytes`):
// about 8 blocks an SM in all (as many as fit), however the tiles split between rows and columns; the packed kernel
// where the shape and the pointers allow its wide accesses.
template <typename Source>
void launch_transpose_tiles(const char* what, const Source& source, const void* input, size_t element_bytes,
                            int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t, float* amax) {
  const long long col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
  HGRN_CHECK(col_tiles <= 65535, what, ": ", cols, " columns exceed ", 65535 * kTile);
  const long long row_blocks =
      std::clamp<long long>(8LL * cuda_device_properties().multiProcessorCount / col_tiles, 1, row_tiles);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(col_tiles));
  constexpr int kReadWidth = Source::kWidth;
  const auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const bool packed = cols % kReadWidth == 0 && rows % kWriteWidth == 0 && aligned(input, element_bytes * kReadWidth) &&
                      aligned(out, kReadWidth) && aligned(out_t, kWriteWidth);
  const auto kernel = packed ? fp8_transpose_tiles_kernel<true, Source> : fp8_transpose_tiles_kernel<false, Source>;
  launch_as_dependent(kernel, grid, dim3(kTileThreads), 0, source, rows, cols, out, out_t, amax);
  CUDA_CHECK_LAUNCH(what);
}

// fp8_record_amax then fp8_update_scale (ops/fp8.cpp), rule for rule, one tensor a warp: lane 0 folds the step's amax
// into the history, the lanes take the history's maximum together (fmaxf in any order gives the same maximum), lane 0
// moves the position on and sets the scale. scaled_max is fp8_max · 2^-margin, computed on the host as the CPU
// reference computes it.
__global__ void fp8_update_scales_kernel(float* amax_history, long long history_length, long long* positions,
                                         float* scales, float* step_amax, long long tensors, float scaled_max) {
  const long long t = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= tensors) return;  // whole warps: the block is a multiple of 32 threads
  float* history = amax_history + t * history_length;
  long long position = positions[t];
  if (step_amax && lane == 0) {
    history[position] = fmaxf(history[position], step_amax[t]);
    step_amax[t] = 0.0f;
  }
  __syncwarp();  // the other lanes read the folded slot
  if (history[position] == 0.0f) return;
  float amax = 0.0f;
  for (long long i = lane; i < history_length; i += 32) amax = fmaxf(amax, history[i]);
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (lane != 0) return;  // every lane's reads are done: the shuffles needed their values
  position = (position + 1) % history_length;
  positions[t] = position;
  history[position] = 0.0f;
  float scale = scales[t];
  if (isfinite(amax) && amax > 0.0f) scale = scaled_max / amax;  // IEEE division (no fast-math in device code)
  if (isinf(scale)) scale = FLT_MAX;
  scales[t] = scale;
}

__global__ void fp8_scale_inverses_kernel(const float* scales, float* inverses, long long n, long long stride) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i < n) inverses[i * stride] = 1.0f / scales[i];  // IEEE division, as fp8_scale_inverse
}

void check_cast_arguments(const char* what, const void* x, DType x_dtype, const float* scale, const void* out) {
  HGRN_CHECK(x_dtype == DType::F32 || x_dtype == DType::BF16, what, ": the input must be fp32 or bf16, got ",
             dtype_name(x_dtype));
  HGRN_CHECK(x && scale && out, what, ": null input, scale or output pointer");
}

}  // namespace

void cuda_fp8_quantize(const void* x, DType x_dtype, int64_t n, const float* scale, Fp8Format format, uint8_t* out,
                       float* amax) {
  HGRN_CHECK(n >= 0, "cuda_fp8_quantize: negative element count ", n);
  if (n == 0) return;
  check_cast_arguments("cuda_fp8_quantize", x, x_dtype, scale, out);
  HGRN_CUDA_DISPATCH_ACT(x_dtype, "cuda_fp8_quantize", [&] {
    const act_t* input = static_cast<const act_t*>(x);
    launch_packed<act_t>(n, {x, out}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      launch_as_dependent(fp8_quantize_kernel<V, act_t>, dim3(amax_grid(packs, kElementwiseThreads)),
                          dim3(kElementwiseThreads), 0, input + first, packs, scale, cuda_format(format), out + first,
                          amax);
      CUDA_CHECK_LAUNCH("fp8_quantize");
    });
  });
}

void cuda_fp8_quantize_transpose(const void* x, DType x_dtype, int64_t rows, int64_t cols, const float* scale,
                                 Fp8Format format, uint8_t* out, uint8_t* out_t, float* amax) {
  HGRN_CHECK(rows >= 0 && cols >= 0, "cuda_fp8_quantize_transpose: negative shape [", rows, ", ", cols, "]");
  if (rows == 0 || cols == 0) return;
  check_cast_arguments("cuda_fp8_quantize_transpose", x, x_dtype, scale, out_t);
  HGRN_CUDA_DISPATCH_ACT(x_dtype, "cuda_fp8_quantize_transpose", [&] {
    const CastCodes<act_t> source{static_cast<const act_t*>(x), scale, cuda_format(format)};
    launch_transpose_tiles("cuda_fp8_quantize_transpose", source, x, sizeof(act_t), rows, cols, out, out_t, amax);
  });
}

void cuda_fp8_transpose_codes(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* codes_t) {
  HGRN_CHECK(rows >= 0 && cols >= 0, "cuda_fp8_transpose_codes: negative shape [", rows, ", ", cols, "]");
  if (rows == 0 || cols == 0) return;
  HGRN_CHECK(codes && codes_t, "cuda_fp8_transpose_codes: null input or output pointer");
  launch_transpose_tiles("cuda_fp8_transpose_codes", StoredCodes{codes}, codes, 1, rows, cols, nullptr, codes_t,
                         nullptr);
}

void cuda_fp8_update_scales(float* amax_history, int64_t history_length, int64_t* positions, float* scales,
                            float* step_amax, int64_t tensors, Fp8Format format, int margin) {
  HGRN_CHECK(history_length >= 1, "fp8 amax history length: expected >= 1, got ", history_length);
  HGRN_CHECK(margin >= 0, "fp8 scaling margin: expected >= 0, got ", margin);
  HGRN_CHECK(tensors >= 0, "cuda_fp8_update_scales: negative tensor count ", tensors);
  if (tensors == 0) return;
  HGRN_CHECK(amax_history && positions && scales, "cuda_fp8_update_scales: null history, positions or scales");
  const float scaled_max = fp8_max_finite(format) * std::ldexp(1.0f, -margin);
  constexpr int threads = 128;  // 4 tensors a block, one a warp
  fp8_update_scales_kernel<<<grid_for(tensors * 32, threads), threads, 0, cuda_stream()>>>(
      amax_history, history_length, reinterpret_cast<long long*>(positions), scales, step_amax, tensors, scaled_max);
  CUDA_CHECK_LAUNCH("fp8_update_scales");
}

void cuda_fp8_scale_inverses(const float* scales, float* inverses, int64_t n, int64_t stride) {
  if (n <= 0) return;
  HGRN_CHECK(stride >= 1, "cuda_fp8_scale_inverses: stride ", stride, ": expected >= 1");
  constexpr int threads = 128;
  fp8_scale_inverses_kernel<<<grid_for(n, threads), threads, 0, cuda_stream()>>>(scales, inverses, n, stride);
  CUDA_CHECK_LAUNCH("fp8_scale_inverses");
}

}  // namespace hgrn
