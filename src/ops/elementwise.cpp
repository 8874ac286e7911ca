// elementwise.cpp: add, mul, add_bias, reshape, split_columns and contiguous, forward and backward (on the GPU through
// kernels/elementwise.h and 2-D copies), and the gradient hand-over.
#include "ops/elementwise.h"

#include "ops/cpu_parallel.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/elementwise.h"
#endif

namespace hgrn {

template <typename T>
static void add_forward_cpu(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename T>
static void accumulate_cpu(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// dst += src for two same-sized float tensors on one device: how a gradient passes through add and reshape unchanged.
static void accumulate(Tensor& dst, const Tensor& src) {
  HGRN_CHECK(dst.dtype() == src.dtype() && dst.device() == src.device() && dst.numel() == src.numel() &&
                 dst.is_contiguous() && src.is_contiguous(),
             "accumulate: gradient ", dtype_name(src.dtype()), " ", shape_str(src.shape()), " on ",
             device_name(src.device()), " does not match ", dtype_name(dst.dtype()), " ", shape_str(dst.shape()),
             " on ", device_name(dst.device()));
  if (dst.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_accumulate(dst.raw_data(), src.raw_data(), dst.numel(), dst.dtype());
    return;
#else
    throw Error("accumulate: this hgrn was built without CUDA");
#endif
  }
  HGRN_DISPATCH_FLOAT(dst.dtype(), "accumulate", [&] {
    accumulate_cpu(dst.data<scalar_t>(), src.data<scalar_t>(), dst.numel());
  });
}

// v's gradient += g. On the GPU a gradient seen for the first time is copied instead of added to a zero fill: one
// copy in place of a fill, a read and a write. (add(x, x) asks twice: the second call accumulates onto the copy.)
static void pass_gradient(const Var& v, const Tensor& g) {
  if (g.device() == Device::CUDA) {
    bool add_into = false;
    Tensor& dst = grad_buffer_for_write(v, &add_into);
    if (add_into) {
      accumulate(dst, g);
    } else {
      HGRN_CHECK(dst.dtype() == g.dtype() && dst.numel() == g.numel() && g.is_contiguous(),
                 "accumulate: gradient ", dtype_name(g.dtype()), " ", shape_str(g.shape()), " does not match ",
                 dtype_name(dst.dtype()), " ", shape_str(dst.shape()));
      dst.copy_from(g.reshape(dst.shape()));
    }
    return;
  }
  accumulate(grad_buffer(v), g);
}

void hand_over_gradient(const Var& from, const Var& to) {
  if (!from->grad.defined() || !wants_grad(to)) return;
  if (!adopt_gradient(to, std::move(from->grad))) pass_gradient(to, from->grad);
  from->grad = Tensor();
}

Var add(Tape& tape, const Var& a, const Var& b) {
  HGRN_CHECK(a && b, "add: input is null");
  const Tensor& av = a->value;
  const Tensor& bv = b->value;
  HGRN_CHECK(av.shape() == bv.shape(), "add: shapes ", shape_str(av.shape()), " and ", shape_str(bv.shape()),
             " differ");
  HGRN_CHECK(av.dtype() == bv.dtype() && av.device() == bv.device(), "add: ", dtype_name(av.dtype()), " on ",
             device_name(av.device()), " and ", dtype_name(bv.dtype()), " on ", device_name(bv.device()));
  HGRN_CHECK(av.is_contiguous() && bv.is_contiguous(), "add: inputs must be contiguous");
  Tensor y = Tensor::empty(av.shape(), av.dtype(), av.device());
  if (y.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_add(av.raw_data(), bv.raw_data(), y.raw_data(), y.numel(), y.dtype());
#else
    throw Error("add: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(y.dtype(), "add", [&] {
      add_forward_cpu(av.data<scalar_t>(), bv.data<scalar_t>(), y.data<scalar_t>(), y.numel());
    });
  }
  Var out = op_output(tape, y, {a, b});
  if (!out->requires_grad) return out;
  tape.record([a, b, out] {
    if (!out->grad.defined()) return;
    for (const Var& v : {a, b})
      if (wants_grad(v)) pass_gradient(v, out->grad);
  });
  return out;
}

Var mul(Tape& tape, const Var& a, const Var& b) {
  HGRN_CHECK(a && b, "mul: input is null");
  const Tensor& av = a->value;
  const Tensor& bv = b->value;
  HGRN_CHECK(av.shape() == bv.shape(), "mul: shapes ", shape_str(av.shape()), " and ", shape_str(bv.shape()),
             " differ");
  HGRN_CHECK(av.dtype() == bv.dtype() && av.device() == bv.device(), "mul: ", dtype_name(av.dtype()), " on ",
             device_name(av.device()), " and ", dtype_name(bv.dtype()), " on ", device_name(bv.device()));
  HGRN_CHECK(av.is_contiguous() && bv.is_contiguous(), "mul: inputs must be contiguous");
  Tensor y = Tensor::empty(av.shape(), av.dtype(), av.device());
  if (y.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_mul(av.raw_data(), bv.raw_data(), y.raw_data(), y.numel(), y.dtype());
#else
    throw Error("mul: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(y.dtype(), "mul", [&] {
      const scalar_t *pa = av.data<scalar_t>(), *pb = bv.data<scalar_t>();
      scalar_t* py = y.data<scalar_t>();
      for (int64_t i = 0; i < y.numel(); ++i) py[i] = pa[i] * pb[i];
    });
  }
  Var out = op_output(tape, y, {a, b});
  if (!out->requires_grad) return out;
  tape.record([a, b, out] {
    if (!out->grad.defined()) return;
    if (out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
                 "mul backward: the output's gradient must be contiguous ", dtype_name(out->value.dtype()));
      // Asked one after the other, in the order the kernel writes them, so that mul(x, x) adds both contributions.
      bool add_a = false, add_b = false;
      const Tensor* da = wants_grad(a) ? &grad_buffer_for_write(a, &add_a) : nullptr;
      const Tensor* db = wants_grad(b) ? &grad_buffer_for_write(b, &add_b) : nullptr;
      cuda_mul_backward(a->value.raw_data(), b->value.raw_data(), out->grad.raw_data(),
                        da ? da->raw_data() : nullptr, db ? db->raw_data() : nullptr, add_a, add_b,
                        out->grad.numel(), out->grad.dtype());
#else
      throw Error("mul: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "mul backward", [&] {
      const scalar_t* dy = out->grad.data<scalar_t>();
      const int64_t n = out->grad.numel();
      // Asked one after the other, so that mul(x, x) adds both contributions.
      if (wants_grad(a)) {
        scalar_t* da = grad_buffer(a).data<scalar_t>();
        const scalar_t* pb = b->value.data<scalar_t>();
        for (int64_t i = 0; i < n; ++i) da[i] += dy[i] * pb[i];
      }
      if (wants_grad(b)) {
        scalar_t* db = grad_buffer(b).data<scalar_t>();
        const scalar_t* pa = a->value.data<scalar_t>();
        for (int64_t i = 0; i < n; ++i) db[i] += dy[i] * pa[i];
      }
    });
  });
  return out;
}

