// rmsnorm.cpp: RMSNorm forward and backward.
// With x̂ = x·rstd, rstd = (mean(x²) + eps)^(-1/2), and u = dy ⊙ w (u = dy without a weight):
//   dx = rstd · (u − x̂ · mean(u ⊙ x̂)),   dw = Σ_rows dy ⊙ x̂.
#include "ops/rmsnorm.h"

#include <cmath>

#include "ops/cpu_parallel.h"

namespace hgrn {

template <typename T>
static void rmsnorm_forward_cpu(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t width, T eps) {
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * width;
    T* yr = y + r * width;
    T sum_sq = 0;
    for (int64_t c = 0; c < width; ++c) sum_sq += xr[c] * xr[c];
    const T s = T(1) / std::sqrt(sum_sq / static_cast<T>(width) + eps);
    rstd[r] = s;
    if (w) {
      for (int64_t c = 0; c < width; ++c) yr[c] = xr[c] * s * w[c];
    } else {
      for (int64_t c = 0; c < width; ++c) yr[c] = xr[c] * s;
    }
  }
}

// dx (when non-null) and dw (when non-null) are accumulated into. dw is a sum over rows, taken in fixed row blocks
// so that its bits do not depend on the thread count.
template <typename T>
static void rmsnorm_backward_cpu(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows,
                                 int64_t width) {
  reduce_rows_in_fixed_blocks(rows, width, dw, [&](int64_t r, T* dw_block) {
    const T* xr = x + r * width;
    const T* dyr = dy + r * width;
    const T s = rstd[r];
    if (dx) {
      T dot = 0;  // Σ_c u_c · x̂_c
      for (int64_t c = 0; c < width; ++c) dot += dyr[c] * (w ? w[c] : T(1)) * xr[c] * s;
      const T mean_dot = dot / static_cast<T>(width);
      T* dxr = dx + r * width;
      for (int64_t c = 0; c < width; ++c) {
        const T x_hat = xr[c] * s;
        dxr[c] += s * (dyr[c] * (w ? w[c] : T(1)) - x_hat * mean_dot);
      }
    }
    if (dw_block)
      for (int64_t c = 0; c < width; ++c) dw_block[c] += dyr[c] * xr[c] * s;
  });
}

Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps) {
  HGRN_CHECK(x, "rmsnorm: input is null");
  const Tensor& xv = x->value;
  HGRN_CHECK(xv.dim() >= 1 && xv.size(-1) > 0, "rmsnorm: input must have a non-empty last axis, got ",
             shape_str(xv.shape()));
  HGRN_CHECK(xv.device() == Device::CPU && xv.is_contiguous(), "rmsnorm: input must be a contiguous CPU tensor");
  HGRN_CHECK(eps >= 0 && std::isfinite(eps), "rmsnorm: eps must be finite and non-negative, got ", eps);
  const int64_t width = xv.size(-1), rows = xv.numel() / width;
  if (weight) {
    const Tensor& wv = weight->value;
    HGRN_CHECK(wv.dim() == 1 && wv.size(0) == width, "rmsnorm: weight ", shape_str(wv.shape()),
               " does not match input ", shape_str(xv.shape()));
    HGRN_CHECK(wv.dtype() == xv.dtype(), "rmsnorm: input is ", dtype_name(xv.dtype()), ", weight is ",
               dtype_name(wv.dtype()));
    HGRN_CHECK(wv.device() == Device::CPU && wv.is_contiguous(), "rmsnorm: weight must be a contiguous CPU tensor");
  }

  Tensor y = Tensor::empty(xv.shape(), xv.dtype());
  Tensor rstd = Tensor::empty({rows}, xv.dtype());
  HGRN_DISPATCH_FLOAT(xv.dtype(), "rmsnorm", [&] {
    rmsnorm_forward_cpu(xv.data<scalar_t>(), weight ? weight->value.data<scalar_t>() : nullptr, y.data<scalar_t>(),
                        rstd.data<scalar_t>(), rows, width, static_cast<scalar_t>(eps));
  });
  Var out = weight ? op_output(tape, y, {x, weight}) : op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, weight, out, rstd, rows, width] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "rmsnorm backward", [&] {
      rmsnorm_backward_cpu(x->value.data<scalar_t>(), weight ? weight->value.data<scalar_t>() : nullptr,
                           rstd.data<scalar_t>(), out->grad.data<scalar_t>(),
                           wants_grad(x) ? grad_buffer(x).data<scalar_t>() : nullptr,
                           wants_grad(weight) ? grad_buffer(weight).data<scalar_t>() : nullptr, rows, width);
    });
  });
  return out;
}

}  // namespace hgrn
