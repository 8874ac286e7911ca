// activations.cpp: silu, swiglu, sigmoid and log_sigmoid, forward and backward (on the GPU through
// kernels/activations.h). silu'(x) = σ(x) · (1 + x · (1 − σ(x))), σ'(x) = σ(x) · (1 − σ(x)), (log σ)'(x) = σ(−x).
#include "ops/activations.h"

#include <algorithm>
#include <cmath>

#include "kernels/activations.h"  // SwigluRows, the layout both devices' kernels take
#include "ops/cpu_math.h"
#include "ops/cpu_parallel.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"

namespace hgrn {

template <typename T>
HGRN_VECTOR_CLONES static void silu_forward_cpu(const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * stable_sigmoid(x[i]);
}

template <typename T>
HGRN_VECTOR_CLONES static void silu_backward_cpu(const T* x, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const T s = stable_sigmoid(x[i]);
    dx[i] += dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

// The CPU's layout: rows of the last axis, every operand's row stride given (its threads split the rows).
static SwigluRows cpu_rows(const Tensor& gate, const Tensor* up, const Tensor* dgate, const Tensor* dup) {
  SwigluRows r;
  r.width = gate.dim() ? gate.size(-1) : 1;
  r.rows = r.width ? gate.numel() / r.width : 0;
  r.gate_stride = gate.row_stride();
  r.up_stride = up ? up->row_stride() : 0;
  r.dgate_stride = dgate ? dgate->row_stride() : 0;
  r.dup_stride = dup ? dup->row_stride() : 0;
  return r;
}

template <typename T>
HGRN_VECTOR_CLONES static void swiglu_forward_cpu(const T* gate, const T* up, T* y, const SwigluRows& d) {
#pragma omp parallel for schedule(static) if (d.rows * d.width >= kMinParallelElements)
  for (int64_t r = 0; r < d.rows; ++r) {
    const T* gr = gate + r * d.gate_stride;
    const T* ur = up + r * d.up_stride;
    T* yr = y + r * d.width;
    for (int64_t c = 0; c < d.width; ++c) yr[c] = gr[c] * stable_sigmoid(gr[c]) * ur[c];
  }
}

// dgate and dup may each be null when that input needs no gradient; add_gate and add_up say whether each adds into
// its buffer or overwrites it (as 0 + the gradient: the bits of adding into zeros). y (may be null, may be dy): the
// forward's output again, written after dy's element was read. Each row goes in column blocks: σ(gate) once into a
// block on the stack, then one loop per output, so that every loop vectorises.
template <typename T>
HGRN_VECTOR_CLONES static void swiglu_backward_cpu(const T* gate, const T* up, const T* dy, T* dgate, T* dup, T* y,
                                                   bool add_gate, bool add_up, const SwigluRows& d) {
  constexpr int64_t kBlock = 256;
#pragma omp parallel for schedule(static) if (d.rows * d.width >= kMinParallelElements)
  for (int64_t r = 0; r < d.rows; ++r) {
    for (int64_t c0 = 0; c0 < d.width; c0 += kBlock) {
      const int64_t n = std::min(kBlock, d.width - c0);
      const T* gr = gate + r * d.gate_stride + c0;
      const T* ur = up + r * d.up_stride + c0;
      const T* dyr = dy + r * d.width + c0;
      T sig[kBlock];
      for (int64_t c = 0; c < n; ++c) sig[c] = stable_sigmoid(gr[c]);
      if (dgate) {
        T* dgr = dgate + r * d.dgate_stride + c0;
        for (int64_t c = 0; c < n; ++c) {
          const T s = sig[c];
          dgr[c] = (add_gate ? dgr[c] : T(0)) + dyr[c] * ur[c] * s * (T(1) + gr[c] * (T(1) - s));
        }
      }
      if (dup) {
        T* dur = dup + r * d.dup_stride + c0;
        for (int64_t c = 0; c < n; ++c) dur[c] = (add_up ? dur[c] : T(0)) + dyr[c] * gr[c] * sig[c];
      }
      if (y) {
        T* yr = y + r * d.width + c0;
        for (int64_t c = 0; c < n; ++c) yr[c] = gr[c] * sig[c] * ur[c];
      }
    }
  }
}

static void check_input(const char* op, const Var& v) {
  HGRN_CHECK(v, op, ": input is null");
  HGRN_CHECK(v->value.is_contiguous(), op, ": inputs must be contiguous");
}

#ifdef HGRN_WITH_CUDA
// The rows the GPU kernels take: one row of every element when all operands are contiguous, else the rows of the
// last axis with each operand's own stride (gate and up may be column blocks of a fused projection's output).
static SwigluRows gpu_rows(const Tensor& gate, const Tensor* up, const Tensor* dgate, const Tensor* dup) {
  bool contiguous = true;
  for (const Tensor* t : {&gate, up, dgate, dup}) contiguous = contiguous && (!t || t->is_contiguous());
  SwigluRows r;
  r.width = contiguous ? gate.numel() : gate.size(-1);
  r.rows = r.width ? gate.numel() / r.width : 0;
  if (!contiguous) {
    r.gate_stride = gate.row_stride();
    r.up_stride = up ? up->row_stride() : 0;
    r.dgate_stride = dgate ? dgate->row_stride() : 0;
    r.dup_stride = dup ? dup->row_stride() : 0;
  }
  return r;
}
#endif

// silu (up null) or swiglu forward on gate's device.
void swiglu_forward(const Tensor& gate, const Tensor* up, Tensor& y) {
  const int64_t n = gate.numel();
  if (gate.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_swiglu_forward(gate.raw_data(), up ? up->raw_data() : nullptr, y.raw_data(),
                        gpu_rows(gate, up, nullptr, nullptr), gate.dtype());
    return;
#else
    throw Error("silu/swiglu: this hgrn was built without CUDA");
#endif
  }
  HGRN_DISPATCH_FLOAT(gate.dtype(), up ? "swiglu" : "silu", [&] {
    if (up)
      swiglu_forward_cpu(gate.data<scalar_t>(), up->data<scalar_t>(), y.data<scalar_t>(),
                         cpu_rows(gate, up, nullptr, nullptr));
    else
      silu_forward_cpu(gate.data<scalar_t>(), y.data<scalar_t>(), n);
  });
}

void swiglu_forward_codes(const Tensor& gate, const Tensor& up, const Fp8CodesOut& codes) {
  HGRN_CHECK(codes.codes && codes.scale, "swiglu to FP8 codes: no buffer or scale");
  HGRN_CHECK(gate.shape() == up.shape() && gate.dtype() == up.dtype() && gate.device() == up.device(),
             "swiglu to FP8 codes: gate ", shape_str(gate.shape()), " and up ", shape_str(up.shape()), " differ");
  if (gate.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_swiglu_forward(gate.raw_data(), up.raw_data(), nullptr, gpu_rows(gate, &up, nullptr, nullptr), gate.dtype(),
                        &codes);
    return;
#else
    throw Error("swiglu: this hgrn was built without CUDA");
#endif
  }
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  swiglu_forward(gate, &up, y);
  fp8_cast_into_codes_cpu(y, codes);
}

// silu (up and dup null) or swiglu backward on gate's device into the gradients of gate_var and up_var (each when it
// wants one; up_var null for silu). The CPU accumulates into grad_buffer; the GPU overwrites a gradient it sees first
// (grad_buffer_for_write: no zero fill), asking for gate's buffer before up's, the order the kernel writes them in,
// so that swiglu(x, x) adds the second contribution to the first.
void swiglu_backward(const Var& gate_var, const Var& up_var, const Tensor& dy, Tensor* recomputed_output,
                     const Fp8CodesOut* recomputed_codes, const SwigluGradientCodes* gradient_codes) {
  const Tensor& gate = gate_var->value;
  const Tensor* up = up_var ? &up_var->value : nullptr;
  HGRN_CHECK(dy.dtype() == gate.dtype() && dy.device() == gate.device() && dy.numel() == gate.numel() &&
                 dy.is_contiguous(),
             "silu/swiglu backward: the output gradient does not match the ", dtype_name(gate.dtype()), " input");
  HGRN_CHECK(up || (!recomputed_output && !recomputed_codes),
             "silu backward: recomputing the output is only offered for swiglu");
  HGRN_CHECK(!recomputed_codes || (!recomputed_output && recomputed_codes->codes && recomputed_codes->scale &&
                                   !recomputed_codes->amax),
             "swiglu backward: the recomputed output's FP8 codes need a buffer and a scale, no amax, and no act-dtype "
             "output beside them");
  HGRN_CHECK(!recomputed_output ||
                 (recomputed_output->dtype() == gate.dtype() && recomputed_output->device() == gate.device() &&
                  recomputed_output->numel() == gate.numel() && recomputed_output->is_contiguous()),
             "silu/swiglu backward: the buffer for the recomputed output does not match the input");
  const int64_t n = gate.numel();
  const int64_t width = gate.dim() ? gate.size(-1) : 1;
  // The two gradients fill the code matrix: gate's columns and up's, in either order.
  HGRN_CHECK(!gradient_codes ||
                 (up && gate_var != up_var && wants_grad(gate_var) && wants_grad(up_var) &&
                  !gate_var->grad.defined() && !up_var->grad.defined() && gradient_codes->out.codes &&
                  gradient_codes->out.scale && gradient_codes->row_width == 2 * width &&
                  gradient_codes->gate_column + gradient_codes->up_column == width &&
                  (gradient_codes->gate_column == 0 || gradient_codes->up_column == 0)),
             "swiglu backward: FP8 codes of the gradients need two inputs that want a gradient and have none yet, a "
             "buffer, a scale, and a code matrix of their two widths");
  if (gate.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    if (gradient_codes) {
      SwigluRows rows = gpu_rows(gate, up, nullptr, nullptr);
      if (rows.width != width) {  // contiguous inputs: gpu_rows made them one row
        rows.width = width;
        rows.rows = n / width;
      }
      rows.codes_width = gradient_codes->row_width;
      rows.dgate_column = gradient_codes->gate_column;
      rows.dup_column = gradient_codes->up_column;
      cuda_swiglu_backward(gate.raw_data(), up->raw_data(), dy.raw_data(), nullptr, nullptr,
                           recomputed_output ? recomputed_output->raw_data() : nullptr, false, false, rows,
                           gate.dtype(), recomputed_codes, &gradient_codes->out);
      return;
    }
    // Row-strided for column blocks of a fused projection: their places in its gradient.
    bool add_gate = false, add_up = false;
    const Tensor* dgate =
        wants_grad(gate_var) ? &grad_buffer_for_write(gate_var, &add_gate, GradLayout::RowStrided) : nullptr;
    const Tensor* dup = wants_grad(up_var) ? &grad_buffer_for_write(up_var, &add_up, GradLayout::RowStrided) : nullptr;
    cuda_swiglu_backward(gate.raw_data(), up ? up->raw_data() : nullptr, dy.raw_data(),
                         dgate ? dgate->raw_data() : nullptr, dup ? dup->raw_data() : nullptr,
                         recomputed_output ? recomputed_output->raw_data() : nullptr, add_gate, add_up,
                         gpu_rows(gate, up, dgate, dup), gate.dtype(), recomputed_codes);
    return;
#else
    throw Error("silu/swiglu backward: this hgrn was built without CUDA");
#endif
  }
  if (!up) {
    if (wants_grad(gate_var))
      HGRN_DISPATCH_FLOAT(gate.dtype(), "silu backward", [&] {
        silu_backward_cpu(gate.data<scalar_t>(), dy.data<scalar_t>(), grad_buffer(gate_var).data<scalar_t>(), n);
      });
    return;
  }
  // As on the GPU: gate's buffer first, then up's (the order the kernel writes them), column blocks of a fused
  // projection's gradient written in place; with gradient codes, both into the columns of one matrix then cast.
  bool add_gate = false, add_up = false;
  Tensor code_values, dgate_columns, dup_columns;
  if (gradient_codes) {
    code_values = Tensor::empty({n / width, gradient_codes->row_width}, gate.dtype(), gate.device());
    dgate_columns = code_values.columns(gradient_codes->gate_column, width);
    dup_columns = code_values.columns(gradient_codes->up_column, width);
  }
  Tensor* dgate = gradient_codes         ? &dgate_columns
                  : wants_grad(gate_var) ? &grad_buffer_for_write(gate_var, &add_gate, GradLayout::RowStrided)
                                         : nullptr;
  Tensor* dup = gradient_codes         ? &dup_columns
                : wants_grad(up_var) ? &grad_buffer_for_write(up_var, &add_up, GradLayout::RowStrided)
                                     : nullptr;
  Tensor recomputed = recomputed_codes ? Tensor::empty(gate.shape(), gate.dtype(), gate.device()) : Tensor();
  Tensor* y = recomputed_codes ? &recomputed : recomputed_output;
  HGRN_DISPATCH_FLOAT(gate.dtype(), "swiglu backward", [&] {
    swiglu_backward_cpu(gate.data<scalar_t>(), up->data<scalar_t>(), dy.data<scalar_t>(),
                        dgate ? dgate->data<scalar_t>() : nullptr, dup ? dup->data<scalar_t>() : nullptr,
                        y ? y->data<scalar_t>() : nullptr, add_gate, add_up, cpu_rows(gate, up, dgate, dup));
  });
  if (recomputed_codes) fp8_cast_into_codes_cpu(recomputed, *recomputed_codes);
  if (gradient_codes) fp8_cast_into_codes_cpu(code_values, gradient_codes->out);
}

Var silu(Tape& tape, const Var& x) {
  check_input("silu", x);
  Tensor y = Tensor::empty(x->value.shape(), x->value.dtype(), x->value.device());
  swiglu_forward(x->value, nullptr, y);
  Var out = op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, out] {
    if (!out->grad.defined()) return;
    swiglu_backward(x, nullptr, out->grad, nullptr);
  });
  return out;
}