Var add_bias(Tape& tape, const Var& x, const Var& bias) {
  HGRN_CHECK(x && bias, "add_bias: input is null");
  const Tensor& xv = x->value;
  const Tensor& bv = bias->value;
  HGRN_CHECK(xv.dim() >= 1 && bv.shape() == Shape{xv.size(-1)}, "add_bias: bias ", shape_str(bv.shape()),
             " does not match input ", shape_str(xv.shape()));
  HGRN_CHECK(bv.device() == xv.device(), "add_bias: input on ", device_name(xv.device()), ", bias on ",
             device_name(bv.device()));
  // On the GPU the bias is a parameter, fp32 whatever the activation dtype.
  const DType bias_dtype = xv.device() == Device::CUDA ? DType::F32 : xv.dtype();
  HGRN_CHECK(bv.dtype() == bias_dtype, "add_bias: input is ", dtype_name(xv.dtype()), " on ",
             device_name(xv.device()), ", bias is ", dtype_name(bv.dtype()), " (expected ", dtype_name(bias_dtype),
             ")");
  HGRN_CHECK(xv.is_contiguous() && bv.is_contiguous(), "add_bias: inputs must be contiguous");
  const int64_t width = xv.size(-1), rows = width ? xv.numel() / width : 0;
  Tensor y = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
  if (y.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_add_bias(xv.raw_data(), bv.data<float>(), y.raw_data(), rows, width, y.dtype());
#else
    throw Error("add_bias: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(y.dtype(), "add_bias", [&] {
      const scalar_t *px = xv.data<scalar_t>(), *pb = bv.data<scalar_t>();
      scalar_t* py = y.data<scalar_t>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c) py[r * width + c] = px[r * width + c] + pb[c];
    });
  }
  Var out = op_output(tape, y, {x, bias});
  if (!out->requires_grad) return out;
  tape.record([x, bias, out, rows, width] {
    if (!out->grad.defined()) return;
    if (wants_grad(bias) && out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
                 "add_bias backward: the output's gradient must be contiguous ", dtype_name(out->value.dtype()));
      cuda_add_bias_backward(out->grad.raw_data(), grad_buffer(bias).data<float>(), rows, width, out->grad.dtype());
#else
      throw Error("add_bias: this hgrn was built without CUDA");
#endif
    } else if (wants_grad(bias)) {
      HGRN_DISPATCH_FLOAT(out->grad.dtype(), "add_bias backward", [&] {
        const scalar_t* dy = out->grad.data<scalar_t>();
        // Summed in fixed row blocks: the same bits for any thread count.
        reduce_rows_in_fixed_blocks(rows, width, grad_buffer(bias).data<scalar_t>(), [&](int64_t r, scalar_t* part) {
          for (int64_t c = 0; c < width; ++c) part[c] += dy[r * width + c];
        });
      });
    }
    hand_over_gradient(out, x);
  });
  return out;
}

