// activations.cu: silu and swiglu forward and backward (activations.h). silu is swiglu with up ≡ 1, so one kernel
// pair, templated on whether `up` exists, serves both. silu'(x) = σ(x) · (1 + x · (1 − σ(x))). And the sigmoid,
// σ'(x) = σ(x) · (1 − σ(x)), over contiguous elements.
#include "activations.h"

#include <algorithm>

#include "cuda_check.h"
#include "dependent_launch.cuh"
#include "elementwise.cuh"
#include "fp8_codes.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

// The rows of one problem in packs of V elements (strides in elements, multiples of V): thread (x, y) of a block
// takes pack blockIdx.x·blockDim.x + x of rows blockIdx.y·blockDim.y + y, then every gridDim.y·blockDim.y-th row.
struct Rows {
  long long rows, packs;  // packs per row
  long long width, gate, up, dgate, dup;  // row strides in elements: y/dy (= width), gate, up, dgate, dup
  long long codes_width, dgate_column, dup_column;  // the gradient codes' matrix (SwigluRows)
};

// kCodes: the output as FP8 codes (Fp8CodesOut: contiguous [rows, width]) with its amax folded, in place of y. Every
// thread reaches the block's amax fold, so the loop does not return early.
template <typename T, int V, bool kHasUp, bool kCodes>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* y, Fp8CodesOut codes_out, Rows R) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  DeviceCodesOut out{};
  if constexpr (kCodes) out = device_codes_out(codes_out);
  float local = 0.0f;
  if (i < R.packs) {
    for (long long r = blockIdx.y * (long long)blockDim.y + threadIdx.y; r < R.rows;
         r += (long long)gridDim.y * blockDim.y) {
      float g[V], u[V];
      load_pack<V>(gate + r * R.gate, i, g);
      if constexpr (kHasUp) load_pack<V>(up + r * R.up, i, u);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        g[k] = g[k] * stable_sigmoid<T>(g[k]);
        if constexpr (kHasUp) g[k] *= u[k];
      }
      if constexpr (kCodes)
        store_codes<T, V>(out, r * R.width + i * V, g, local);
      else
        store_pack<V>(y + r * R.width, i, g);
    }
  }
  if constexpr (kCodes) {
    if (out.amax) fold_block_amax(local, out.amax);
  }
}

// add_gate / add_up: accumulate into dgate / dup, else overwrite them (a fresh, uninitialised buffer). dgate and dup
// may alias (swiglu(x, x)): dgate is stored before dup is read, by the same thread, so the second adds to the first.
// y (may be null, may alias dy): the forward's output again, silu(gate) ⊙ up, stored after dy's pack was read; with
// kCodes as FP8 codes instead (no amax: the backward's cast reuses the forward's scale and records nothing).
// kGradCodes: dgate and dup as FP8 codes (gradient_out) in their columns of one code matrix, their amax folded; every
// thread reaches the fold, so the loop does not return early.
template <typename T, int V, bool kHasUp, bool kCodes, bool kGradCodes>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup, T* y,
                                       Fp8CodesOut codes_out, Fp8CodesOut gradient_out, bool add_gate, bool add_up,
                                       Rows R) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  DeviceCodesOut out{}, grad_out{};
  if constexpr (kCodes) out = device_codes_out(codes_out);
  if constexpr (kGradCodes) grad_out = device_codes_out(gradient_out);
  float grad_amax = 0.0f;
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (long long r = blockIdx.y * (long long)blockDim.y + threadIdx.y; i < R.packs && r < R.rows;
       r += (long long)gridDim.y * blockDim.y) {
    float g[V], u[V], d[V], s[V], acc[V];
    load_pack<V>(gate + r * R.gate, i, g);
    load_pack<V>(dy + r * R.width, i, d);
    if constexpr (kHasUp) load_pack<V>(up + r * R.up, i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = stable_sigmoid<T>(g[k]);
    if (kCodes || y) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        acc[k] = g[k] * s[k];
        if constexpr (kHasUp) acc[k] *= u[k];
      }
      if constexpr (kCodes) {
        float unused = 0.0f;
        store_codes<T, V>(out, r * R.width + i * V, acc, unused);
      } else {
        store_pack<V>(y + r * R.width, i, acc);
      }
    }
    if (kGradCodes || dgate) {
      T* dg = kGradCodes ? nullptr : dgate + r * R.dgate;
      if (!kGradCodes && add_gate) load_pack<V>(dg, i, acc);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float dyu = d[k];
        if constexpr (kHasUp) dyu *= u[k];
        const float v = silu_backward_value(g[k], s[k], dyu);
        acc[k] = !kGradCodes && add_gate ? accumulated(acc[k], v) : v;
      }
      if constexpr (kGradCodes)
        store_codes<T, V>(grad_out, r * R.codes_width + R.dgate_column + i * V, acc, grad_amax);
      else
        store_pack<V>(dg, i, acc);
    }
    if constexpr (kHasUp) {
      if (kGradCodes || dup) {
        T* du = kGradCodes ? nullptr : dup + r * R.dup;
        if (!kGradCodes && add_up) load_pack<V>(du, i, acc);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = d[k] * g[k] * s[k];
          acc[k] = !kGradCodes && add_up ? accumulated(acc[k], v) : v;
        }
        if constexpr (kGradCodes)
          store_codes<T, V>(grad_out, r * R.codes_width + R.dup_column + i * V, acc, grad_amax);
        else
          store_pack<V>(du, i, acc);
      }
    }
  }
  if constexpr (kGradCodes) {
    if (grad_out.amax) fold_block_amax(grad_amax, grad_out.amax);
  }
}