template <typename T>
HGRN_VECTOR_CLONES static void sigmoid_forward_cpu(const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = stable_sigmoid(x[i]);
}

template <typename T>
HGRN_VECTOR_CLONES static void sigmoid_backward_cpu(const T* y, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * y[i] * (T(1) - y[i]);
}

Var sigmoid(Tape& tape, const Var& x) {
  check_input("sigmoid", x);
  Tensor y = Tensor::empty(x->value.shape(), x->value.dtype(), x->value.device());
  if (y.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_sigmoid_forward(x->value.raw_data(), y.raw_data(), y.numel(), y.dtype());
#else
    throw Error("sigmoid: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(x->value.dtype(), "sigmoid", [&] {
      sigmoid_forward_cpu(x->value.data<scalar_t>(), y.data<scalar_t>(), y.numel());
    });
  }
  Var out = op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, out] {
    if (!out->grad.defined() || !wants_grad(x)) return;
    if (out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
                 "sigmoid backward: the output's gradient must be contiguous ", dtype_name(out->value.dtype()));
      bool add = false;
      Tensor& dx = grad_buffer_for_write(x, &add);
      cuda_sigmoid_backward(out->value.raw_data(), out->grad.raw_data(), dx.raw_data(), add, out->value.numel(),
                            out->value.dtype());
#else
      throw Error("sigmoid: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(x->value.dtype(), "sigmoid backward", [&] {
      sigmoid_backward_cpu(out->value.data<scalar_t>(), out->grad.data<scalar_t>(),
                           grad_buffer(x).data<scalar_t>(), out->value.numel());
    });
  });
  return out;
}

