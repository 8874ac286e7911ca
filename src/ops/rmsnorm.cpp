// rmsnorm.cpp: RMSNorm, forward and backward: the CPU reference here, the GPU through kernels/rmsnorm.h. With
// x̂ = x·rstd, rstd = (mean(x²) + eps)^(-1/2), and u = dy ⊙ w (u = dy without a weight):
//   dx = rstd · (u − x̂ · mean(u ⊙ x̂)),   dw = Σ_rows dy ⊙ x̂.
#include "ops/rmsnorm.h"

#include <cmath>

#include "ops/activations.h"
#include "ops/cpu_parallel.h"
#include "ops/fp8_linear.h"
#include "ops/recompute.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/fp8.h"
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

template <typename T>
static void rmsnorm_forward_cpu(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t width, T eps) {
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * width;
    T sum_sq = 0;
    for (int64_t c = 0; c < width; ++c) sum_sq += xr[c] * xr[c];
    const T s = T(1) / std::sqrt(sum_sq / static_cast<T>(width) + eps);
    rstd[r] = s;
    normalized_row(xr, s, w, y + r * width, width);
  }
}

// dy null: no gradient reached y. Otherwise accumulates dx += the gradient above (when dx is non-null) and
// dw += Σ_rows dy ⊙ x̂ (when dw is non-null). dw is a sum over rows, taken in fixed row blocks so that its bits do not
// depend on the thread count. y non-null: the forward's output written again by the forward's normalized_row (the
// same bits), for a caller that freed it (release_until_producer_backward).
template <typename T>
static void rmsnorm_backward_cpu(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, T* y, int64_t rows,
                                 int64_t width) {
  reduce_rows_in_fixed_blocks(rows, width, dy ? dw : nullptr, [&](int64_t r, T* dw_block) {
    const T* xr = x + r * width;
    const T* dyr = dy ? dy + r * width : nullptr;
    const T s = rstd[r];
    if (y) normalized_row(xr, s, w, y + r * width, width);
    if (dx && dyr) {
      T dot = 0;  // Σ_c u_c · x̂_c
      for (int64_t c = 0; c < width; ++c) dot += dyr[c] * (w ? w[c] : T(1)) * xr[c] * s;
      const T mean_dot = dot / static_cast<T>(width);
      T* dxr = dx + r * width;
      for (int64_t c = 0; c < width; ++c) dxr[c] += s * (dyr[c] * (w ? w[c] : T(1)) - xr[c] * s * mean_dot);
    }
    if (dw_block)
      for (int64_t c = 0; c < width; ++c) dw_block[c] += dyr[c] * xr[c] * s;
  });
}

// x is the tensor normalised in runs of `width` features (a divisor of its last axis); weight may be null. On the GPU
// x is fp32 or bf16 and the weight fp32.
static void check_norm_args(const char* op, const Tensor& xv, const Tensor* wv, double eps, int64_t width) {
  HGRN_CHECK(xv.dim() >= 1 && xv.size(-1) > 0, op, ": input must have a non-empty last axis, got ",
             shape_str(xv.shape()));
  HGRN_CHECK(width > 0 && xv.size(-1) % width == 0, op, ": group width ", width, " does not divide the input's last axis ",
             shape_str(xv.shape()));
  HGRN_CHECK(xv.is_contiguous(), op, ": input must be contiguous");
  HGRN_CHECK(eps >= 0 && std::isfinite(eps), op, ": eps must be finite and non-negative, got ", eps);
  if (!wv) return;
  HGRN_CHECK(wv->dim() == 1 && wv->size(0) == width, op, ": weight ", shape_str(wv->shape()),
             " does not match input ", shape_str(xv.shape()), " normalised in groups of ", width);
  HGRN_CHECK(wv->device() == xv.device() && wv->is_contiguous(), op, ": weight must be a contiguous ",
             device_name(xv.device()), " tensor, as the input is");
  if (xv.device() == Device::CPU) {
    HGRN_CHECK(wv->dtype() == xv.dtype(), op, ": input is ", dtype_name(xv.dtype()), ", weight is ",
               dtype_name(wv->dtype()));
  } else {
    HGRN_CHECK(wv->dtype() == DType::F32, op, ": a GPU weight (a parameter) must be fp32, got ",
               dtype_name(wv->dtype()));
  }
}

