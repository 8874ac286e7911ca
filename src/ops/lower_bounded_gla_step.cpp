// lower_bounded_gla_step.cpp: the step's checks, its CPU reference (the gates and the recurrence ops on one
// position) and the dispatch to its GPU kernel.
#include "ops/lower_bounded_gla_step.h"

#include "ops/gla_recurrence.h"
#include "ops/hgrn2_gates.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/lower_bounded_gla_step.h"
#endif

namespace hgrn {
namespace {

// Rows [B, width] (row-strided) as a contiguous sequence of one position [B, 1, width], for the ops on sequences.
Var one_position(const Tensor& rows) {
  Tensor copy = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
  copy.copy_from(rows);
  return make_var(copy.reshape({rows.size(0), 1, rows.size(1)}));
}

}  // namespace

void lower_bounded_gla_step(const Tensor& q_hat, const Tensor& f_hat, const Tensor& v, const Tensor& gamma,
                            int64_t layer, int64_t num_heads, double scale, Tensor& state, Tensor& out) {
  const char* op = "lower_bounded_gla_step";
  HGRN_CHECK(q_hat.dim() == 2 && q_hat.shape() == f_hat.shape() && v.dim() == 2 && v.size(0) == q_hat.size(0),
             op, ": q_hat ", shape_str(q_hat.shape()), ", f_hat ", shape_str(f_hat.shape()), " and v ",
             shape_str(v.shape()), " must be [B, H*K], [B, H*K] and [B, H*V]");
  HGRN_CHECK(q_hat.dtype() == f_hat.dtype() && v.dtype() == f_hat.dtype() && q_hat.device() == f_hat.device() &&
                 v.device() == f_hat.device(),
             op, ": q_hat, f_hat and v must share one dtype and device");
  HGRN_CHECK(q_hat.is_row_strided() && f_hat.is_row_strided() && v.is_row_strided(), op,
             ": q_hat, f_hat and v must be row-strided");
  const int64_t B = q_hat.size(0), H = num_heads;
  HGRN_CHECK(H > 0 && q_hat.size(1) % H == 0 && v.size(1) % H == 0, op, ": ", H, " heads do not divide q_hat ",
             shape_str(q_hat.shape()), " and v ", shape_str(v.shape()));
  const int64_t K = q_hat.size(1) / H, V = v.size(1) / H;
  const Device device = f_hat.device();
  const DType state_dtype = device == Device::CUDA ? DType::F32 : f_hat.dtype();
  HGRN_CHECK(state.shape() == Shape({B, H, K, V}) && state.dtype() == state_dtype && state.device() == device &&
                 state.is_contiguous(),
             op, ": state must be a contiguous ", dtype_name(state_dtype), " ", shape_str(Shape({B, H, K, V})),
             ", got ", dtype_name(state.dtype()), " ", shape_str(state.shape()));
  HGRN_CHECK(out.shape() == Shape({B, H * V}) && out.dtype() == f_hat.dtype() && out.device() == device &&
                 out.is_contiguous(),
             op, ": out must be a contiguous ", dtype_name(f_hat.dtype()), " ", shape_str(Shape({B, H * V})));
  check_lower_bounds_for_step(op, gamma, layer, H * K, device, state_dtype);
  if (B == 0) return;

  if (device == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    HGRN_CHECK(f_hat.dtype() == DType::F32 || f_hat.dtype() == DType::BF16, op,
               ": GPU activations are fp32 or bf16, got ", dtype_name(f_hat.dtype()));
    LowerBoundedGlaStepArgs a;
    a.batch = B;
    a.heads = H;
    a.key_dim = K;
    a.value_dim = V;
    a.act = f_hat.dtype();
    a.q_hat = q_hat.raw_data();
    a.f_hat = f_hat.raw_data();
    a.v = v.raw_data();
    a.q_hat_stride = q_hat.row_stride();
    a.f_hat_stride = f_hat.row_stride();
    a.v_stride = v.row_stride();
    a.gamma_row = gamma.defined() && layer > 0 ? gamma.data<float>() + layer * H * K : nullptr;
    a.scale = static_cast<float>(scale);
    a.state = state.data<float>();
    a.out = out.raw_data();
    cuda_lower_bounded_gla_step(a);
    return;
#else
    throw Error("lower_bounded_gla_step: this hgrn was built without CUDA");
#endif
  }
  // The reference: the ops HGRN2's op-by-op step runs (models/hgrn2/hgrn2.cpp), on copies.
  Tape untaped;
  untaped.set_enabled(false);
  const Hgrn2Gates gates = hgrn2_gates(untaped, one_position(q_hat), one_position(f_hat),
                                       gamma.defined() ? make_var(gamma) : nullptr, layer);
  const GlaOutputs r = gla_recurrence(untaped, gates.q, gates.k, one_position(v), gates.g, make_var(state), H, scale,
                                      RecurrenceMode::Naive);
  state.copy_from(r.final_state->value);
  out.copy_from(r.output->value.reshape({B, H * V}));
}

}  // namespace hgrn
