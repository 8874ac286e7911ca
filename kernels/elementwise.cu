// elementwise.cu: the residual add and gradient accumulation (elementwise.h). One kernel serves both, since
// dst += src is add with the output aliasing the first input (each element is read and written by one thread); the
// scaled accumulation of an fp32 gradient into a gradient of either dtype; the product and the bias add.
#include "column_sums.cuh"
#include "core/tensor.h"
#include "cuda_check.h"
#include "elementwise.cuh"
#include "elementwise.h"

namespace hgrn {

namespace {
template <typename T, int V>
__global__ void add_kernel(const T* a, const T* b, T* y, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float av[V], bv[V];
    load_pack<V>(a, i, av);
    load_pack<V>(b, i, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) av[k] += bv[k];
    store_pack<V>(y, i, av);
  }
}
template <typename T, int V>
__global__ void scaled_accumulate_kernel(T* dst, const float* src, const float* scale, float factor, bool accumulate,
                                         long long packs) {
  const float a = scale[0] * factor;
  HGRN_FOR_EACH_PACK(i, packs) {
    float sv[V], dv[V];
    load_pack<V>(src, i, sv);
    if (accumulate) load_pack<V>(dst, i, dv);
#pragma unroll
    for (int k = 0; k < V; ++k) dv[k] = accumulate ? fmaf(a, sv[k], dv[k]) : a * sv[k];
    store_pack<V>(dst, i, dv);
  }
}
template <typename T, int V>
__global__ void mul_kernel(const T* a, const T* b, T* y, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float av[V], bv[V];
    load_pack<V>(a, i, av);
    load_pack<V>(b, i, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) av[k] *= bv[k];
    store_pack<V>(y, i, av);
  }
}

// p[i] (+)= v: adds to what is there when add, else overwrites.
template <int V, typename T>
__device__ __forceinline__ void write_pack(T* p, long long i, float (&v)[V], bool add) {
  if (add) {
    float old[V];
    load_pack<V>(p, i, old);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] += old[k];
  }
  store_pack<V>(p, i, v);
}

template <typename T, int V>
__global__ void mul_backward_kernel(const T* a, const T* b, const T* dy, T* da, T* db, bool add_a, bool add_b,
                                    long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float av[V], bv[V], dv[V], g[V];
    load_pack<V>(a, i, av);
    load_pack<V>(b, i, bv);
    load_pack<V>(dy, i, dv);
    if (da) {
#pragma unroll
      for (int k = 0; k < V; ++k) g[k] = dv[k] * bv[k];
      write_pack<V>(da, i, g, add_a);
    }
    if (db) {  // after da's store: with da == db this adds onto it
#pragma unroll
      for (int k = 0; k < V; ++k) g[k] = dv[k] * av[k];
      write_pack<V>(db, i, g, add_b);
    }
  }
}

// Elements [first, first + packs·V) of the flattened [rows, width] x: each adds its column's bias.
template <typename T, int V>
__global__ void add_bias_kernel(const T* x, const float* bias, T* y, long long first, long long packs,
                                long long width) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float v[V];
    load_pack<V>(x, i, v);
    const long long e = first + i * V;
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] += bias[(e + k) % width];
    store_pack<V>(y, i, v);
  }
}

}  // namespace

void cuda_add(const void* a, const void* b, void* y, int64_t n, DType dtype) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "add", [&] {
    const act_t* at = static_cast<const act_t*>(a);
    const act_t* bt = static_cast<const act_t*>(b);
    act_t* yt = static_cast<act_t*>(y);
    launch_packed<act_t>(n, {a, b, y}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      add_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
          at + first, bt + first, yt + first, packs);
      CUDA_CHECK_LAUNCH("add");
    });
  });
}

void cuda_accumulate(void* dst, const void* src, int64_t n, DType dtype) { cuda_add(dst, src, dst, n, dtype); }

void cuda_scaled_accumulate(void* dst, DType dst_dtype, const float* src, const float* scale, float factor,
                            bool accumulate, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dst_dtype, "scaled_accumulate", [&] {
    act_t* d = static_cast<act_t*>(dst);
    // Packs of 4: 16 bytes of the fp32 source, 8 or 16 of the destination.
    launch_packed<float>(n, {dst, src}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      scaled_accumulate_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0,
                                           cuda_stream()>>>(d + first, src + first, scale, factor, accumulate, packs);
      CUDA_CHECK_LAUNCH("scaled_accumulate");
    });
  });
}

void cuda_mul(const void* a, const void* b, void* y, int64_t n, DType dtype) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "mul", [&] {
    const act_t* at = static_cast<const act_t*>(a);
    const act_t* bt = static_cast<const act_t*>(b);
    act_t* yt = static_cast<act_t*>(y);
    launch_packed<act_t>(n, {a, b, y}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      mul_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
          at + first, bt + first, yt + first, packs);
      CUDA_CHECK_LAUNCH("mul");
    });
  });
}

void cuda_mul_backward(const void* a, const void* b, const void* dy, void* da, void* db, bool add_a, bool add_b,
                       int64_t n, DType dtype) {
  if (n == 0 || (!da && !db)) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "mul backward", [&] {
    const act_t* at = static_cast<const act_t*>(a);
    const act_t* bt = static_cast<const act_t*>(b);
    const act_t* dyt = static_cast<const act_t*>(dy);
    act_t* dat = static_cast<act_t*>(da);
    act_t* dbt = static_cast<act_t*>(db);
    launch_packed<act_t>(n, {a, b, dy, da, db}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      mul_backward_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
          at + first, bt + first, dyt + first, dat ? dat + first : nullptr, dbt ? dbt + first : nullptr, add_a, add_b,
          packs);
      CUDA_CHECK_LAUNCH("mul_backward");
    });
  });
}

void cuda_add_bias(const void* x, const float* bias, void* y, int64_t rows, int64_t width, DType dtype) {
  const int64_t n = rows * width;
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "add_bias", [&] {
    const act_t* xt = static_cast<const act_t*>(x);
    act_t* yt = static_cast<act_t*>(y);
    launch_packed<act_t>(n, {x, y}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      add_bias_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
          xt + first, bias, yt + first, first, packs, width);
      CUDA_CHECK_LAUNCH("add_bias");
    });
  });
}

void cuda_add_bias_backward(const void* dy, float* dbias, int64_t rows, int64_t width, DType dtype) {
  if (rows * width == 0) return;
  HGRN_CHECK(width <= 0x7fffffffLL, "add_bias backward: width ", width, " out of range");
  HGRN_CUDA_DISPATCH_ACT(dtype, "add_bias backward", [&] {
    Tensor partial = Tensor::empty({column_sum_chunks(rows), width}, DType::F32, Device::CUDA);
    add_column_sums(ElementTerm<act_t>{static_cast<const act_t*>(dy), static_cast<int>(width)},
                    static_cast<float*>(partial.raw_data()), dbias, rows, width, "add_bias_backward");
  });
}

}  // namespace hgrn