// The forward on x's device. rstd is x's dtype on the CPU, fp32 on the GPU.
static void norm_forward(const Tensor& x, const Tensor* w, Tensor& y, Tensor& rstd, int64_t rows, int64_t width,
                         double eps) {
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_rmsnorm_forward(x.raw_data(), w ? w->data<float>() : nullptr, y.raw_data(), rstd.data<float>(), rows, width,
                         eps, x.dtype());
    return;
#else
    throw Error("rmsnorm: this hgrn was built without CUDA");
#endif
  }
  HGRN_DISPATCH_FLOAT(x.dtype(), "rmsnorm", [&] {
    rmsnorm_forward_cpu(x.data<scalar_t>(), w ? w->data<scalar_t>() : nullptr, y.data<scalar_t>(),
                        rstd.data<scalar_t>(), rows, width, static_cast<scalar_t>(eps));
  });
}

// The backward on x's device into the gradients of in (when it wants one; null: not wanted) and of the weight when
// dw_wanted (see rmsnorm_backward_cpu for the maths; dx has x's dtype, dw the weight's). The CPU accumulates into
// grad_buffer. The GPU overwrites an input gradient it sees first (grad_buffer_for_write: no zero fill to write and
// read back) and adds into one already there (the residual stream's gradient, handed over by the GEMM that added
// the stream: ops/linear.h) in the same pass; the weight's gradient likewise. y non-null: the op's
// output written again (see rmsnorm_backward_cpu); y_codes instead (y null): that output as FP8 codes, the bits of
// writing it and then casting it (on the GPU in the same pass where the warp kernel takes the rows).
static void norm_backward(const Tensor& x, const Var& weight, const Tensor& rstd, const Tensor* dy, const Var& in,
                          bool dw_wanted, Tensor* y, int64_t rows, int64_t width,
                          const Fp8CodesOut* y_codes = nullptr) {
  HGRN_CHECK(!y_codes || !y, "rmsnorm backward: the output's codes replace it");
  Tensor y_for_codes;  // the output the codes are cast from, where the pass does not write them itself
  const auto check_grad = [&](const Tensor* g) {
    HGRN_CHECK(!g || (g->dtype() == x.dtype() && g->device() == x.device() && g->numel() == x.numel() &&
                      g->is_contiguous()),
               "rmsnorm backward: a gradient does not match the ", dtype_name(x.dtype()), " input");
  };
  check_grad(dy);
  const Tensor* w = weight ? &weight->value : nullptr;
  const bool dx_wanted = dy && wants_grad(in);
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    bool add = false, add_dw = false;
    Tensor* dx = dx_wanted ? &grad_buffer_for_write(in, &add) : nullptr;
    Tensor* dw = dw_wanted ? &grad_buffer_for_write(weight, &add_dw) : nullptr;
    check_grad(dx);
    const void* dx_data = dx ? dx->raw_data() : nullptr;
    const bool codes_in_pass =
        y_codes && cuda_rmsnorm_codes_fit(width, x.dtype(), {x.raw_data(), w ? w->raw_data() : nullptr,
                                                             dy ? dy->raw_data() : nullptr, dx_data});
    if (y_codes && !codes_in_pass) {
      y_for_codes = Tensor::empty(x.shape(), x.dtype(), x.device());
      y = &y_for_codes;
    }
    cuda_rmsnorm_backward(x.raw_data(), w ? w->data<float>() : nullptr, rstd.data<float>(),
                          dy ? dy->raw_data() : nullptr, dx ? dx->raw_data() : nullptr, add,
                          dw ? dw->data<float>() : nullptr, add_dw, y ? y->raw_data() : nullptr, rows, width, x.dtype(),
                          nullptr, codes_in_pass ? y_codes : nullptr);
    if (y_codes && !codes_in_pass)
      cuda_fp8_quantize(y_for_codes.raw_data(), x.dtype(), x.numel(), y_codes->scale, y_codes->format,
                        y_codes->codes, nullptr);
    return;
#else
    throw Error("rmsnorm: this hgrn was built without CUDA");
#endif
  }
  Tensor* dx = dx_wanted ? &grad_buffer(in) : nullptr;
  Tensor* dw = dw_wanted ? &grad_buffer(weight) : nullptr;
  check_grad(dx);
  if (y_codes) {
    y_for_codes = Tensor::empty(x.shape(), x.dtype(), x.device());
    y = &y_for_codes;
  }
  HGRN_DISPATCH_FLOAT(x.dtype(), "rmsnorm backward", [&] {
    rmsnorm_backward_cpu(x.data<scalar_t>(), w ? w->data<scalar_t>() : nullptr, rstd.data<scalar_t>(),
                         dy ? dy->data<scalar_t>() : nullptr, dx ? dx->data<scalar_t>() : nullptr,
                         dw ? dw->data<scalar_t>() : nullptr, y ? y->data<scalar_t>() : nullptr, rows, width);
  });
  if (y_codes) fp8_cast_into_codes_cpu(y_for_codes, *y_codes);
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

Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps, int64_t group_width) {
  HGRN_CHECK(x, "rmsnorm: input is null");
  HGRN_CHECK(group_width >= 0, "rmsnorm: group width must be >= 0 (0: the whole last axis), got ", group_width);
  const Tensor& xv = x->value;
  const Tensor* wv = weight ? &weight->value : nullptr;
  // Contiguous rows of `width` features: groups of a row are rows of their own.
  const int64_t width = group_width > 0 ? group_width : xv.dim() >= 1 ? xv.size(-1) : 0;
  check_norm_args("rmsnorm", xv, wv, eps, width);
  const int64_t rows = xv.numel() / width;
  Tensor y = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
  Tensor rstd = empty_rstd(xv, rows);
  norm_forward(xv, wv, y, rstd, rows, width, eps);
  Var out = weight ? op_output(tape, y, {x, weight}) : op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, weight, out, rstd, rows, width] {
    // The output again for a consumer waiting for it: as FP8 codes where that is all it reads (ops/recompute.h).
    const Fp8CodesOut* codes = codes_to_restore(out);
    Tensor y = codes ? Tensor() : output_to_restore(out);
    const Tensor* dy = out->grad.defined() ? &out->grad : nullptr;
    if (!dy && !y.defined() && !codes) return;
    norm_backward(x->value, weight, rstd, dy, x, dy && wants_grad(weight), y.defined() ? &y : nullptr, rows, width,
                  codes);
    if (codes)
      restore_codes(out);
    else if (y.defined())
      restore_value(out, std::move(y));
  });
  return out;
}

