// lower_bounded_gated_scan.cpp: the op's CPU reference (the composition of the gate, input-gate, swiglu and scan
// ops) and its GPU path (kernels/lower_bounded_gated_scan.cu), with the checks of the fused path's inputs.
#include "ops/lower_bounded_gated_scan.h"

#include <cmath>

#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/hgrn2_gates.h"
#include "ops/rmsnorm.h"
#include "ops/sequence_resets.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/lower_bounded_gated_scan.h"
#endif

namespace hgrn {
namespace {

#ifdef HGRN_WITH_CUDA
LowerBoundedScanCudaShape cuda_shape(const Shape& s) {
  LowerBoundedScanCudaShape out;
  out.batch = s[0];
  out.time = s[1];
  out.channels = s[2];
  return out;
}

// A per-chunk buffer of the kernels (undefined when T <= 64: none is needed).
Tensor chunk_buffer(const LowerBoundedScanCudaShape& s) {
  const int64_t n = lower_bounded_scan_cuda_chunk_elements(s);
  return n > 0 ? Tensor::empty({n}, DType::F32, Device::CUDA) : Tensor();
}
float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// The inputs of the GPU path, checked: î and f̂ alike (activation dtype), γ [L, C] fp32 with layer in range, h_{−1}
// [B, C] fp32; all on the GPU.
void check_gpu_inputs(const Var& i_hat, const Var& f_hat, const Var& gamma, int64_t layer, const Var& initial_state) {
  const Tensor &iv = i_hat->value, &fv = f_hat->value;
  HGRN_CHECK(i_hat != f_hat, "lower_bounded_gated_scan: i_hat and f_hat must be different tensors");
  HGRN_CHECK(iv.shape() == fv.shape() && iv.dtype() == fv.dtype() && fv.device() == Device::CUDA,
             "lower_bounded_gated_scan: i_hat (", shape_str(iv.shape()), " ", dtype_name(iv.dtype()), " on ",
             device_name(iv.device()), ") must be a tensor like f_hat (", shape_str(fv.shape()), " ",
             dtype_name(fv.dtype()), " on ", device_name(fv.device()), ")");
  HGRN_CHECK(fv.dtype() == DType::F32 || fv.dtype() == DType::BF16,
             "lower_bounded_gated_scan: GPU activations are fp32 or bf16, got ", dtype_name(fv.dtype()));
  HGRN_CHECK(iv.is_row_strided() && fv.is_row_strided(), "lower_bounded_gated_scan: i_hat and f_hat must be row-strided");
  HGRN_CHECK(layer >= 0, "lower_bounded_gated_scan: layer must be non-negative, got ", layer);
  const int64_t C = fv.size(2);
  if (gamma) {
    const Tensor& gv = gamma->value;
    HGRN_CHECK(gv.dim() == 2 && gv.size(1) == C, "lower_bounded_gated_scan: gamma ", shape_str(gv.shape()),
               " does not match f_hat ", shape_str(fv.shape()), " (expected [L, ", C, "])");
    HGRN_CHECK(layer < gv.size(0), "lower_bounded_gated_scan: layer ", layer, " out of range for gamma with ",
               gv.size(0), " layers");
    HGRN_CHECK(gv.device() == Device::CUDA && gv.dtype() == DType::F32 && gv.is_contiguous(),
               "lower_bounded_gated_scan: gamma must be a contiguous fp32 GPU tensor, got ", dtype_name(gv.dtype()),
               " on ", device_name(gv.device()));
  }
  if (initial_state) {
    const Tensor& hv = initial_state->value;
    HGRN_CHECK(hv.shape() == Shape({fv.size(0), C}), "lower_bounded_gated_scan: initial_state must be ",
               shape_str(Shape({fv.size(0), C})), ", got ", shape_str(hv.shape()));
    HGRN_CHECK(hv.device() == Device::CUDA && hv.dtype() == DType::F32 && hv.is_contiguous(),
               "lower_bounded_gated_scan: initial_state must be a contiguous fp32 GPU tensor, got ",
               dtype_name(hv.dtype()), " on ", device_name(hv.device()));
  }
}

GatedScanOutputs lower_bounded_gated_scan_cuda(Tape& tape, const Var& i_hat, const Var& f_hat, const Var& gamma,
                                               int64_t layer, const Var& initial_state, const Tensor& resets) {
  check_gpu_inputs(i_hat, f_hat, gamma, layer, initial_state);
  const Tensor &iv = i_hat->value, &fv = f_hat->value;
  const LowerBoundedScanCudaShape shape = cuda_shape(fv.shape());
  const int64_t C = shape.channels;
  // Layer 0's bound is exactly 0: the unbounded gate, which leaves gamma out of the graph.
  const bool bounded = gamma && layer > 0;
  const Var bound = bounded ? gamma : nullptr;

  Tensor output = Tensor::empty(fv.shape(), fv.dtype(), Device::CUDA);
  Tensor final_state = Tensor::empty({shape.batch, C}, DType::F32, Device::CUDA);
  const Tensor chunk_states = chunk_buffer(shape);  // the state entering each chunk: kept for the backward
  const Tensor reset_masks = reset_chunk_masks(resets);  // likewise
  const uint64_t* masks =
      reset_masks.defined() ? reinterpret_cast<const uint64_t*>(reset_masks.data<int64_t>()) : nullptr;
  {
    const Tensor scratch = chunk_buffer(shape);
    LowerBoundedScanCudaForwardArgs a;
    a.i_hat = iv.raw_data();
    a.i_stride = iv.row_stride();
    a.f_hat = fv.raw_data();
    a.f_stride = fv.row_stride();
    a.act = fv.dtype();
    a.gamma_row = bounded ? gamma->value.data<float>() + layer * C : nullptr;
    a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
    a.output = output.raw_data();
    a.final_state = final_state.data<float>();
    a.chunk_states = data_or_null(chunk_states);
    a.scratch = data_or_null(scratch);
    a.reset_masks = masks;
    lower_bounded_scan_cuda_forward(shape, a);
  }

  GatedScanOutputs result{op_output(tape, output, {i_hat, f_hat, bound, initial_state}),
                          op_output(tape, final_state, {i_hat, f_hat, bound, initial_state})};
  if (!result.output->requires_grad) return result;
  Var out = result.output, final_out = result.final_state;
  tape.record([i_hat, f_hat, bound, layer, initial_state, out, final_out, chunk_states, reset_masks, masks, shape] {
    if (!out->grad.defined() && !final_out->grad.defined()) return;
    if (out->grad.defined())
      HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
                 "lower_bounded_gated_scan: the output's gradient must be contiguous ",
                 dtype_name(out->value.dtype()), ", got ", dtype_name(out->grad.dtype()));
    if (final_out->grad.defined())
      HGRN_CHECK(final_out->grad.dtype() == DType::F32 && final_out->grad.is_contiguous(),
                 "lower_bounded_gated_scan: the final state's gradient must be contiguous fp32");
    const int64_t C = shape.channels;
    const Tensor scratch_a = chunk_buffer(shape), scratch_b = chunk_buffer(shape);
    Tensor workspace;
    LowerBoundedScanCudaBackwardArgs a;
    a.i_hat = i_hat->value.raw_data();
    a.i_stride = i_hat->value.row_stride();
    a.f_hat = f_hat->value.raw_data();
    a.f_stride = f_hat->value.row_stride();
    a.act = f_hat->value.dtype();
    a.gamma_row = bound ? bound->value.data<float>() + layer * C : nullptr;
    a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
    a.chunk_states = data_or_null(chunk_states);
    a.reset_masks = masks;
    HGRN_CHECK(out->value.defined(), "lower_bounded_gated_scan: the output was released before the backward, "
               "which reads it");
    a.output = out->value.raw_data();
    a.d_output = out->grad.defined() ? out->grad.raw_data() : nullptr;
    a.d_final_state = final_out->grad.defined() ? final_out->grad.data<float>() : nullptr;
    // Column blocks of a split get their places in the split's gradient (row-strided); fresh buffers are written.
    if (wants_grad(i_hat)) {
      const Tensor& di = grad_buffer_for_write(i_hat, &a.accumulate_di, GradLayout::RowStrided);
      a.di = di.raw_data();
      a.di_stride = di.row_stride();
    }
    if (wants_grad(f_hat)) {
      const Tensor& df = grad_buffer_for_write(f_hat, &a.accumulate_df, GradLayout::RowStrided);
      a.df = df.raw_data();
      a.df_stride = df.row_stride();
    }
    if (wants_grad(initial_state))
      a.d_initial_state = grad_buffer_for_write(initial_state, &a.accumulate_d_initial_state).data<float>();
    if (wants_grad(bound)) {
      a.dgamma_row = grad_buffer(bound).data<float>() + layer * C;  // each layer adds its row of [L, C]
      workspace = Tensor::empty({lower_bounded_scan_cuda_dgamma_workspace(shape)}, DType::F32, Device::CUDA);
      a.workspace = workspace.data<float>();
    }
    a.scratch_a = data_or_null(scratch_a);
    a.scratch_b = data_or_null(scratch_b);
    lower_bounded_scan_cuda_backward(shape, a);
  });
  return result;
}
#endif

}  // namespace

