// swiglu_linear.cpp: see swiglu_linear.h. Built from activations' and linear's pieces; no arithmetic of its own.
#include "ops/swiglu_linear.h"

#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/fp8_linear.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"

namespace hgrn {

// Where gate and up are the two column blocks of one FP8 projection's output (the MLP's fused gate/up: linear_columns,
// SplitGradient::fp8_weight) and nothing has written their gradient yet, SwiGLU's backward writes that gradient as the
// projection's E5M2 output-gradient codes (`written`; ops/fp8_linear.h: fp8_output_gradient_codes), which the
// projection then reads: a 1-byte write an element where there were a 2-byte write, a 2-byte read and a 1-byte write.
// They are the codes of the cast, so the bits stay. False where not, or where the gradient has no scale yet (its first
// cast takes the scale from its own values).
static bool gate_up_gradient_codes(const Var& gate, const Var& up, Fp8OutputGradient& written,
                                   SwigluGradientCodes& codes) {
  const std::shared_ptr<SplitGradient>& split = gate->split;
  if (!split || split != up->split || !split->fp8_weight || split->buffer.defined() || split->fp8_gradient ||
      !wants_grad(gate) || !wants_grad(up) || gate->grad.defined() || up->grad.defined())
    return false;
  const int64_t width = gate->value.size(-1);
  if (width == 0 || split->shape.back() != 2 * width) return false;  // empty, or other blocks share the gradient
  const int64_t rows = gate->value.numel() / width;
  const Fp8CodesOut out = fp8_output_gradient_codes(split->fp8_weight, rows, 2 * width, written);
  if (!out.codes) return false;
  codes = {out, 2 * width, gate->split_column, up->split_column};
  return true;
}

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
  // hidden from gate and up, into `values` (the act dtype) or as FP8 codes; with the norm, its rstd is returned.
  const bool normed = up_norm != nullptr;
  const auto make_hidden = [normed](const Var& gate, const Var& up, const UpNorm& norm, Tensor* values,
                                    const Fp8CodesOut* codes) {
    const Tensor* norm_weight = norm.weight ? &norm.weight->value : nullptr;
    if (normed)
      return codes ? gated_rmsnorm_forward_codes(up->value, norm_weight, gate->value, norm.eps, norm.group_width, *codes)
                   : gated_rmsnorm_forward(up->value, norm_weight, gate->value, norm.eps, norm.group_width, *values);
    if (codes)
      swiglu_forward_codes(gate->value, up->value, *codes);
    else
      swiglu_forward(gate->value, &up->value, *values);
    return Tensor();
  };
  // FP8 with hidden not kept: hidden exists only as the projection's FP8 codes (swiglu_linear.h), once its input has
  // a scale (ops/fp8_linear.h: Fp8ProducedInput).
  const Fp8ProducedInput produced =
      !keep_hidden && weight->value.dim() == 2 && weight->value.size(1) == width
          ? fp8_produced_input(weight, weight->value, gv.device(), gv.dtype(), rows, /*forward=*/true)
          : Fp8ProducedInput{};
  const bool as_codes = produced.codes.defined();
  Tensor hidden = as_codes ? Tensor() : Tensor::empty(gv.shape(), gv.dtype(), gv.device());
  const Tensor rstd = make_hidden(gate, up, norm, &hidden, as_codes ? &produced.out : nullptr);
  // FP8 (ops/fp8_linear.h), or the GEMMs of linear on the weight or its bf16 copy.
  const bool fp8 = as_codes || fp8_linear_applies(weight, hidden, weight->value);
  const Tensor w_compute = fp8 ? Tensor() : weight_for_input(weight, hidden);
  Shape shape = gv.shape();
  shape.back() = weight->value.size(0);
  Var out = op_output(tape,
                      as_codes ? fp8_linear_forward_produced(weight, produced, weight->value, residual_value, shape,
                                                             gv.dtype())
                      : fp8    ? fp8_linear_forward(weight, hidden, weight->value, residual_value)
                               : linear_product(hidden, w_compute, residual_value),
                      {gate, up, weight, residual, norm.weight});
  if (!out->requires_grad) return out;
  const bool copied = !fp8 && w_compute.dtype() != weight->value.dtype();
  if (!keep_hidden) hidden = Tensor();
  // gate and up are read through their Vars when the backward runs: a model may release and rematerialize them.
  tape.record([gate, up, weight, residual, out, hidden, copied, fp8, as_codes, rows, norm, rstd, make_hidden] {
    if (!out->grad.defined()) return;
    const Tensor& dy = out->grad;
    const Fp8OutputGradient dy_fp8 = fp8 ? fp8_output_gradient(weight, dy) : Fp8OutputGradient{};
    const Tensor& g = gate->value;
    // hidden again for dW where it was not kept: as codes where the forward made codes, else in h.
    const Fp8ProducedInput h_codes =
        as_codes ? fp8_produced_input(weight, weight->value, g.device(), g.dtype(), rows, /*forward=*/false)
                 : Fp8ProducedInput{};
    HGRN_CHECK(h_codes.codes.defined() == as_codes, "swiglu_linear backward: the FP8 input lost its scale");
    const Fp8CodesOut* codes = as_codes ? &h_codes.out : nullptr;
    Tensor h = hidden;
    if (wants_grad(gate) || wants_grad(up) || wants_grad(norm.weight)) {
      Tensor dhidden = Tensor::empty(g.shape(), g.dtype(), g.device());
      if (fp8)
        fp8_linear_input_gradient(weight, dy_fp8, weight->value, 0.0f, dhidden);
      else
        linear_input_gradient(dy, copied ? bf16_weight_copy(weight) : weight->value, 0.0f, dhidden);
      // hidden written over dhidden once read, where it is neither kept nor made as codes
      Tensor* again = h.defined() || as_codes ? nullptr : &dhidden;
      Fp8OutputGradient written;
      SwigluGradientCodes gradient_codes;
      if (rstd.defined()) {
        gated_rmsnorm_backward(up, norm.weight, gate, rstd, norm.eps, norm.group_width, dhidden, again, codes);
      } else if (gate_up_gradient_codes(gate, up, written, gradient_codes)) {
        swiglu_backward(gate, up, dhidden, again, codes, &gradient_codes);
        gate->split->fp8_gradient = std::make_shared<Fp8OutputGradient>(std::move(written));
      } else {
        swiglu_backward(gate, up, dhidden, again, codes);
      }
      if (again) h = dhidden;
    } else if (!h.defined()) {
      if (!as_codes) h = Tensor::empty(g.shape(), g.dtype(), g.device());
      make_hidden(gate, up, norm, &h, codes);
    }
    if (wants_grad(weight)) {
      if (as_codes)
        linear_weight_gradient(dy_fp8, h_codes, weight);
      else if (fp8)
        linear_weight_gradient(dy_fp8, h, weight);
      else
        linear_weight_gradient(dy, h, weight);
    }
    if (wants_grad(residual)) hand_over_gradient(out, residual);  // last: dy may become residual's buffer
  });
  return out;
}

}  // namespace hgrn