// ---- the swish-gated norm ----

namespace {
struct GatedNormShape {
  int64_t rows = 0, width = 0;  // the norm's rows (groups of a row are rows of their own) and their width
};

GatedNormShape gated_norm_shape(const char* op, const Tensor& x, const Tensor* weight, const Tensor& gate, double eps,
                                int64_t group_width) {
  HGRN_CHECK(group_width >= 0, op, ": group width must be >= 0 (0: the whole last axis), got ", group_width);
  const int64_t width = group_width > 0 ? group_width : x.dim() >= 1 ? x.size(-1) : 0;
  check_norm_args(op, x, weight, eps, width);
  HGRN_CHECK(gate.shape() == x.shape() && gate.dtype() == x.dtype() && gate.device() == x.device() &&
                 gate.is_row_strided(),
             op, ": gate ", dtype_name(gate.dtype()), " ", shape_str(gate.shape()), " must be a row-strided ",
             dtype_name(x.dtype()), " tensor shaped as the input ", shape_str(x.shape()));
  return {x.numel() / width, width};
}

#ifdef HGRN_WITH_CUDA
// The gate as the fused GPU kernels take it, with dgate (may be null) laid out as the gate.
RmsnormGate gpu_gate(const Tensor& x, const Tensor& gate, const GatedNormShape& shape, Tensor* dgate, bool add_dgate) {
  RmsnormGate g;
  g.gate = gate.raw_data();
  g.stride = gate.dim() >= 2 ? gate.row_stride() : gate.numel();
  g.groups = x.size(-1) / shape.width;
  if (dgate) {
    g.dgate = dgate->raw_data();
    g.dgate_stride = dgate->dim() >= 2 ? dgate->row_stride() : dgate->numel();
    g.add_dgate = add_dgate;
  }
  return g;
}

bool gated_norm_fused(const Tensor& x, const Tensor& gate, const GatedNormShape& shape) {
  return x.device() == Device::CUDA &&
         cuda_rmsnorm_gate_fits(shape.width, x.raw_data(), gpu_gate(x, gate, shape, nullptr, false), x.dtype());
}
#endif
}  // namespace

namespace {
// gated_rmsnorm_forward into y, or as FP8 codes (codes non-null, y null).
Tensor gated_forward(const Tensor& x, const Tensor* weight, const Tensor& gate, double eps, int64_t group_width,
                     Tensor* y, const Fp8CodesOut* codes) {
  const GatedNormShape shape = gated_norm_shape("gated rmsnorm", x, weight, gate, eps, group_width);
  HGRN_CHECK(codes || (y->shape() == x.shape() && y->dtype() == x.dtype() && y->device() == x.device() &&
                       y->is_contiguous()),
             "gated rmsnorm: the output buffer does not match the input");
  Tensor rstd = empty_rstd(x, shape.rows);
#ifdef HGRN_WITH_CUDA
  if (gated_norm_fused(x, gate, shape)) {
    RmsnormGate g = gpu_gate(x, gate, shape, nullptr, false);
    if (codes) g.codes = *codes;
    cuda_rmsnorm_forward(x.raw_data(), weight ? weight->data<float>() : nullptr, y ? y->raw_data() : nullptr,
                         rstd.data<float>(), shape.rows, shape.width, eps, x.dtype(), &g);
    return rstd;
  }
#endif
  Tensor normed = Tensor::empty(x.shape(), x.dtype(), x.device());
  norm_forward(x, weight, normed, rstd, shape.rows, shape.width, eps);
  if (codes)
    swiglu_forward_codes(gate, normed, *codes);
  else
    swiglu_forward(gate, &normed, *y);
  return rstd;
}
}  // namespace

