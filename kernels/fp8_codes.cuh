// fp8_codes.cuh: the scaled FP8 cast of one value and the amax fold, shared by the cast kernels (fp8.cu) and the ops
// that write their output as FP8 codes (Fp8CodesOut: swiglu's). The cast is CUDA's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE, which ops/fp8.cpp's fp8_from_float mirrors bit for bit.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "dtype_cuda.cuh"
#include "elementwise.cuh"
#include "ops/fp8.h"

namespace hgrn {

__host__ __device__ inline __nv_fp8_interpretation_t cuda_format(Fp8Format format) {
  return format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

__device__ __forceinline__ uint8_t fp8_code(float x, __nv_fp8_interpretation_t format) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format);
}

// codes[k] = fp8_code(v[k] · scale) for k < V, two values per conversion instruction where V allows (fp8_code's
// bits: the paired cvt rounds each value alone), each |v[k]| folded into amax with fmaxf.
template <int V>
__device__ __forceinline__ void fp8_codes_of(const float (&v)[V], float scale, __nv_fp8_interpretation_t format,
                                             uint8_t (&codes)[V], float& amax) {
#pragma unroll
  for (int k = 0; k + 1 < V; k += 2) {
    amax = fmaxf(fmaxf(amax, fabsf(v[k])), fabsf(v[k + 1]));
    const __nv_fp8x2_storage_t pair =
        __nv_cvt_float2_to_fp8x2(make_float2(v[k] * scale, v[k + 1] * scale), __NV_SATFINITE, format);
    codes[k] = static_cast<uint8_t>(pair & 0xffu), codes[k + 1] = static_cast<uint8_t>(pair >> 8);
  }
  if constexpr (V % 2 == 1) {
    amax = fmaxf(amax, fabsf(v[V - 1]));
    codes[V - 1] = fp8_code(v[V - 1] * scale, format);
  }
}

// Folds the block's largest |x| (each thread's `local`, built with fmaxf so that NaNs are skipped) into *amax with
// one atomic per block. Non-negative floats order as their int bits, so an integer atomicMax is the float max.
// Every thread of the block must call it.
__device__ inline void fold_block_amax(float local, float* amax) {
  __shared__ float warp_max[32];
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  const int warps = (blockDim.x * blockDim.y + 31) / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, offset));
  if (thread % 32 == 0) warp_max[thread / 32] = local;
  __syncthreads();
  if (thread == 0) {
    float block_max = 0.0f;
    for (int w = 0; w < warps; ++w) block_max = fmaxf(block_max, warp_max[w]);
    if (block_max > 0.0f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(block_max));
  }
}

// Fp8CodesOut as a kernel uses it: the scale read once per thread, the format as CUDA names it.
struct DeviceCodesOut {
  uint8_t* codes;
  float scale;
  float* amax;
  __nv_fp8_interpretation_t format;
};
__device__ __forceinline__ DeviceCodesOut device_codes_out(const Fp8CodesOut& out) {
  return {out.codes, *out.scale, out.amax, cuda_format(out.format)};
}

// Stores the codes of V values of an act-dtype T output at codes[offset, offset + V): each value rounded to T first (the
// bits of casting the stored output), its |value| folded into `local`.
template <typename T, int V>
__device__ __forceinline__ void store_codes(const DeviceCodesOut& out, long long offset, const float (&v)[V],
                                            float& local) {
  float stored[V];
#pragma unroll
  for (int k = 0; k < V; ++k) stored[k] = v[k];
  round_to_stored<T, V>(stored);
  Pack<uint8_t, V> codes;
  fp8_codes_of<V>(stored, out.scale, out.format, codes.v, local);
  *reinterpret_cast<Pack<uint8_t, V>*>(out.codes + offset) = codes;
}

}  // namespace hgrn
