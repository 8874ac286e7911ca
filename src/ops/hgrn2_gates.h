// hgrn2_gates.h: the HGRN2 gates: the layer-wise lower bound γ (spec section 2), the lower-bounded log forget gate
// g (spec section 1.2 step 3), the input gate k = 1 − exp(g) (step 4), and a layer's q, g and k in one op.
#pragma once
#include <cstdint>
#include <memory>

#include "core/autograd.h"

namespace hgrn {

// Γ [L, D] -> γ [L, D]: P = softmax(Γ) over the layer axis per channel, γ_ℓ = P_1 + … + P_ℓ (= cumsum(P)_ℓ − P_0),
// so γ_0 = 0 and γ is non-decreasing in ℓ with γ_{L−1} = 1 − P_0.
Var lower_bound_transform(Tape& tape, const Var& lower_bounds);

// f̂ [..., F] -> g [..., F], the log forget gate. g = logsigmoid(f̂) when gamma is null or layer == 0 (layer 0's bound
// is exactly 0); otherwise g = log(γ_ℓ + (1 − γ_ℓ)·σ(f̂)) with γ_ℓ = gamma[layer] ([L, F], values in [0, 1]),
// evaluated in log space. Layer 0 never touches gamma's gradient. On the GPU f̂ is fp32 or bf16, gamma is fp32 and g is
// always fp32 (spec 1.3); on the CPU f̂, gamma and g share one dtype (fp32 or fp64).
Var hgrn2_forget_gate(Tape& tape, const Var& f_hat, const Var& gamma, int64_t layer);

// The decoding steps' check of layer `layer` (>= 0) and, where given, of γ [L > layer, width]: contiguous, on
// `device`, in `dtype`. An undefined γ (no lower bounds) passes; `op` names the caller in messages.
void check_lower_bounds_for_step(const char* op, const Tensor& gamma, int64_t layer, int64_t width, Device device,
                                 DType dtype);

// g -> k = 1 − exp(g), evaluated as −expm1(g) so that k keeps its relative precision when g is near 0.
// k has g's dtype, or out_dtype: on the GPU g is fp32 and k is stored in the activation dtype (fp32 or bf16, spec 1.2
// step 4: k is cast to i's dtype), with dg in g's dtype; on the CPU out_dtype must be g's dtype.
Var input_gate_from_forget(Tape& tape, const Var& g);
Var input_gate_from_forget(Tape& tape, const Var& g, DType out_dtype);

// What a layer's gates were made from, on the GPU: gla_recurrence, given it with these q, g and k, runs the gates'
// backward in its own backward (kernels/gla_recurrence.h, GlaGatesEpilogue) where it is the gates' only consumer,
// so that dq, dk and dg are never stored; the gates' backward then finds no gradient left to pass on.
struct Hgrn2GatesOrigin {
  Var q_hat, f_hat, gamma;
  int64_t layer = 0;
  bool bounded = false;  // γ_ℓ enters g (else layer 0, or no lower bounds: g = logsigmoid(f̂))
  Var q, g, k;           // the gates made
};
// A layer's gates in one op (spec 1.2 steps 2–4): q = silu(q̂), g = hgrn2_forget_gate(f̂, γ, layer) and
// k = input_gate_from_forget(g) in f̂'s dtype; q̂ is a tensor like f̂. On the GPU one fused kernel each way (q̂ and f̂
// read once, g not read back, one pass for all three gradients); on the CPU exactly the three ops.
struct Hgrn2Gates {
  Var q, g, k;
  std::shared_ptr<const Hgrn2GatesOrigin> origin;  // set by the GPU path only
};
Hgrn2Gates hgrn2_gates(Tape& tape, const Var& q_hat, const Var& f_hat, const Var& gamma, int64_t layer);

}  // namespace hgrn