template <typename T>
HGRN_VECTOR_CLONES static void log_sigmoid_forward_cpu(const T* x, T* y, T divisor, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = stable_log_sigmoid(x[i]) / divisor;
}

template <typename T>
HGRN_VECTOR_CLONES static void log_sigmoid_backward_cpu(const T* x, const T* dy, T* dx, T divisor, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * stable_sigmoid(-x[i]) / divisor;
}

Var log_sigmoid(Tape& tape, const Var& x, double divisor, DType out_dtype) {
  check_input("log_sigmoid", x);
  const Tensor& xv = x->value;
  const bool on_gpu = xv.device() == Device::CUDA;
  HGRN_CHECK(out_dtype == xv.dtype() || (on_gpu && out_dtype == DType::F32), "log_sigmoid: output dtype ",
             dtype_name(out_dtype), " for a ", dtype_name(xv.dtype()), " input on ", device_name(xv.device()),
             ": expected the input's dtype", on_gpu ? " or fp32" : "");
  HGRN_CHECK(std::isfinite(divisor) && divisor != 0, "log_sigmoid: divisor must be finite and non-zero, got ",
             divisor);
  Tensor y = Tensor::empty(xv.shape(), out_dtype, xv.device());
  if (on_gpu) {
#ifdef HGRN_WITH_CUDA
    cuda_log_sigmoid_forward(xv.raw_data(), xv.dtype(), y.raw_data(), out_dtype, static_cast<float>(divisor),
                             y.numel());
#else
    throw Error("log_sigmoid: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(xv.dtype(), "log_sigmoid", [&] {
      log_sigmoid_forward_cpu(xv.data<scalar_t>(), y.data<scalar_t>(), static_cast<scalar_t>(divisor), y.numel());
    });
  }
  Var out = op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, out, divisor] {
    if (!out->grad.defined() || !wants_grad(x)) return;
    HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
               "log_sigmoid backward: the output's gradient must be contiguous ", dtype_name(out->value.dtype()));
    if (out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      bool add = false;
      Tensor& dx = grad_buffer_for_write(x, &add);
      cuda_log_sigmoid_backward(x->value.raw_data(), x->value.dtype(), out->grad.raw_data(), out->grad.dtype(),
                                dx.raw_data(), add, static_cast<float>(divisor), x->value.numel());
#else
      throw Error("log_sigmoid: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(x->value.dtype(), "log_sigmoid backward", [&] {
      log_sigmoid_backward_cpu(x->value.data<scalar_t>(), out->grad.data<scalar_t>(), grad_buffer(x).data<scalar_t>(),
                               static_cast<scalar_t>(divisor), x->value.numel());
    });
  });
  return out;
}

Var swiglu(Tape& tape, const Var& gate, const Var& up) {
  check_input("swiglu", gate);
  check_input("swiglu", up);
  HGRN_CHECK(gate->value.shape() == up->value.shape(), "swiglu: gate ", shape_str(gate->value.shape()), " and up ",
             shape_str(up->value.shape()), " differ in shape");
  HGRN_CHECK(gate->value.dtype() == up->value.dtype() && gate->value.device() == up->value.device(),
             "swiglu: gate is ", dtype_name(gate->value.dtype()), " on ", device_name(gate->value.device()),
             ", up is ", dtype_name(up->value.dtype()), " on ", device_name(up->value.device()));
  Tensor y = Tensor::empty(gate->value.shape(), gate->value.dtype(), gate->value.device());
  swiglu_forward(gate->value, &up->value, y);
  Var out = op_output(tape, y, {gate, up});
  if (!out->requires_grad) return out;
  tape.record([gate, up, out] {
    if (!out->grad.defined()) return;
    swiglu_backward(gate, up, out->grad, nullptr);
  });
  return out;
}

}  // namespace hgrn
