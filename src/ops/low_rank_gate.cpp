// low_rank_gate.cpp: low_rank_log_sigmoid_gate, forward and backward: the CPU reference here, the GPU through
// kernels/low_rank_gate.h. With x = u·Wᵀ + b and (log σ)'(x) = σ(−x): d = dy·σ(−x)/divisor, du = d·W, dW = dᵀ·u,
// db = Σ_rows d.
#include "ops/low_rank_gate.h"

#include <cmath>
#include <functional>
#include <vector>

#include "ops/cpu_math.h"
#include "ops/cpu_parallel.h"
#include "ops/linear.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/low_rank_gate.h"
#endif

namespace hgrn {

namespace {

// rows of u, u_stride elements apart, against the weight's `out` rows of `rank`.
struct GateRows {
  int64_t rows = 0, out = 0, rank = 0, u_stride = 0;
};

// One output's logit: Σ_r u[r]·w[r] (r ascending), then the bias, as the projection and the bias add it replaces.
template <typename T>
inline T gate_logit(const T* u, const T* w, T b, int64_t rank) {
  T x = T(0);
  for (int64_t r = 0; r < rank; ++r) x += u[r] * w[r];
  return x + b;
}

template <typename T>
void gate_forward_cpu(const T* u, const T* w, const T* b, T divisor, T* y, const GateRows& g) {
#pragma omp parallel for schedule(static) if (g.rows * g.out * g.rank >= kMinParallelElements)
  for (int64_t n = 0; n < g.rows; ++n) {
    const T* un = u + n * g.u_stride;
    T* yn = y + n * g.out;
    for (int64_t o = 0; o < g.out; ++o)
      yn[o] = stable_log_sigmoid(gate_logit(un, w + o * g.rank, b[o], g.rank)) / divisor;
  }
}

// du (+)= d·W row by row (rows du_stride apart; add_du false overwrites), and where `sums` is asked for dᵀ·u and
// Σ_rows d (dW's elements, then db's), summed in fixed row blocks (the same bits for any thread count); empty if not.
template <typename T>
std::vector<T> gate_backward_cpu(const T* u, const T* w, const T* b, const T* dy, T divisor, T* du,
                                 int64_t du_stride, bool add_du, bool sums_wanted, const GateRows& g) {
  const int64_t sums_width = g.out * g.rank + g.out;
  std::vector<T> sums(sums_wanted ? static_cast<size_t>(sums_width) : 0, T(0));
  reduce_rows_in_fixed_blocks(g.rows, sums_width, sums.empty() ? nullptr : sums.data(), [&](int64_t n, T* partial) {
    thread_local std::vector<T> d;  // the row's d, one per output
    d.resize(static_cast<size_t>(g.out));
    const T* un = u + n * g.u_stride;
    const T* dyn = dy + n * g.out;
    for (int64_t o = 0; o < g.out; ++o)
      d[o] = dyn[o] * stable_sigmoid(-gate_logit(un, w + o * g.rank, b[o], g.rank)) / divisor;
    if (du) {
      T* dun = du + n * du_stride;
      for (int64_t r = 0; r < g.rank; ++r) {
        T s = T(0);
        for (int64_t o = 0; o < g.out; ++o) s += d[o] * w[o * g.rank + r];
        dun[r] = add_du ? dun[r] + s : s;
      }
    }
    if (partial) {
      for (int64_t o = 0; o < g.out; ++o) {
        for (int64_t r = 0; r < g.rank; ++r) partial[o * g.rank + r] += d[o] * un[r];
        partial[g.out * g.rank + o] += d[o];
      }
    }
  });
  return sums;
}

// The weight gradient's last step (its sums added into the weight's gradient): now, or where a WeightGradientQueue is
// open, later with the projections' weight gradients (layer 0's under data parallelism wait until the embedding's
// gradient is reported: ops/linear.h).
void add_weight_gradient(const std::function<void()>& work) {
  if (!WeightGradientQueue::defer(std::function<void()>(work))) work();
}

}  // namespace

Var low_rank_log_sigmoid_gate(Tape& tape, const Var& u, const Var& weight, const Var& bias, double divisor,
                              DType out_dtype) {
  const char* op = "low_rank_log_sigmoid_gate";
  HGRN_CHECK(u && weight && bias, op, ": an input is null");
  const Tensor &uv = u->value, &wv = weight->value, &bv = bias->value;
  HGRN_CHECK(uv.dim() >= 1 && uv.size(-1) >= 1 && uv.is_row_strided(), op,
             ": u must be row-strided with a non-empty last axis, got ", shape_str(uv.shape()));
  HGRN_CHECK(wv.dim() == 2 && wv.size(0) >= 1 && wv.size(1) == uv.size(-1) && wv.is_contiguous(), op, ": weight ",
             shape_str(wv.shape()), " does not fit u ", shape_str(uv.shape()), " (expected a contiguous [out, ",
             uv.size(-1), "])");
  HGRN_CHECK(bv.shape() == Shape{wv.size(0)} && bv.is_contiguous(), op, ": bias ", shape_str(bv.shape()),
             " does not match weight ", shape_str(wv.shape()));
  HGRN_CHECK(wv.device() == uv.device() && bv.device() == uv.device(), op, ": u on ", device_name(uv.device()),
             ", weight on ", device_name(wv.device()), ", bias on ", device_name(bv.device()));
  const bool on_gpu = uv.device() == Device::CUDA;
  // On the GPU the weight and bias are fp32 parameters whatever the activation dtype, and the gate is fp32; the CPU
  // computes in one dtype throughout.
  const DType param_dtype = on_gpu ? DType::F32 : uv.dtype();
  HGRN_CHECK(wv.dtype() == param_dtype && bv.dtype() == param_dtype, op, ": u is ", dtype_name(uv.dtype()), " on ",
             device_name(uv.device()), ", weight and bias are ", dtype_name(wv.dtype()), " and ",
             dtype_name(bv.dtype()), " (expected ", dtype_name(param_dtype), ")");
  HGRN_CHECK(out_dtype == param_dtype, op, ": output dtype ", dtype_name(out_dtype), " for a ",
             dtype_name(uv.dtype()), " u on ", device_name(uv.device()), " (expected ", dtype_name(param_dtype), ")");
  HGRN_CHECK(std::isfinite(divisor) && divisor != 0, op, ": divisor must be finite and non-zero, got ", divisor);

  GateRows g;
  g.rank = uv.size(-1);
  g.out = wv.size(0);
  g.rows = uv.numel() / g.rank;
  g.u_stride = uv.row_stride();
  Shape shape = uv.shape();
  shape.back() = g.out;
  Tensor y = Tensor::empty(shape, out_dtype, uv.device());
  if (on_gpu) {
#ifdef HGRN_WITH_CUDA
    cuda_low_rank_gate_forward(uv.raw_data(), uv.dtype(), wv.data<float>(), bv.data<float>(),
                               static_cast<float>(divisor), y.data<float>(), {g.rows, g.out, g.rank, g.u_stride});
#else
    throw Error(std::string(op) + ": this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(uv.dtype(), op, [&] {
      gate_forward_cpu(uv.data<scalar_t>(), wv.data<scalar_t>(), bv.data<scalar_t>(), static_cast<scalar_t>(divisor),
                       y.data<scalar_t>(), g);
    });
  }
  Var result = op_output(tape, y, {u, weight, bias});
  if (!result->requires_grad) return result;
  tape.record([u, weight, bias, result, divisor, out_dtype, g] {
    if (!result->grad.defined()) return;
    const Tensor& dy = result->grad;
    HGRN_CHECK(dy.dtype() == out_dtype && dy.is_contiguous(),
               "low_rank_log_sigmoid_gate backward: the output's gradient must be contiguous ", dtype_name(out_dtype));
    // Overwritten when this is the first gradient to reach u (no zero fill); row-strided for a column block: its
    // columns of the parent's gradient.
    bool add_du = false;
    Tensor* du = wants_grad(u) ? &grad_buffer_for_write(u, &add_du, GradLayout::RowStrided) : nullptr;
    Tensor* db = wants_grad(bias) ? &grad_buffer(bias) : nullptr;
    if (dy.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      LowRankGateBackwardArgs a;
      a.u = u->value.raw_data();
      a.u_dtype = u->value.dtype();
      a.weight = weight->value.data<float>();
      a.bias = bias->value.data<float>();
      a.dy = dy.data<float>();
      a.divisor = static_cast<float>(divisor);
      a.du = du ? du->raw_data() : nullptr;
      a.du_stride = du ? du->row_stride() : 0;
      a.add_du = add_du;
      a.dbias = db ? db->data<float>() : nullptr;
      a.shape = {g.rows, g.out, g.rank, g.u_stride};
      Tensor partials;  // dW's sums over blocks of rows
      if (wants_grad(weight)) {
        partials = Tensor::empty({cuda_low_rank_gate_weight_partials(a.shape)}, DType::F32, Device::CUDA);
        a.dweight_partials = partials.data<float>();
      }
      cuda_low_rank_gate_backward(a);
      if (wants_grad(weight))
        add_weight_gradient([partials, weight, shape = a.shape] {
          cuda_low_rank_gate_add_weight_partials(partials.data<float>(), grad_buffer(weight).data<float>(), shape);
        });
      return;
#else
      throw Error("low_rank_log_sigmoid_gate: this hgrn was built without CUDA");
#endif
    }
    HGRN_DISPATCH_FLOAT(dy.dtype(), "low_rank_log_sigmoid_gate backward", [&] {
      std::vector<scalar_t> sums = gate_backward_cpu(
          u->value.data<scalar_t>(), weight->value.data<scalar_t>(), bias->value.data<scalar_t>(),
          dy.data<scalar_t>(), static_cast<scalar_t>(divisor), du ? du->data<scalar_t>() : nullptr,
          du ? du->row_stride() : 0, add_du, wants_grad(weight) || db, g);
      const int64_t weight_sums = g.out * g.rank;
      if (db)
        for (int64_t o = 0; o < g.out; ++o) db->data<scalar_t>()[o] += sums[static_cast<size_t>(weight_sums + o)];
      if (wants_grad(weight)) {
        sums.resize(static_cast<size_t>(weight_sums));
        add_weight_gradient([sums = std::move(sums), weight] {
          scalar_t* dw = grad_buffer(weight).data<scalar_t>();
          for (size_t i = 0; i < sums.size(); ++i) dw[i] += sums[i];
        });
      }
    });
  });
  return result;
}

}  // namespace hgrn