Var reshape(Tape& tape, const Var& x, const Shape& shape) {
  Var out = op_output(tape, x->value.reshape(shape), {x});
  if (!out->requires_grad) return out;
  tape.record([x, out] {
    if (!out->grad.defined()) return;
    pass_gradient(x, out->grad.reshape(x->value.shape()));
  });
  return out;
}

std::vector<Var> split_columns(Tape& tape, const Var& x, const std::vector<int64_t>& widths) {
  HGRN_CHECK(x, "split_columns: input is null");
  const bool records = tape.enabled() && wants_grad(x);
  std::vector<Var> blocks = column_block_outputs(x->value, widths, records);
  if (!records) return blocks;
  tape.record([x, blocks] {
    Tensor g = gather_column_gradients(blocks);
    if (g.defined() && !adopt_gradient(x, std::move(g))) pass_gradient(x, g);
  });
  return blocks;
}

Var contiguous_on_cpu(Tape& tape, const Var& x) {
  HGRN_CHECK(x, "contiguous_on_cpu: input is null");
  return x->value.device() == Device::CUDA ? x : contiguous(tape, x);
}

Var contiguous(Tape& tape, const Var& x) {
  HGRN_CHECK(x, "contiguous: input is null");
  if (x->value.is_contiguous()) return x;
  Var out = op_output(tape, x->value.clone(), {x});
  if (!out->requires_grad) return out;
  tape.record([x, out] {
    if (out->grad.defined()) pass_gradient(x, out->grad);
  });
  return out;
}

}  // namespace hgrn
