// elementwise.cpp: add, forward and backward (both inputs receive dy).
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

Var add(Tape& tape, const Var& a, const Var& b) {
  HGRN_CHECK(a->value.shape() == b->value.shape(), "add: shapes ", shape_str(a->value.shape()), " and ",
             shape_str(b->value.shape()), " differ");
  const int64_t n = a->value.numel();
  Tensor y = Tensor::empty(a->value.shape(), a->value.dtype(), a->value.device());
  HGRN_DISPATCH_FLOAT(y.dtype(), "add", [&] {
    add_forward_cpu(a->value.data<scalar_t>(), b->value.data<scalar_t>(), y.data<scalar_t>(), n);
  });
  Var out = op_output(tape, y, {a, b});
  if (!out->requires_grad) return out;
  tape.record([a, b, out, n] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "add backward", [&] {
      for (const Var& v : {a, b})
        if (wants_grad(v)) accumulate_cpu(grad_buffer(v).data<scalar_t>(), out->grad.data<scalar_t>(), n);
    });
  });
  return out;
}

}  // namespace hgrn