// Launches kernel(V, grid, block, rows) over `shape`: 16-byte packs where the width, every stride and every pointer
// allow, else single elements. The block's x threads cover a row's packs with the least overshoot (a width of 352
// packs: 11 × 32, not 2 × 256); its y threads and the grid's y blocks walk the rows. few_blocks: about 16 blocks an
// SM in all, each walking more rows (a kernel that folds an amax with one atomic per block).
template <typename T, typename Launch>
void launch_rows(const SwigluRows& shape, std::initializer_list<const void*> pointers, Launch&& launch,
                 bool few_blocks = false) {
  constexpr int kPack = 16 / sizeof(T);
  const auto stride = [&](int64_t s) { return s ? s : shape.width; };
  Rows R{shape.rows, 0, shape.width, stride(shape.gate_stride), stride(shape.up_stride), stride(shape.dgate_stride),
         stride(shape.dup_stride), shape.codes_width, shape.dgate_column, shape.dup_column};
  bool packed = shape.width % kPack == 0;
  for (long long s : {R.gate, R.up, R.dgate, R.dup, R.codes_width, R.dgate_column, R.dup_column})
    packed = packed && s % kPack == 0;
  for (const void* p : pointers) packed = packed && (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0);
  const int vec = packed ? kPack : 1;
  R.packs = shape.width / vec;
  int tx = kElementwiseThreads;
  for (int t : {128, 64, 32})
    if ((R.packs + t - 1) / t * t < (R.packs + tx - 1) / tx * tx) tx = t;
  const int ty = kElementwiseThreads / tx;
  const long long col_blocks = (R.packs + tx - 1) / tx, row_blocks = (R.rows + ty - 1) / ty;
  HGRN_CHECK(col_blocks <= 0x7fffffffLL, "swiglu: a row of ", shape.width, " elements exceeds the launch grid");
  const long long max_row_blocks =
      few_blocks ? std::max<long long>(1, 16LL * cuda_device_properties().multiProcessorCount / col_blocks) : 65535;
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(std::min({row_blocks, max_row_blocks, 65535LL})));
  if (packed)
    launch(std::integral_constant<int, kPack>{}, grid, dim3(tx, ty), R);
  else
    launch(std::integral_constant<int, 1>{}, grid, dim3(tx, ty), R);
}
template <typename T, int V>
__global__ void sigmoid_forward_kernel(const T* x, T* y, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float v[V];
    load_pack<V>(x, i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = stable_sigmoid<T>(v[k]);
    store_pack<V>(y, i, v);
  }
}

