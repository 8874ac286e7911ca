// activations.cpp: silu and swiglu, forward and backward.
// silu'(x) = σ(x) · (1 + x · (1 − σ(x))).
#include "ops/activations.h"

#include <cmath>

#include "ops/cpu_parallel.h"

namespace hgrn {

// The logistic sigmoid without overflow: exp is only ever taken of a non-positive number.
template <typename T>
static inline T stable_sigmoid(T x) {
  if (x >= 0) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

template <typename T>
static void silu_forward_cpu(const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * stable_sigmoid(x[i]);
}

template <typename T>
static void silu_backward_cpu(const T* x, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const T s = stable_sigmoid(x[i]);
    dx[i] += dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

template <typename T>
static void swiglu_forward_cpu(const T* gate, const T* up, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * stable_sigmoid(gate[i]) * up[i];
}

// dgate and dup may each be null when that input needs no gradient.
template <typename T>
static void swiglu_backward_cpu(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const T s = stable_sigmoid(gate[i]);
    if (dgate) dgate[i] += dy[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
    if (dup) dup[i] += dy[i] * gate[i] * s;
  }
}

static void check_cpu_input(const char* op, const Var& v) {
  HGRN_CHECK(v, op, ": input is null");
  HGRN_CHECK(v->value.device() == Device::CPU && v->value.is_contiguous(), op,
             ": inputs must be contiguous CPU tensors");
}

Var silu(Tape& tape, const Var& x) {
  check_cpu_input("silu", x);
  const int64_t n = x->value.numel();
  Tensor y = Tensor::empty(x->value.shape(), x->value.dtype());
  HGRN_DISPATCH_FLOAT(y.dtype(), "silu", [&] { silu_forward_cpu(x->value.data<scalar_t>(), y.data<scalar_t>(), n); });
  Var out = op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, out, n] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "silu backward", [&] {
      silu_backward_cpu(x->value.data<scalar_t>(), out->grad.data<scalar_t>(), grad_buffer(x).data<scalar_t>(), n);
    });
  });
  return out;
}

Var swiglu(Tape& tape, const Var& gate, const Var& up) {
  check_cpu_input("swiglu", gate);
  check_cpu_input("swiglu", up);
  HGRN_CHECK(gate->value.shape() == up->value.shape(), "swiglu: gate ", shape_str(gate->value.shape()), " and up ",
             shape_str(up->value.shape()), " differ in shape");
  HGRN_CHECK(gate->value.dtype() == up->value.dtype(), "swiglu: gate is ", dtype_name(gate->value.dtype()),
             ", up is ", dtype_name(up->value.dtype()));
  const int64_t n = gate->value.numel();
  Tensor y = Tensor::empty(gate->value.shape(), gate->value.dtype());
  HGRN_DISPATCH_FLOAT(y.dtype(), "swiglu", [&] {
    swiglu_forward_cpu(gate->value.data<scalar_t>(), up->value.data<scalar_t>(), y.data<scalar_t>(), n);
  });
  Var out = op_output(tape, y, {gate, up});
  if (!out->requires_grad) return out;
  tape.record([gate, up, out, n] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "swiglu backward", [&] {
      swiglu_backward_cpu(gate->value.data<scalar_t>(), up->value.data<scalar_t>(), out->grad.data<scalar_t>(),
                          wants_grad(gate) ? grad_buffer(gate).data<scalar_t>() : nullptr,
                          wants_grad(up) ? grad_buffer(up).data<scalar_t>() : nullptr, n);
    });
  });
  return out;
}

}  // namespace hgrn
