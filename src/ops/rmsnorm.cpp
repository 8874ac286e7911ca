// rmsnorm.cpp: RMSNorm and the fused add + RMSNorm, forward and backward: the CPU reference here, the GPU through
// kernels/rmsnorm.h. With x̂ = x·rstd, rstd = (mean(x²) + eps)^(-1/2), and u = dy ⊙ w (u = dy without a weight):
//   dx = rstd · (u − x̂ · mean(u ⊙ x̂)),   dw = Σ_rows dy ⊙ x̂.
// add_rmsnorm normalises s = residual + delta; s's gradient is its own (dsum) plus dx above, and flows unchanged to
// residual and delta. Both ops share one forward and one backward, with the add's parts null for plain rmsnorm.
#include "ops/rmsnorm.h"

#include <cmath>

#include "ops/cpu_parallel.h"
#include "ops/recompute.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/rmsnorm.h"
#endif

namespace hgrn {

// Row r of the op's output, y = (x · rstd) · w (w null: x · rstd): the forward's, and the backward's when it writes
// the output again, so both give the same bits.
template <typename T>
static void normalized_row(const T* xr, T s, const T* w, T* yr, int64_t width) {
  if (w) {
    for (int64_t c = 0; c < width; ++c) yr[c] = xr[c] * s * w[c];
  } else {
    for (int64_t c = 0; c < width; ++c) yr[c] = xr[c] * s;
  }
}

// delta non-null (add_rmsnorm): sum = x + delta is written and normalised instead of x.
template <typename T>
static void rmsnorm_forward_cpu(const T* x, const T* delta, T* sum, const T* w, T* y, T* rstd, int64_t rows,
                                int64_t width, T eps) {
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * width;
    if (delta) {
      T* sr = sum + r * width;
      const T* dr = delta + r * width;
      for (int64_t c = 0; c < width; ++c) sr[c] = xr[c] + dr[c];
      xr = sr;
    }
    T sum_sq = 0;
    for (int64_t c = 0; c < width; ++c) sum_sq += xr[c] * xr[c];
    const T s = T(1) / std::sqrt(sum_sq / static_cast<T>(width) + eps);
    rstd[r] = s;
    normalized_row(xr, s, w, y + r * width, width);
  }
}

// With g = dx (from dy; 0 when dy is null: no gradient reached y) + dsum (when non-null), accumulates dx0 += g and
// dx1 += g (each when non-null) and dw += Σ_rows dy ⊙ x̂ (when dw and dy are non-null). dw is a sum over rows, taken
// in fixed row blocks so that its bits do not depend on the thread count. y non-null: the forward's output written
// again by the forward's normalized_row (the same bits), for a caller that freed it (release_until_producer_backward).
template <typename T>
static void rmsnorm_backward_cpu(const T* x, const T* w, const T* rstd, const T* dy, const T* dsum, T* dx0, T* dx1,
                                 T* dw, T* y, int64_t rows, int64_t width) {
  reduce_rows_in_fixed_blocks(rows, width, dy ? dw : nullptr, [&](int64_t r, T* dw_block) {
    const T* xr = x + r * width;
    const T* dyr = dy ? dy + r * width : nullptr;
    const T s = rstd[r];
    if (y) normalized_row(xr, s, w, y + r * width, width);
    if (dx0 || dx1) {
      T mean_dot = 0;
      if (dyr) {
        T dot = 0;  // Σ_c u_c · x̂_c
        for (int64_t c = 0; c < width; ++c) dot += dyr[c] * (w ? w[c] : T(1)) * xr[c] * s;
        mean_dot = dot / static_cast<T>(width);
      }
      const T* dsr = dsum ? dsum + r * width : nullptr;
      T* dx0r = dx0 ? dx0 + r * width : nullptr;
      T* dx1r = dx1 ? dx1 + r * width : nullptr;
      for (int64_t c = 0; c < width; ++c) {
        const T x_hat = xr[c] * s;
        T g = dyr ? s * (dyr[c] * (w ? w[c] : T(1)) - x_hat * mean_dot) : T(0);
        if (dsr) g += dsr[c];
        if (dx0r) dx0r[c] += g;
        if (dx1r) dx1r[c] += g;
      }
    }
    if (dw_block)
      for (int64_t c = 0; c < width; ++c) dw_block[c] += dyr[c] * xr[c] * s;
  });
}

