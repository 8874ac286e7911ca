// elementwise.cuh: what the elementwise kernels (elementwise.cu, activations.cu) share: 16-byte packed loads and
// stores of act-dtype elements (widened to fp32), and a launch that runs a kernel packed over the aligned bulk of an
// array and unpacked over what is left, so odd sizes and unaligned views still work; and the shared-memory layout in
// which warp kernels (rmsnorm.cu, small_batch_gemv.cu) keep packs as fp32.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cuda_context.h"
#include "dtype_cuda.cuh"

namespace hgrn {

// V elements of T moved as one aligned unit: V = 16 / sizeof(T) compiles to a single 128-bit load or store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Pack i of p (elements [i·V, i·V + V)) widened to fp32.
template <int V, typename T>
__device__ __forceinline__ void load_pack(const T* p, long long i, float (&out)[V]) {
  const Pack<T, V> pk = reinterpret_cast<const Pack<T, V>*>(p)[i];
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = load_f(pk.v[k]);
}

template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, long long i, const float (&in)[V]) {
  Pack<T, V> pk;
  store_f_pairs<T, V>(in, pk.v);
  reinterpret_cast<Pack<T, V>*>(p)[i] = pk;
}

// A shared-memory layout of fp32 values for warps whose lane l handles packs l, l + 32, …: a lane's V values of pack
// p (its pack 32·p + lane) lie as V / 4 float4s, slot (p·(V/4) + q)·32 + lane for float4 q, so that a warp's float4
// accesses are 512 contiguous bytes (conflict-free), where a lane-contiguous V-float layout (32-byte lane strides)
// takes two passes per access.
template <int V>
__device__ __forceinline__ int lane_slot(int p, int q, int lane) {
  return (p * (V / 4) + q) * 32 + lane;
}

// Calls f(std::true_type{}) or f(std::false_type{}) as flag is: a launcher's choice between a kernel's two builds.
template <typename F>
void with_flag(bool flag, F&& f) {
  if (flag)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The grid-stride loop over packs every elementwise kernel runs.
#define HGRN_FOR_EACH_PACK(i, packs)                                                         \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (packs); \
       i += (long long)gridDim.x * blockDim.x)

constexpr int kElementwiseThreads = 256;

// Splits n elements of T into a packed bulk and an unpacked tail and calls
// launch(std::integral_constant<int, V>{}, first_element, packs) for each non-empty part. Packing needs every
// (non-null) pointer 16-byte aligned; otherwise everything runs unpacked.
template <typename T, typename Launch>
void launch_packed(int64_t n, std::initializer_list<const void*> pointers, Launch&& launch) {
  constexpr int V = 16 / sizeof(T);
  bool aligned = true;
  for (const void* p : pointers) aligned = aligned && (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0);
  const int64_t bulk = aligned ? n / V * V : 0;
  if (bulk > 0) launch(std::integral_constant<int, V>{}, int64_t{0}, bulk / V);
  if (n > bulk) launch(std::integral_constant<int, 1>{}, bulk, n - bulk);
}

}  // namespace hgrn
