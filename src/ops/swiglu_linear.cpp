// swiglu_linear.cpp: see swiglu_linear.h. Built from activations' and linear's pieces; no arithmetic of its own.
#include "ops/swiglu_linear.h"

#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/fp8_linear.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"

namespace hgrn {

Var swiglu_linear(Tape& tape, const Var& gate_in, const Var& up_in, const Var& weight, bool keep_hidden,
                  const Var& residual, const UpNorm* up_norm) {
  HGRN_CHECK(gate_in && up_in && weight, "swiglu_linear: an input is null");
  // gate and up may be row-strided (column blocks of the fused gate/up projection: linear_columns), read in place.
  const Var& gate = gate_in;
  const Var& up = up_in;
  const Tensor& gv = gate->value;
  HGRN_CHECK(gv.is_row_strided() && up->value.is_row_strided(), "swiglu_linear: gate and up must be row-strided");
  HGRN_CHECK(gv.shape() == up->value.shape(), "swiglu_linear: gate ", shape_str(gv.shape()), " and up ",
             shape_str(up->value.shape()), " differ in shape");
  HGRN_CHECK(gv.dtype() == up->value.dtype() && gv.device() == up->value.device(), "swiglu_linear: gate is ",
             dtype_name(gv.dtype()), " on ", device_name(gv.device()), ", up is ", dtype_name(up->value.dtype()),
             " on ", device_name(up->value.device()));
  const UpNorm norm = up_norm ? *up_norm : UpNorm{};
  const Tensor* residual_value = residual ? &residual->value : nullptr;
  const int64_t width = gv.size(-1), rows = gv.numel() / std::max<int64_t>(width, 1);
  // FP8 with hidden not kept: SwiGLU (or the gated norm) writes it as the projection's FP8 input, never in bf16
  // (ops/fp8_linear.h: Fp8ProducedInput), and the backward writes it again as codes for dW.
  const bool produce = !keep_hidden && weight->value.dim() == 2 && weight->value.size(1) == width;
  const Fp8ProducedInput produced =
      produce ? fp8_produced_input(weight, weight->value, gv.device(), gv.dtype(), rows, /*forward=*/true)
              : Fp8ProducedInput{};
  if (produced.codes.defined()) {
    // hidden as codes from gate and up; with the norm, its rstd is returned.
    const bool normed = up_norm != nullptr;
    const auto hidden_codes = [normed](const Var& gate, const Var& up, const UpNorm& norm, const Fp8CodesOut& codes) {
      if (normed)
        return gated_rmsnorm_forward_codes(up->value, norm.weight ? &norm.weight->value : nullptr, gate->value,
                                           norm.eps, norm.group_width, codes);
      swiglu_forward_codes(gate->value, up->value, codes);
      return Tensor();
    };
    const Tensor rstd = hidden_codes(gate, up, norm, produced.out);
    Shape shape = gv.shape();
    shape.back() = weight->value.size(0);
    Var out = op_output(
        tape, fp8_linear_forward_produced(weight, produced, weight->value, residual_value, shape, gv.dtype()),
        {gate, up, weight, residual, norm.weight});
    if (!out->requires_grad) return out;
    tape.record([gate, up, weight, residual, out, rows, norm, rstd, hidden_codes] {
      if (!out->grad.defined()) return;
      const Fp8OutputGradient dy = fp8_output_gradient(weight, out->grad);
      Fp8ProducedInput h =
          fp8_produced_input(weight, weight->value, gate->value.device(), gate->value.dtype(), rows, false);
      HGRN_CHECK(h.codes.defined(), "swiglu_linear backward: the FP8 input lost its scale since the forward");
      if (wants_grad(gate) || wants_grad(up) || wants_grad(norm.weight)) {
        Tensor dhidden = Tensor::empty(gate->value.shape(), gate->value.dtype(), gate->value.device());
        fp8_linear_input_gradient(weight, dy, weight->value, 0.0f, dhidden);
        if (rstd.defined())
          gated_rmsnorm_backward(up, norm.weight, gate, rstd, norm.eps, norm.group_width, dhidden, nullptr, &h.out);
        else
          swiglu_backward(gate, up, dhidden, nullptr, &h.out);
      } else {
        hidden_codes(gate, up, norm, h.out);
      }
      if (wants_grad(weight)) linear_weight_gradient(dy, h, weight);
      if (wants_grad(residual)) hand_over_gradient(out, residual);  // last: dy may become residual's buffer
    });
    return out;
  }
  Tensor hidden = Tensor::empty(gv.shape(), gv.dtype(), gv.device());
  Tensor rstd;  // the norm's, with up_norm
  if (up_norm) {
    rstd = gated_rmsnorm_forward(up->value, norm.weight ? &norm.weight->value : nullptr, gv, norm.eps,
                                 norm.group_width, hidden);
  } else {
    swiglu_forward(gv, &up->value, hidden);
  }
  // FP8 (ops/fp8_linear.h), or the GEMMs of linear on the weight or its bf16 copy.
  const bool fp8 = fp8_linear_applies(weight, hidden, weight->value);
  const Tensor w_compute = fp8 ? Tensor() : weight_for_input(weight, hidden);
  Var out = op_output(tape,
                      fp8 ? fp8_linear_forward(weight, hidden, weight->value, residual_value)
                          : linear_product(hidden, w_compute, residual_value),
                      {gate, up, weight, residual, norm.weight});
  if (!out->requires_grad) return out;
  const bool copied = !fp8 && w_compute.dtype() != weight->value.dtype();
  if (!keep_hidden) hidden = Tensor();
  // gate and up are read through their Vars when the backward runs: a model may release and rematerialize them.
  tape.record([gate, up, weight, residual, out, hidden, copied, fp8, norm, rstd] {
    if (!out->grad.defined()) return;
    const Tensor& dy = out->grad;
    const Fp8OutputGradient dy_fp8 = fp8 ? fp8_output_gradient(weight, dy) : Fp8OutputGradient{};
    const Tensor& g = gate->value;
    Tensor h = hidden;
    // hidden from gate and up (and the norm's rstd) into h.
    const auto hidden_again = [&](Tensor& h) {
      if (rstd.defined())
        gated_rmsnorm_forward(up->value, norm.weight ? &norm.weight->value : nullptr, g, norm.eps, norm.group_width, h);
      else
        swiglu_forward(g, &up->value, h);
    };
    if (wants_grad(gate) || wants_grad(up) || wants_grad(norm.weight)) {
      Tensor dhidden = Tensor::empty(g.shape(), g.dtype(), g.device());
      if (fp8)
        fp8_linear_input_gradient(weight, dy_fp8, weight->value, 0.0f, dhidden);
      else
        linear_input_gradient(dy, copied ? bf16_weight_copy(weight) : weight->value, 0.0f, dhidden);
      if (rstd.defined())
        gated_rmsnorm_backward(up, norm.weight, gate, rstd, norm.eps, norm.group_width, dhidden,
                               h.defined() ? nullptr : &dhidden);
      else
        swiglu_backward(gate, up, dhidden, h.defined() ? nullptr : &dhidden);
      if (!h.defined()) h = dhidden;  // dhidden's buffer now holds hidden
    } else if (!h.defined()) {
      h = Tensor::empty(g.shape(), g.dtype(), g.device());
      hidden_again(h);
    }
    if (wants_grad(weight) && fp8)
      linear_weight_gradient(dy_fp8, h, weight);
    else if (wants_grad(weight))
      linear_weight_gradient(dy, h, weight);
    if (wants_grad(residual)) hand_over_gradient(out, residual);  // last: dy may become residual's buffer
  });
  return out;
}

}  // namespace hgrn