// x is the tensor normalised; weight may be null. On the GPU x is fp32 or bf16 and the weight fp32.
static void check_norm_args(const char* op, const Tensor& xv, const Var& weight, double eps) {
  HGRN_CHECK(xv.dim() >= 1 && xv.size(-1) > 0, op, ": input must have a non-empty last axis, got ",
             shape_str(xv.shape()));
  HGRN_CHECK(xv.is_contiguous(), op, ": input must be contiguous");
  HGRN_CHECK(eps >= 0 && std::isfinite(eps), op, ": eps must be finite and non-negative, got ", eps);
  if (!weight) return;
  const Tensor& wv = weight->value;
  HGRN_CHECK(wv.dim() == 1 && wv.size(0) == xv.size(-1), op, ": weight ", shape_str(wv.shape()),
             " does not match input ", shape_str(xv.shape()));
  HGRN_CHECK(wv.device() == xv.device() && wv.is_contiguous(), op, ": weight must be a contiguous ",
             device_name(xv.device()), " tensor, as the input is");
  if (xv.device() == Device::CPU) {
    HGRN_CHECK(wv.dtype() == xv.dtype(), op, ": input is ", dtype_name(xv.dtype()), ", weight is ",
               dtype_name(wv.dtype()));
  } else {
    HGRN_CHECK(wv.dtype() == DType::F32, op, ": a GPU weight (a parameter) must be fp32, got ",
               dtype_name(wv.dtype()));
  }
}

// The forward on x's device; delta and sum are null for plain rmsnorm. rstd is x's dtype on the CPU, fp32 on the GPU.
static void norm_forward(const Tensor& x, const Tensor* delta, Tensor* sum, const Var& weight, Tensor& y,
                         Tensor& rstd, int64_t rows, int64_t width, double eps) {
  const Tensor* w = weight ? &weight->value : nullptr;
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_rmsnorm_forward(x.raw_data(), delta ? delta->raw_data() : nullptr, sum ? sum->raw_data() : nullptr,
                         w ? w->data<float>() : nullptr, y.raw_data(), rstd.data<float>(), rows, width, eps,
                         x.dtype());
    return;
#else
    throw Error("rmsnorm: this hgrn was built without CUDA");
#endif
  }
  HGRN_DISPATCH_FLOAT(x.dtype(), "rmsnorm", [&] {
    rmsnorm_forward_cpu(x.data<scalar_t>(), delta ? delta->data<scalar_t>() : nullptr,
                        sum ? sum->data<scalar_t>() : nullptr, w ? w->data<scalar_t>() : nullptr, y.data<scalar_t>(),
                        rstd.data<scalar_t>(), rows, width, static_cast<scalar_t>(eps));
  });
}

// The backward on x's device into the gradients of in0 and in1 (rmsnorm's x, or add_rmsnorm's residual and
// delta; each only when it wants one, in1 null for rmsnorm) and of the weight when dw_wanted (see
// rmsnorm_backward_cpu for the maths; every gradient has x's dtype except dw, which has the weight's). The CPU
// accumulates into grad_buffer. The GPU overwrites an input gradient it sees first (grad_buffer_for_write: no zero
// fill to write and read back), asking for in0's buffer before in1's, the order the kernel writes them in, so that
// add_rmsnorm(x, x) adds the second contribution onto the first. dw always accumulates (a parameter gradient).
// y non-null: the op's output written again (see rmsnorm_backward_cpu).
static void norm_backward(const Tensor& x, const Var& weight, const Tensor& rstd, const Tensor* dy,
                          const Tensor* dsum, const Var& in0, const Var& in1, bool dw_wanted, Tensor* y, int64_t rows,
                          int64_t width) {
  const auto check_grad = [&](const Tensor* g) {
    HGRN_CHECK(!g || (g->dtype() == x.dtype() && g->device() == x.device() && g->numel() == x.numel() &&
                      g->is_contiguous()),
               "rmsnorm backward: a gradient does not match the ", dtype_name(x.dtype()), " input");
  };
  check_grad(dy);
  check_grad(dsum);
  const Tensor* w = weight ? &weight->value : nullptr;
  // add_rmsnorm's residual and delta get the same gradient: one buffer for both where both are fresh (the usual
  // case: a residual stream and a branch output), written once.
  const bool shared = wants_grad(in0) && wants_grad(in1) && share_fresh_gradient(in0, in1, x.device() == Device::CPU);
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    bool add0 = false, add1 = false;
    Tensor* dx0 = shared ? &in0->grad : wants_grad(in0) ? &grad_buffer_for_write(in0, &add0) : nullptr;
    Tensor* dx1 = !shared && wants_grad(in1) ? &grad_buffer_for_write(in1, &add1) : nullptr;
    Tensor* dw = dw_wanted ? &grad_buffer(weight) : nullptr;
    check_grad(dx0);
    check_grad(dx1);
    cuda_rmsnorm_backward(x.raw_data(), w ? w->data<float>() : nullptr, rstd.data<float>(),
                          dy ? dy->raw_data() : nullptr, dsum ? dsum->raw_data() : nullptr,
                          dx0 ? dx0->raw_data() : nullptr, dx1 ? dx1->raw_data() : nullptr, add0, add1,
                          dw ? dw->data<float>() : nullptr, y ? y->raw_data() : nullptr, rows, width, x.dtype());
    return;
#else
    throw Error("rmsnorm: this hgrn was built without CUDA");
#endif
  }
  Tensor* dx0 = shared ? &in0->grad : wants_grad(in0) ? &grad_buffer(in0) : nullptr;
  Tensor* dx1 = !shared && wants_grad(in1) ? &grad_buffer(in1) : nullptr;
  Tensor* dw = dw_wanted ? &grad_buffer(weight) : nullptr;
  check_grad(dx0);
  check_grad(dx1);
  HGRN_DISPATCH_FLOAT(x.dtype(), "rmsnorm backward", [&] {
    rmsnorm_backward_cpu(x.data<scalar_t>(), w ? w->data<scalar_t>() : nullptr, rstd.data<scalar_t>(),
                         dy ? dy->data<scalar_t>() : nullptr, dsum ? dsum->data<scalar_t>() : nullptr,
                         dx0 ? dx0->data<scalar_t>() : nullptr, dx1 ? dx1->data<scalar_t>() : nullptr,
                         dw ? dw->data<scalar_t>() : nullptr, y ? y->data<scalar_t>() : nullptr, rows, width);
  });
}