GatedScanOutputs lower_bounded_gated_scan(Tape& tape, const Var& i_hat, const Var& f_hat, const Var& gamma,
                                          int64_t layer, const Var& initial_state, ScanMode mode,
                                          const Tensor& resets) {
  HGRN_CHECK(i_hat && f_hat, "lower_bounded_gated_scan: i_hat and f_hat are required");
  HGRN_CHECK(f_hat->value.dim() == 3 && f_hat->value.numel() > 0, "lower_bounded_gated_scan: f_hat must be a "
             "non-empty [B, T, C], got ", shape_str(f_hat->value.shape()));
  check_resets(resets, f_hat->value.size(0), f_hat->value.size(1), f_hat->value.device(), "lower_bounded_gated_scan");
  if (f_hat->value.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    return lower_bounded_gated_scan_cuda(tape, i_hat, f_hat, gamma, layer, initial_state, resets);
#else
    throw Error("lower_bounded_gated_scan: this hgrn was built without CUDA");
#endif
  }
  // The reference: the ops HGRN1's mixer composes, recorded in its order.
  const Var g = hgrn2_forget_gate(tape, contiguous_on_cpu(tape, f_hat), gamma, layer);
  const Var k = input_gate_from_forget(tape, g, f_hat->value.dtype());
  const Var u = swiglu(tape, contiguous(tape, i_hat), k);
  return gated_scan(tape, u, g, initial_state, mode, /*chunk_size=*/0, resets);
}

