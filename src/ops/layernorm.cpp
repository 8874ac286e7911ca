// layernorm.cpp: LayerNorm with weight and bias, forward and backward: the CPU reference here, the GPU through
// kernels/layernorm.h. With x̂ = (x − μ)·rstd,
// rstd = (var(x) + eps)^(-1/2) and u = dy ⊙ w:
//   dx = rstd · (u − mean(u) − x̂ · mean(u ⊙ x̂)),   dw = Σ_rows dy ⊙ x̂,   db = Σ_rows dy.
#include "ops/layernorm.h"

#include <cmath>
#include <vector>

#include "ops/cpu_parallel.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/layernorm.h"
#endif

namespace hgrn {
namespace {

template <typename T>
void layernorm_forward_cpu(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t width,
                           T eps) {
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * width;
    T sum = 0;
    for (int64_t c = 0; c < width; ++c) sum += xr[c];
    const T mu = sum / static_cast<T>(width);
    T sum_sq = 0;
    for (int64_t c = 0; c < width; ++c) sum_sq += (xr[c] - mu) * (xr[c] - mu);
    const T s = T(1) / std::sqrt(sum_sq / static_cast<T>(width) + eps);
    mean[r] = mu;
    rstd[r] = s;
    T* yr = y + r * width;
    for (int64_t c = 0; c < width; ++c) yr[c] = (xr[c] - mu) * s * (w ? w[c] : T(1)) + (b ? b[c] : T(0));
  }
}

// Accumulates dx (when non-null), dw and db (each when non-null) from dy. dw and db are sums over rows taken in fixed
// row blocks (one accumulator [2·width]: dw then db), so their bits do not depend on the thread count.
template <typename T>
void layernorm_backward_cpu(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, T* dx, T* dw, T* db,
                            int64_t rows, int64_t width) {
  std::vector<T> sums(static_cast<size_t>(2 * width), T(0));
  const bool reduce = dw || db;
  reduce_rows_in_fixed_blocks(rows, 2 * width, reduce ? sums.data() : nullptr, [&](int64_t r, T* partial) {
    const T* xr = x + r * width;
    const T* dyr = dy + r * width;
    const T mu = mean[r], s = rstd[r];
    if (dx) {
      T sum_u = 0, sum_ux = 0;
      for (int64_t c = 0; c < width; ++c) {
        const T u = dyr[c] * (w ? w[c] : T(1));
        sum_u += u;
        sum_ux += u * (xr[c] - mu) * s;
      }
      const T mean_u = sum_u / static_cast<T>(width), mean_ux = sum_ux / static_cast<T>(width);
      T* dxr = dx + r * width;
      for (int64_t c = 0; c < width; ++c)
        dxr[c] += s * (dyr[c] * (w ? w[c] : T(1)) - mean_u - (xr[c] - mu) * s * mean_ux);
    }
    if (partial)
      for (int64_t c = 0; c < width; ++c) {
        partial[c] += dyr[c] * (xr[c] - mu) * s;
        partial[width + c] += dyr[c];
      }
  });
  for (int64_t c = 0; c < width; ++c) {
    if (dw) dw[c] += sums[c];
    if (db) db[c] += sums[width + c];
  }
}

}  // namespace

Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, double eps) {
  HGRN_CHECK(x, "layernorm: input is null");
  const Tensor& xv = x->value;
  HGRN_CHECK(xv.dim() >= 1 && xv.size(-1) > 0, "layernorm: input must have a non-empty last axis, got ",
             shape_str(xv.shape()));
  HGRN_CHECK(xv.is_contiguous(), "layernorm: input must be contiguous");
  HGRN_CHECK(eps >= 0 && std::isfinite(eps), "layernorm: eps must be finite and non-negative, got ", eps);
  const int64_t width = xv.size(-1), rows = xv.numel() / width;
  const bool on_cuda = xv.device() == Device::CUDA;
  // On the GPU the weight, the bias and the saved statistics are fp32 whatever the activation dtype.
  const DType param_dtype = on_cuda ? DType::F32 : xv.dtype();
  for (const Var& p : {weight, bias}) {
    if (!p) continue;
    HGRN_CHECK(p->value.shape() == Shape{width} && p->value.is_contiguous(), "layernorm: ",
               p == weight ? "weight " : "bias ", shape_str(p->value.shape()), " does not match input ",
               shape_str(xv.shape()));
    HGRN_CHECK(p->value.device() == xv.device() && p->value.dtype() == param_dtype, "layernorm: input is ",
               dtype_name(xv.dtype()), " on ", device_name(xv.device()), ", ", p == weight ? "weight" : "bias",
               " is ", dtype_name(p->value.dtype()), " on ", device_name(p->value.device()), " (expected ",
               dtype_name(param_dtype), ")");
  }
  Tensor y = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
  Tensor mean = Tensor::empty({rows}, param_dtype, xv.device()), rstd = Tensor::empty({rows}, param_dtype, xv.device());
  if (on_cuda) {
#ifdef HGRN_WITH_CUDA
    cuda_layernorm_forward(xv.raw_data(), weight ? weight->value.data<float>() : nullptr,
                           bias ? bias->value.data<float>() : nullptr, y.raw_data(), mean.data<float>(),
                           rstd.data<float>(), rows, width, eps, xv.dtype());
#else
    throw Error("layernorm: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(xv.dtype(), "layernorm", [&] {
      layernorm_forward_cpu(xv.data<scalar_t>(), weight ? weight->value.data<scalar_t>() : nullptr,
                            bias ? bias->value.data<scalar_t>() : nullptr, y.data<scalar_t>(), mean.data<scalar_t>(),
                            rstd.data<scalar_t>(), rows, width, static_cast<scalar_t>(eps));
    });
  }
  Var out = op_output(tape, y, {x, weight, bias});
  if (!out->requires_grad) return out;
  tape.record([x, weight, bias, out, mean, rstd, rows, width] {
    if (!out->grad.defined()) return;
    if (out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
                 "layernorm backward: the output's gradient must be contiguous ", dtype_name(out->value.dtype()));
      // A fresh input gradient is written, an existing one added into; the parameters' are always accumulated.
      bool add = false;
      Tensor* dx = wants_grad(x) ? &grad_buffer_for_write(x, &add) : nullptr;
      float* dw = wants_grad(weight) ? grad_buffer(weight).data<float>() : nullptr;
      float* db = wants_grad(bias) ? grad_buffer(bias).data<float>() : nullptr;
      cuda_layernorm_backward(x->value.raw_data(), weight ? weight->value.data<float>() : nullptr, mean.data<float>(),
                              rstd.data<float>(), out->grad.raw_data(), dx ? dx->raw_data() : nullptr, add, dw, db,
                              rows, width, x->value.dtype());
#else
      throw Error("layernorm: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(x->value.dtype(), "layernorm backward", [&] {
      layernorm_backward_cpu(x->value.data<scalar_t>(), weight ? weight->value.data<scalar_t>() : nullptr,
                             mean.data<scalar_t>(), rstd.data<scalar_t>(), out->grad.data<scalar_t>(),
                             wants_grad(x) ? grad_buffer(x).data<scalar_t>() : nullptr,
                             wants_grad(weight) ? grad_buffer(weight).data<scalar_t>() : nullptr,
                             wants_grad(bias) ? grad_buffer(bias).data<scalar_t>() : nullptr, rows, width);
    });
  });
  return out;
}

}  // namespace hgrn
