// activations.cu: silu and swiglu forward and backward (activations.h). silu is swiglu with up ≡ 1, so one kernel
// pair, templated on whether `up` exists, serves both. silu'(x) = σ(x) · (1 + x · (1 − σ(x))).
#include "activations.h"
#include "cuda_check.h"
#include "elementwise.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

template <typename T, int V, bool kHasUp>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* y, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float g[V], u[V];
    load_pack<V>(gate, i, g);
    if constexpr (kHasUp) load_pack<V>(up, i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      g[k] = g[k] * stable_sigmoid<T>(g[k]);
      if constexpr (kHasUp) g[k] *= u[k];
    }
    store_pack<V>(y, i, g);
  }
}

// add_gate / add_up: accumulate into dgate / dup, else overwrite them (a fresh, uninitialised buffer). dgate and dup
// may alias (swiglu(x, x)): dgate is stored before dup is read, by the same thread, so the second adds to the first.
// y (may be null, may alias dy): the forward's output again, silu(gate) ⊙ up, stored after dy's pack was read.
template <typename T, int V, bool kHasUp>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup, T* y,
                                       bool add_gate, bool add_up, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float g[V], u[V], d[V], s[V], acc[V];
    load_pack<V>(gate, i, g);
    load_pack<V>(dy, i, d);
    if constexpr (kHasUp) load_pack<V>(up, i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = stable_sigmoid<T>(g[k]);
    if (y) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        acc[k] = g[k] * s[k];
        if constexpr (kHasUp) acc[k] *= u[k];
      }
      store_pack<V>(y, i, acc);
    }
    if (dgate) {
      if (add_gate) load_pack<V>(dgate, i, acc);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float dyu = d[k];
        if constexpr (kHasUp) dyu *= u[k];
        const float v = silu_backward_value(g[k], s[k], dyu);
        acc[k] = add_gate ? acc[k] + v : v;
      }
      store_pack<V>(dgate, i, acc);
    }
    if constexpr (kHasUp) {
      if (dup) {
        if (add_up) load_pack<V>(dup, i, acc);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = d[k] * g[k] * s[k];
          acc[k] = add_up ? acc[k] + v : v;
        }
        store_pack<V>(dup, i, acc);
      }
    }
  }
}

// Calls f(std::integral_constant<bool, up != nullptr>{}).
template <typename F>
void with_has_up(const void* up, F&& f) {
  if (up)
    f(std::true_type{});
  else
    f(std::false_type{});
}
}  // namespace

void cuda_swiglu_forward(const void* gate, const void* up, void* y, int64_t n, DType dtype) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "swiglu", [&] {
    const act_t* g = static_cast<const act_t*>(gate);
    const act_t* u = static_cast<const act_t*>(up);
    act_t* yt = static_cast<act_t*>(y);
    with_has_up(up, [&](auto has_up) {
      launch_packed<act_t>(n, {gate, up, y}, [&](auto vec, int64_t first, int64_t packs) {
        constexpr int V = decltype(vec)::value;
        swiglu_forward_kernel<act_t, V, decltype(has_up)::value>
            <<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
                g + first, u ? u + first : nullptr, yt + first, packs);
        CUDA_CHECK_LAUNCH("swiglu_forward");
      });
    });
  });
}

void cuda_swiglu_backward(const void* gate, const void* up, const void* dy, void* dgate, void* dup, void* y,
                          bool add_gate, bool add_up, int64_t n, DType dtype) {
  HGRN_CHECK(up || !dup, "swiglu backward: a gradient for `up` was asked without an `up` input");
  if (n == 0 || (!dgate && !dup && !y)) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "swiglu backward", [&] {
    const act_t* g = static_cast<const act_t*>(gate);
    const act_t* u = static_cast<const act_t*>(up);
    const act_t* d = static_cast<const act_t*>(dy);
    act_t* dg = static_cast<act_t*>(dgate);
    act_t* du = static_cast<act_t*>(dup);
    act_t* yt = static_cast<act_t*>(y);
    with_has_up(up, [&](auto has_up) {
      launch_packed<act_t>(n, {gate, up, dy, dgate, dup, y}, [&](auto vec, int64_t first, int64_t packs) {
        constexpr int V = decltype(vec)::value;
        swiglu_backward_kernel<act_t, V, decltype(has_up)::value>
            <<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0, cuda_stream()>>>(
                g + first, u ? u + first : nullptr, d + first, dg ? dg + first : nullptr, du ? du + first : nullptr,
                yt ? yt + first : nullptr, add_gate, add_up, packs);
        CUDA_CHECK_LAUNCH("swiglu_backward");
      });
    });
  });
}

}  // namespace hgrn