void lower_bounded_gated_scan_step(const Tensor& i_hat, const Tensor& f_hat, const Tensor& gamma, int64_t layer,
                                   Tensor& state, const Tensor& g_hat, const Tensor& norm_weight, double eps,
                                   Tensor& out) {
  const char* op = "lower_bounded_gated_scan_step";
  HGRN_CHECK(f_hat.dim() == 2 && i_hat.shape() == f_hat.shape() && g_hat.shape() == f_hat.shape(), op,
             ": i_hat ", shape_str(i_hat.shape()), ", f_hat ", shape_str(f_hat.shape()), " and g_hat ",
             shape_str(g_hat.shape()), " must all be [B, C]");
  HGRN_CHECK(i_hat.dtype() == f_hat.dtype() && g_hat.dtype() == f_hat.dtype() && i_hat.device() == f_hat.device() &&
                 g_hat.device() == f_hat.device(),
             op, ": i_hat, f_hat and g_hat must share one dtype and device");
  HGRN_CHECK(i_hat.is_row_strided() && f_hat.is_row_strided() && g_hat.is_row_strided(), op,
             ": i_hat, f_hat and g_hat must be row-strided");
  const int64_t B = f_hat.size(0), C = f_hat.size(1);
  const Device device = f_hat.device();
  const DType fp = device == Device::CUDA ? DType::F32 : f_hat.dtype();  // the state's, γ's and the norm's
  HGRN_CHECK(state.shape() == Shape({B, C}) && state.dtype() == fp && state.device() == device &&
                 state.is_contiguous(),
             op, ": state must be a contiguous ", dtype_name(fp), " ", shape_str(Shape({B, C})), ", got ",
             dtype_name(state.dtype()), " ", shape_str(state.shape()));
  HGRN_CHECK(norm_weight.shape() == Shape({C}) && norm_weight.dtype() == fp && norm_weight.device() == device &&
                 norm_weight.is_contiguous(),
             op, ": norm_weight must be a contiguous ", dtype_name(fp), " [", C, "]");
  HGRN_CHECK(out.shape() == Shape({B, C}) && out.dtype() == f_hat.dtype() && out.device() == device &&
                 out.is_contiguous(),
             op, ": out must be a contiguous ", dtype_name(f_hat.dtype()), " ", shape_str(Shape({B, C})));
  HGRN_CHECK(eps >= 0 && std::isfinite(eps), op, ": eps must be finite and non-negative, got ", eps);
  check_lower_bounds_for_step(op, gamma, layer, C, device, fp);
  if (B == 0 || C == 0) return;

  if (device == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    HGRN_CHECK(f_hat.dtype() == DType::F32 || f_hat.dtype() == DType::BF16, op,
               ": GPU activations are fp32 or bf16, got ", dtype_name(f_hat.dtype()));
    LowerBoundedScanStepArgs a;
    a.batch = B;
    a.channels = C;
    a.act = f_hat.dtype();
    a.i_hat = i_hat.raw_data();
    a.f_hat = f_hat.raw_data();
    a.g_hat = g_hat.raw_data();
    a.i_stride = i_hat.row_stride();
    a.f_stride = f_hat.row_stride();
    a.g_stride = g_hat.row_stride();
    a.gamma_row = gamma.defined() && layer > 0 ? gamma.data<float>() + layer * C : nullptr;
    a.state = state.data<float>();
    a.norm_weight = norm_weight.data<float>();
    a.eps = static_cast<float>(eps);
    a.out = out.raw_data();
    lower_bounded_scan_cuda_step(a);
    return;
#else
    throw Error("lower_bounded_gated_scan_step: this hgrn was built without CUDA");
#endif
  }
  // The reference: the ops HGRN1's op-by-op step runs (models/hgrn1/hgrn1.cpp), on one position.
  Tape untaped;
  untaped.set_enabled(false);
  const auto one_position = [](const Tensor& rows) {
    Tensor copy = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
    copy.copy_from(rows);
    return make_var(copy.reshape({rows.size(0), 1, rows.size(1)}));
  };
  const GatedScanOutputs r = lower_bounded_gated_scan(untaped, one_position(i_hat), one_position(f_hat),
                                                      gamma.defined() ? make_var(gamma) : nullptr, layer,
                                                      make_var(state), ScanMode::Sequential);
  const Var normed = rmsnorm(untaped, r.output, make_var(norm_weight), eps);
  state.copy_from(r.final_state->value);
  out.copy_from(swiglu(untaped, one_position(g_hat), normed)->value.reshape({B, C}));
}

}  // namespace hgrn