Tensor gated_rmsnorm_forward(const Tensor& x, const Tensor* weight, const Tensor& gate, double eps, int64_t group_width,
                             Tensor& y) {
  return gated_forward(x, weight, gate, eps, group_width, &y, nullptr);
}

Tensor gated_rmsnorm_forward_codes(const Tensor& x, const Tensor* weight, const Tensor& gate, double eps,
                                   int64_t group_width, const Fp8CodesOut& codes) {
  HGRN_CHECK(codes.codes && codes.scale, "gated rmsnorm to FP8 codes: no buffer or scale");
  return gated_forward(x, weight, gate, eps, group_width, nullptr, &codes);
}

void gated_rmsnorm_backward(const Var& x, const Var& weight, const Var& gate, const Tensor& rstd, double eps,
                            int64_t group_width, const Tensor& dy, Tensor* y, const Fp8CodesOut* y_codes) {
  const Tensor& xv = x->value;
  const Tensor* wv = weight ? &weight->value : nullptr;
  const GatedNormShape shape = gated_norm_shape("gated rmsnorm backward", xv, wv, gate->value, eps, group_width);
  HGRN_CHECK(dy.shape() == xv.shape() && dy.dtype() == xv.dtype() && dy.device() == xv.device() && dy.is_contiguous(),
             "gated rmsnorm backward: the output gradient does not match the input");
  HGRN_CHECK(!y_codes || (!y && !y_codes->amax), "gated rmsnorm backward: the output's FP8 codes replace y, no amax");
#ifdef HGRN_WITH_CUDA
  if (gated_norm_fused(xv, gate->value, shape)) {
    bool add_dx = false, add_dgate = false;
    Tensor* dx = wants_grad(x) ? &grad_buffer_for_write(x, &add_dx) : nullptr;
    Tensor* dgate = wants_grad(gate) ? &grad_buffer_for_write(gate, &add_dgate, GradLayout::RowStrided) : nullptr;
    bool add_dw = false;
    Tensor* dw = wants_grad(weight) ? &grad_buffer_for_write(weight, &add_dw) : nullptr;
    RmsnormGate g = gpu_gate(xv, gate->value, shape, dgate, add_dgate);
    if (y_codes) g.codes = *y_codes;
    cuda_rmsnorm_backward(xv.raw_data(), wv ? wv->data<float>() : nullptr, rstd.data<float>(), dy.raw_data(),
                          dx ? dx->raw_data() : nullptr, add_dx, dw ? dw->data<float>() : nullptr, add_dw,
                          y ? y->raw_data() : nullptr, shape.rows, shape.width, xv.dtype(), &g);
    return;
  }
#endif
  // The composition: the norm's output again (the forward's bits), swiglu's backward into its gradient, then the
  // norm's backward from that.
  const Var normed = make_var(Tensor::empty(xv.shape(), xv.dtype(), xv.device()), /*requires_grad=*/true);
  Tensor rstd_again = empty_rstd(xv, shape.rows);
  norm_forward(xv, wv, normed->value, rstd_again, shape.rows, shape.width, eps);
  swiglu_backward(gate, normed, dy, y, y_codes);
  norm_backward(xv, weight, rstd, &normed->grad, x, wants_grad(weight), nullptr, shape.rows, shape.width);
}

void rmsnorm_forward_into(const Tensor& x, const Tensor* weight, double eps, Tensor& y, Tensor& rstd) {
  HGRN_CHECK(x.dim() >= 1, "rmsnorm: input must have a last axis, got ", shape_str(x.shape()));
  const int64_t width = x.size(-1);
  check_norm_args("rmsnorm", x, weight, eps, width);
  const int64_t rows = x.numel() / width;
  const DType rstd_dtype = x.device() == Device::CUDA ? DType::F32 : x.dtype();
  HGRN_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.device() == x.device() && y.is_contiguous(),
             "rmsnorm: the output buffer ", dtype_name(y.dtype()), " ", shape_str(y.shape()),
             " does not match the input ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  HGRN_CHECK(rstd.numel() == rows && rstd.dtype() == rstd_dtype && rstd.device() == x.device() &&
                 rstd.is_contiguous(),
             "rmsnorm: the rstd buffer must be ", rows, " contiguous ", dtype_name(rstd_dtype), " values");
  norm_forward(x, weight, y, rstd, rows, width, eps);
}

}  // namespace hgrn
