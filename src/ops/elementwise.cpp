// elementwise.cpp: add and reshape, forward and backward.
#include "ops/elementwise.h"

namespace hgrn {

template <typename T>
static void add_forward_cpu(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename T>
static void accumulate_cpu(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// dst += src for two same-sized float tensors: how a gradient passes through add and reshape unchanged.
static void accumulate(Tensor& dst, const Tensor& src) {
  HGRN_DISPATCH_FLOAT(dst.dtype(), "accumulate", [&] {
    accumulate_cpu(dst.data<scalar_t>(), src.data<scalar_t>(), dst.numel());
  });
}

Var add(Tape& tape, const Var& a, const Var& b) {
  HGRN_CHECK(a->value.shape() == b->value.shape(), "add: shapes ", shape_str(a->value.shape()), " and ",
             shape_str(b->value.shape()), " differ");
  Tensor y = Tensor::empty(a->value.shape(), a->value.dtype(), a->value.device());
  HGRN_DISPATCH_FLOAT(y.dtype(), "add", [&] {
    add_forward_cpu(a->value.data<scalar_t>(), b->value.data<scalar_t>(), y.data<scalar_t>(), y.numel());
  });
  Var out = op_output(tape, y, {a, b});
  if (!out->requires_grad) return out;
  tape.record([a, b, out] {
    if (!out->grad.defined()) return;
    for (const Var& v : {a, b})
      if (wants_grad(v)) accumulate(grad_buffer(v), out->grad);
  });
  return out;
}

Var reshape(Tape& tape, const Var& x, const Shape& shape) {
  Var out = op_output(tape, x->value.reshape(shape), {x});
  if (!out->requires_grad) return out;
  tape.record([x, out] {
    if (!out->grad.defined()) return;
    accumulate(grad_buffer(x), out->grad.reshape(x->value.shape()));
  });
  return out;
}

}  // namespace hgrn