static Tensor empty_rstd(const Tensor& x, int64_t rows) {
  return Tensor::empty({rows}, x.device() == Device::CUDA ? DType::F32 : x.dtype(), x.device());
}

// The output's value, when the model freed it until this backward (release_until_producer_backward) and some
// consumer's backward waits for it: a buffer for norm_backward to write it into, else an undefined tensor.
static Tensor output_to_restore(const Var& out) {
  if (!out->restored_by_producer || out->waiting_for_value.empty()) return Tensor();
  return Tensor::empty(out->released.shape, out->released.dtype, out->released.device);
}

Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps) {
  HGRN_CHECK(x, "rmsnorm: input is null");
  const Tensor& xv = x->value;
  check_norm_args("rmsnorm", xv, weight, eps);
  const int64_t width = xv.size(-1), rows = xv.numel() / width;
  Tensor y = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
  Tensor rstd = empty_rstd(xv, rows);
  norm_forward(xv, nullptr, nullptr, weight, y, rstd, rows, width, eps);
  Var out = weight ? op_output(tape, y, {x, weight}) : op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, weight, out, rstd, rows, width] {
    Tensor y = output_to_restore(out);
    const Tensor* dy = out->grad.defined() ? &out->grad : nullptr;
    if (!dy && !y.defined()) return;
    norm_backward(x->value, weight, rstd, dy, nullptr, dy ? x : nullptr, nullptr, dy && wants_grad(weight),
                  y.defined() ? &y : nullptr, rows, width);
    if (y.defined()) restore_value(out, std::move(y));
  });
  return out;
}

AddRmsNormResult add_rmsnorm(Tape& tape, const Var& residual, const Var& delta, const Var& weight, double eps) {
  HGRN_CHECK(residual && delta, "add_rmsnorm: input is null");
  const Tensor& rv = residual->value;
  const Tensor& dv = delta->value;
  HGRN_CHECK(rv.shape() == dv.shape(), "add_rmsnorm: residual ", shape_str(rv.shape()), " and delta ",
             shape_str(dv.shape()), " differ in shape");
  HGRN_CHECK(rv.dtype() == dv.dtype() && rv.device() == dv.device(), "add_rmsnorm: residual is ",
             dtype_name(rv.dtype()), " on ", device_name(rv.device()), ", delta is ", dtype_name(dv.dtype()), " on ",
             device_name(dv.device()));
  HGRN_CHECK(dv.is_contiguous(), "add_rmsnorm: delta must be contiguous");
  check_norm_args("add_rmsnorm", rv, weight, eps);
  const int64_t width = rv.size(-1), rows = rv.numel() / width;
  Tensor sum = Tensor::empty(rv.shape(), rv.dtype(), rv.device());
  Tensor y = Tensor::empty(rv.shape(), rv.dtype(), rv.device());
  Tensor rstd = empty_rstd(rv, rows);
  norm_forward(rv, &dv, &sum, weight, y, rstd, rows, width, eps);
  Var sum_out = op_output(tape, sum, {residual, delta});
  Var normed = weight ? op_output(tape, y, {residual, delta, weight}) : op_output(tape, y, {residual, delta});
  // normed requires a gradient whenever sum does, so this one closure serves both outputs.
  if (!normed->requires_grad) return {sum_out, normed};
  tape.record([residual, delta, weight, sum_out, normed, rstd, rows, width] {
    Tensor y = output_to_restore(normed);
    const Tensor* dy = normed->grad.defined() ? &normed->grad : nullptr;
    const Tensor* dsum = sum_out->grad.defined() ? &sum_out->grad : nullptr;
    if (!dy && !dsum && !y.defined()) return;
    const bool any_grad = dy || dsum;
    norm_backward(sum_out->value, weight, rstd, dy, dsum, any_grad ? residual : nullptr, any_grad ? delta : nullptr,
                  dy && wants_grad(weight), y.defined() ? &y : nullptr, rows, width);
    if (y.defined()) restore_value(normed, std::move(y));
  });
  return {sum_out, normed};
}

}  // namespace hgrn