template <typename T, int V>
__global__ void sigmoid_backward_kernel(const T* y, const T* dy, T* dx, bool add, long long packs) {
  HGRN_FOR_EACH_PACK(i, packs) {
    float yv[V], dv[V], acc[V];
    load_pack<V>(y, i, yv);
    load_pack<V>(dy, i, dv);
    if (add) load_pack<V>(dx, i, acc);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float g = dv[k] * yv[k] * (1.f - yv[k]);
      acc[k] = add ? acc[k] + g : g;
    }
    store_pack<V>(dx, i, acc);
  }
}
template <typename In, typename Out>
__global__ void log_sigmoid_forward_kernel(const In* x, Out* y, float divisor, long long n) {
  HGRN_FOR_EACH_PACK(i, n) y[i] = store_f<Out>(log_sigmoid_value(load_f(x[i])) / divisor);
}

// σ(−x) = e^{−|x|} / (1 + e^{−|x|}) for x >= 0, 1 / (1 + e^{−|x|}) otherwise.
template <typename In, typename Grad>
__global__ void log_sigmoid_backward_kernel(const In* x, const Grad* dy, In* dx, bool add, float divisor,
                                            long long n) {
  HGRN_FOR_EACH_PACK(i, n) {
    const float v = load_f(x[i]), e = expf(-fabsf(v));
    const float g = load_f(dy[i]) * ((v >= 0.f ? e : 1.f) / (1.f + e)) / divisor;
    dx[i] = store_f<In>(add ? load_f(dx[i]) + g : g);
  }
}

// Calls f with out_t = act_t or float, as `dtype` (act_t's or fp32) says.
template <typename Act, typename F>
void with_output_dtype(DType dtype, DType act, const char* name, F&& f) {
  if (dtype == DType::F32) {
    f(float{});
  } else if (dtype == act) {
    f(Act{});
  } else {
    throw Error(std::string(name) + ": output dtype " + dtype_name(dtype) + " for " + dtype_name(act) +
                " input (expected the input's or fp32)");
  }
}
}  // namespace

void cuda_log_sigmoid_forward(const void* x, DType x_dtype, void* y, DType y_dtype, float divisor, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(x_dtype, "log_sigmoid", [&] {
    with_output_dtype<act_t>(y_dtype, x_dtype, "log_sigmoid", [&](auto out) {
      using out_t = decltype(out);
      log_sigmoid_forward_kernel<act_t, out_t><<<grid_for(n, kElementwiseThreads), kElementwiseThreads, 0,
                                                 cuda_stream()>>>(static_cast<const act_t*>(x),
                                                                  static_cast<out_t*>(y), divisor, n);
      CUDA_CHECK_LAUNCH("log_sigmoid_forward");
    });
  });
}

void cuda_log_sigmoid_backward(const void* x, DType x_dtype, const void* dy, DType dy_dtype, void* dx, bool add,
                               float divisor, int64_t n) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(x_dtype, "log_sigmoid backward", [&] {
    with_output_dtype<act_t>(dy_dtype, x_dtype, "log_sigmoid backward", [&](auto grad) {
      using grad_t = decltype(grad);
      log_sigmoid_backward_kernel<act_t, grad_t><<<grid_for(n, kElementwiseThreads), kElementwiseThreads, 0,
                                                   cuda_stream()>>>(static_cast<const act_t*>(x),
                                                                    static_cast<const grad_t*>(dy),
                                                                    static_cast<act_t*>(dx), add, divisor, n);
      CUDA_CHECK_LAUNCH("log_sigmoid_backward");
    });
  });
}

void cuda_sigmoid_forward(const void* x, void* y, int64_t n, DType dtype) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "sigmoid", [&] {
    const act_t* xt = static_cast<const act_t*>(x);
    act_t* yt = static_cast<act_t*>(y);
    launch_packed<act_t>(n, {x, y}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      sigmoid_forward_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0,
                                         cuda_stream()>>>(xt + first, yt + first, packs);
      CUDA_CHECK_LAUNCH("sigmoid_forward");
    });
  });
}

