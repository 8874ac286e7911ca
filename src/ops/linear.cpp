// linear.cpp: forward y = x·Wᵀ and backward dx += dy·W, dW += dyᵀ·x through the CPU GEMM.
#include "ops/linear.h"

#include "ops/gemm_cpu.h"

namespace hgrn {

Var linear(Tape& tape, const Var& x, const Var& weight) {
  const Tensor& xv = x->value;
  const Tensor& wv = weight->value;
  HGRN_CHECK(wv.dim() == 2, "linear: weight must be [out, in], got ", shape_str(wv.shape()));
  const int64_t in = wv.size(1), out_features = wv.size(0);
  HGRN_CHECK(xv.size(-1) == in, "linear: input ", shape_str(xv.shape()), " does not match weight ",
             shape_str(wv.shape()));
  HGRN_CHECK(xv.dtype() == wv.dtype(), "linear: input is ", dtype_name(xv.dtype()), ", weight is ",
             dtype_name(wv.dtype()));
  const int64_t rows = xv.numel() / in;
  Shape out_shape = xv.shape();
  out_shape.back() = out_features;
  Tensor y = Tensor::empty(out_shape, xv.dtype(), xv.device());
  HGRN_DISPATCH_FLOAT(xv.dtype(), "linear", [&] {
    gemm_cpu<scalar_t>(false, true, rows, out_features, in, 1, xv.data<scalar_t>(), in, wv.data<scalar_t>(), in, 0,
                       y.data<scalar_t>(), out_features);
  });
  Var out = op_output(tape, y, {x, weight});
  if (!out->requires_grad) return out;
  tape.record([x, weight, out, rows, in, out_features] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "linear backward", [&] {
      const scalar_t* dy = out->grad.data<scalar_t>();
      if (wants_grad(x))
        gemm_cpu<scalar_t>(false, false, rows, in, out_features, 1, dy, out_features,
                           weight->value.data<scalar_t>(), in, 1, grad_buffer(x).data<scalar_t>(), in);
      if (wants_grad(weight))
        gemm_cpu<scalar_t>(true, false, out_features, in, rows, 1, dy, out_features, x->value.data<scalar_t>(), in,
                           1, grad_buffer(weight).data<scalar_t>(), in);
    });
  });
  return out;
}

}  // namespace hgrn