void cuda_sigmoid_backward(const void* y, const void* dy, void* dx, bool add, int64_t n, DType dtype) {
  if (n == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "sigmoid backward", [&] {
    const act_t* yt = static_cast<const act_t*>(y);
    const act_t* dyt = static_cast<const act_t*>(dy);
    act_t* dxt = static_cast<act_t*>(dx);
    launch_packed<act_t>(n, {y, dy, dx}, [&](auto vec, int64_t first, int64_t packs) {
      constexpr int V = decltype(vec)::value;
      sigmoid_backward_kernel<act_t, V><<<grid_for(packs, kElementwiseThreads), kElementwiseThreads, 0,
                                          cuda_stream()>>>(yt + first, dyt + first, dxt + first, add, packs);
      CUDA_CHECK_LAUNCH("sigmoid_backward");
    });
  });
}

void cuda_swiglu_forward(const void* gate, const void* up, void* y, const SwigluRows& shape, DType dtype,
                         const Fp8CodesOut* codes) {
  HGRN_CHECK(!codes || (up && codes->codes && codes->scale), "swiglu: FP8 codes need up, a buffer and a scale");
  if (shape.rows * shape.width == 0) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "swiglu", [&] {
    with_flag(up != nullptr, [&](auto has_up) {
      with_flag(codes != nullptr, [&](auto to_codes) {
        launch_rows<act_t>(
            shape, {gate, up, y, codes ? codes->codes : nullptr},
            [&](auto vec, dim3 grid, dim3 block, const Rows& R) {
              launch_as_dependent(
                  swiglu_forward_kernel<act_t, decltype(vec)::value, decltype(has_up)::value, decltype(to_codes)::value>,
                  grid, block, 0, static_cast<const act_t*>(gate), static_cast<const act_t*>(up),
                  static_cast<act_t*>(y), codes ? *codes : Fp8CodesOut{}, R);
              CUDA_CHECK_LAUNCH("swiglu_forward");
            },
            /*few_blocks=*/codes && codes->amax);
      });
    });
  });
}

void cuda_swiglu_backward(const void* gate, const void* up, const void* dy, void* dgate, void* dup, void* y,
                          bool add_gate, bool add_up, const SwigluRows& shape, DType dtype, const Fp8CodesOut* codes,
                          const Fp8CodesOut* gradient_codes) {
  HGRN_CHECK(up || !dup, "swiglu backward: a gradient for `up` was asked without an `up` input");
  HGRN_CHECK(!codes || (up && !y && codes->codes && codes->scale && !codes->amax),
             "swiglu backward: FP8 codes of the output need up, a buffer and a scale, and replace y (no amax)");
  HGRN_CHECK(!gradient_codes || (up && !dgate && !dup && !add_gate && !add_up && gradient_codes->codes &&
                                 gradient_codes->scale && shape.codes_width >= 2 * shape.width),
             "swiglu backward: FP8 codes of the gradients need up, a buffer, a scale and a code matrix that holds "
             "both, and replace dgate and dup");
  if (shape.rows * shape.width == 0 || (!dgate && !dup && !y && !codes && !gradient_codes)) return;
  HGRN_CUDA_DISPATCH_ACT(dtype, "swiglu backward", [&] {
    with_flag(up != nullptr, [&](auto has_up) {
      with_flag(codes != nullptr, [&](auto to_codes) {
        with_flag(gradient_codes != nullptr, [&](auto gradient_to_codes) {
          launch_rows<act_t>(
              shape,
              {gate, up, dy, dgate, dup, y, codes ? codes->codes : nullptr,
               gradient_codes ? gradient_codes->codes : nullptr},
              [&](auto vec, dim3 grid, dim3 block, const Rows& R) {
                launch_as_dependent(swiglu_backward_kernel<act_t, decltype(vec)::value, decltype(has_up)::value,
                                                           decltype(to_codes)::value, decltype(gradient_to_codes)::value>,
                                    grid, block, 0, static_cast<const act_t*>(gate), static_cast<const act_t*>(up),
                                    static_cast<const act_t*>(dy), static_cast<act_t*>(dgate),
                                    static_cast<act_t*>(dup), static_cast<act_t*>(y), codes ? *codes : Fp8CodesOut{},
                                    gradient_codes ? *gradient_codes : Fp8CodesOut{}, add_gate, add_up, R);
                CUDA_CHECK_LAUNCH("swiglu_backward");
              },
              /*few_blocks=*/gradient_codes && gradient_codes->amax);
        });
      });
    });
  });
}

}  // namespace hgrn
